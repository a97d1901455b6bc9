"""`acc.cross_check` and `jaxdp account --cross-check` (issue 45, item 4): every method's epsilon
beside dp_accounting's own RDP and PLD, each at or above the exact epsilon of small events."""

import json
import math
import os
import re

import dp_accounting as dpa
import pytest
from scipy import optimize, stats

from jaxdp import accounting as acc
from jaxdp import cli
from jaxdp.accounting import cross_checking as cc
from tests.accounting import exact_selection as ex

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ALL_ROWS = acc.METHODS + (cc.DPA_RDP, cc.DPA_PLD)


def _exact_selection_delta(pair, dist, eps):
  """The exact hockey-stick divergence of best-of-K on a small base (`exact_selection`)."""
  q0, q1 = pair
  return max(ex.hockey_stick(ex.best_of_k(a, dist), ex.best_of_k(b, dist), eps)
             for a, b in ex.pairs_both_ways(q0, q1))


def _gaussian_delta(sigma, eps):
  """Balle-Wang's exact profile of the Gaussian mechanism (sensitivity 1)."""
  return (stats.norm.cdf(0.5 / sigma - eps * sigma)
          - math.exp(eps) * stats.norm.cdf(-0.5 / sigma - eps * sigma))


SELECTIONS = [
    # Base, its exact pair of output laws, K: dp_accounting's RDP applies (Gaussian, Poisson).
    ("gauss2-poisson3", dpa.GaussianDpEvent(2.0),
     ex.gaussian_bins(2.0, n_bins=6000, width=10.0), acc.Poisson(mean=3)),
    # A pure-DP base: Liu-Talwar applies, dp_accounting has no such event.
    ("rr0.8-geom3", acc.PureDp(0.8), ex.randomized_response(0.8), acc.Geometric(mean=3)),
    # Bounded K: jaxdp's PLD mixture applies, dp_accounting's RepeatAndSelect cannot express it.
    ("rr0.8-bin5", acc.PureDp(0.8), ex.randomized_response(0.8), acc.Binomial(5, 0.6)),
]


@pytest.mark.parametrize("name,base,pair,dist", SELECTIONS, ids=[s[0] for s in SELECTIONS])
def test_every_row_is_at_or_above_the_exact_epsilon_of_a_selection(name, base, pair, dist):
  delta = 1e-3  # the binned Gaussian's divergence is a lower bound, accurate at this delta
  check = acc.cross_check(acc.RepeatAndSelect(base, dist), delta)
  assert tuple(r.method for r in check.rows) == ALL_ROWS
  applied = [r for r in check.rows if r.applies]
  assert len(applied) >= 3, name
  for row in applied:
    # The exact divergence at the reported epsilon is within delta: the epsilon is an upper bound.
    assert _exact_selection_delta(pair, dist, row.epsilon) <= delta * (1 + 1e-6) + 1e-12, row
  for row in check.rows:
    if not row.applies:
      assert row.bound.startswith("does not apply: ") and len(row.bound) > 30, row


def test_every_row_is_at_or_above_the_exact_gaussian_epsilon():
  sigma, delta = 2.0, 1e-5
  check = acc.cross_check(dpa.GaussianDpEvent(sigma), delta)
  # dp_accounting's accountants both accept a plain Gaussian.
  assert {r.method for r in check.rows if r.applies} >= {"rdp", "profile", "pld", cc.DPA_RDP, cc.DPA_PLD}
  for row in check.rows:
    if row.applies:
      assert _gaussian_delta(sigma, row.epsilon) <= delta * (1 + 1e-9), row
  exact = optimize.brentq(lambda e: _gaussian_delta(sigma, e) - delta, 0.0, 10.0, xtol=1e-12)
  pld = next(r for r in check.rows if r.method == cc.DPA_PLD)
  assert exact - 1e-9 <= pld.epsilon <= exact + 0.01  # PLD's pessimistic discretisation is tight


def test_rows_are_what_the_api_returns_and_dp_accountings_rdp_matches_jaxdps():
  event = acc.RepeatAndSelect(dpa.GaussianDpEvent(4.0), acc.Geometric(mean=10))
  check = acc.cross_check(event, 1e-5)
  eps = {r.method: r.epsilon for r in check.rows}
  for method in acc.METHODS:
    if eps[method] is not None:
      assert eps[method] == acc.epsilon(event, 1e-5, method)
  # REFERENCE.md 9.1 (PS Thm 2, dp_accounting 0.6.0) and 9.5 (KRW Thm 5.2).
  assert eps["rdp"] == pytest.approx(2.1537, abs=1e-4) and eps[cc.DPA_RDP] == pytest.approx(eps["rdp"], rel=1e-9)
  assert eps["profile"] == pytest.approx(1.8620, abs=1e-3)
  assert check.best_method == "profile" and eps["profile"] == acc.epsilon(event, 1e-5)
  assert acc.cross_check(event, 1e-5, allow_refined=True).best_method == "profile-refined"
  row = next(r for r in check.rows if r.method == cc.DPA_PLD)
  assert row.bound == ("does not apply: dp_accounting's PLDAccountant does not support "
                       "RepeatAndSelectDpEvent (a random number of runs)")
  assert "PS Thm 2" in next(r for r in check.rows if r.method == "rdp").bound


def test_an_event_no_method_accepts_is_reported_not_raised():
  check = acc.cross_check(acc.RepeatAndSelect(acc.ApproxDp(0.5, 1e-3), acc.Fixed(2)), 1e-6)
  assert all(r.method in ALL_ROWS for r in check.rows)
  refused = [r for r in check.rows if not r.applies]
  assert refused and all("does not apply: " in r.bound for r in refused)
  with pytest.raises(ValueError, match="delta must be in"):
    acc.cross_check(dpa.GaussianDpEvent(1.0), 0.0)


def test_the_tests_named_as_checks_exist_and_compare_with_exact_computations():
  for method in ALL_ROWS:
    named = re.findall(r"tests/[\w/]+\.py", cc.CHECKED_BY[method])
    assert named, method
    for path in named:
      assert os.path.isfile(os.path.join(ROOT, path)), path
  # The file every jaxdp method names runs every method against exact best-of-K laws.
  soundness = open(os.path.join(ROOT, "tests/accounting/test_soundness_profiles.py")).read()
  assert "exact_selection" in soundness and "for method in acc.METHODS" in soundness


def test_cli_cross_check_prints_the_table_with_a_legend(capsys):
  argv = ["account", "--base", "gaussian:sigma=4", "--repeat", "geometric:mean=10", "--cross-check"]
  assert cli.main(argv) == 0
  out = capsys.readouterr().out
  lines = out.splitlines()
  assert any(l.split() == ["method", "epsilon", "bound", "(theorem)"] for l in lines)
  assert "held to exact computations by:" in out
  assert sum(l.startswith("legend: ") for l in lines) == 1
  for method in ALL_ROWS:
    assert any(l.startswith(method + " ") for l in lines), method
  assert any(l.startswith("dp_accounting pld") and " n/a " in l and "does not apply" in l for l in lines)
  assert cli.main(argv + ["--json"]) == 0
  out = json.loads(capsys.readouterr().out)
  assert [r["method"] for r in out["rows"]] == list(ALL_ROWS) and out["best_method"] == "profile"
  assert out["base"] == "gaussian:sigma=4" and out["delta"] == 1e-5


def test_cli_cross_check_reports_a_refused_event_and_refuses_conflicting_flags(capsys):
  assert cli.main(["account", "--base", "pure:eps=0.5", "--repeat", "binomial:n=5,p=0.5",
                   "--cross-check", "--delta", "1e-6"]) == 0
  out = capsys.readouterr().out
  assert "dp_accounting rdp" in out and "cannot express K ~ Binomial" in out
  for extra in (["--method", "rdp"], ["--epsilon", "1.0"], ["--plan", "3"]):
    assert cli.main(["account", "--base", "pure:eps=0.5", "--cross-check"] + extra) == 2
    assert "--cross-check" in capsys.readouterr().err


def test_the_guide_quotes_what_its_command_prints(capsys):
  """docs/guides/cross_check.md: the table it quotes is the output of the command it names."""
  page = open(os.path.join(ROOT, "docs", "guides", "cross_check.md"), encoding="utf-8").read()
  assert len(re.findall(r"^# ", page, flags=re.M)) == 1  # one top-level title
  command = re.search(r"^jaxdp account (.*--cross-check)$", page, flags=re.M).group(1)
  quoted = re.search(r"^(Cross-check of: .*?)\n```", page, flags=re.M | re.S).group(1).splitlines()
  assert cli.main(["account"] + command.split()) == 0
  printed = capsys.readouterr().out.splitlines()
  assert quoted[:4] == printed[:4]  # the event, delta and the header
  number = re.compile(r"^(\S+(?: \S+)?(?: \*)?)\s+([0-9.]+|n/a)\s")
  rows = [number.match(l).groups() for l in quoted[4:]]
  assert [name.rstrip(" *") for name, _ in rows] == list(ALL_ROWS)
  for (name, value), line in zip(rows, printed[4:]):
    got = number.match(line).groups()
    assert got[0] == name and (value == got[1] == "n/a" or float(value) == pytest.approx(float(got[1]), abs=2e-4))
  # The prose quotes them too.
  for value in ("3.6199", "3.1211", "2.5957", "18.7635"):
    assert value in quoted[4] + quoted[5] + quoted[6] + quoted[7] and page.count(value) >= 2
  # The dp_accounting-alone snippet prints the number the page gives for it.
  snippet = re.search(r"```python\n(.*?)```", page, flags=re.S).group(1)
  exec(compile(snippet, "cross_check.md", "exec"), {})  # pylint: disable=exec-used
  assert capsys.readouterr().out.strip() == "3.6199"
