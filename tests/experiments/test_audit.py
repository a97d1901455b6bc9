"""The audit figure pipeline and `jaxdp audit`: lower bound <= exact <= accounted, exit 3 otherwise."""

import csv
import json
import math
import os

import pytest

from jaxdp import cli
from jaxdp.audit import game
from jaxdp.experiments import audit

TINY = audit.Profile(gadget_trials=60, outlier_trials=20, gadget_sigma=0.5, outlier_sigma=1.0)


def test_audit_help_lists_the_options(capsys):
  with pytest.raises(SystemExit) as info:
    cli.main(["audit", "--help"])
  assert info.value.code == 0
  out = capsys.readouterr().out
  assert "--profile" in out and "--out" in out and "lower bound" in out
  assert "20,000" in out and "200,000" in out  # the profiles of experiments/audit.py, described from their data


@pytest.mark.slow
def test_tiny_audit_writes_every_output_and_no_bound_is_violated(tmp_path):
  assert audit.main(["--out", str(tmp_path), "--no-progress"], profiles={"quick": TINY}) == 0
  for ext in ("png", "pdf", "csv", "json"):
    assert os.path.getsize(tmp_path / f"audit.{ext}") > 0
  with open(tmp_path / "audit.csv") as f:
    rows = list(csv.DictReader(f))
  assert [r["scenario"] for r in rows][-2:] == ["gadget, no noise (non-private)",
                                               "outlier lr tuning, K ~ Poisson(4)"]
  assert len(rows) == 6 and all(float(r["lower_bound"]) >= 0 for r in rows)
  non_private = rows[-2]
  assert float(non_private["accounted_best"]) == float("inf") and float(non_private["lower_bound"]) > 1.0
  fixed = [r for r in rows if "fixed" in r["scenario"]][0]
  assert fixed["accounted_profile"] == "nan"  # no privacy-profile theorem for a fixed K
  with open(tmp_path / "audit.json") as f:
    assert json.load(f)["violations"] == []
  # The gadget's exact epsilon sits between the audit and every accounting method.
  for r in rows[:4]:
    lower, lo, hi = float(r["lower_bound"]), float(r["exact_epsilon_lo"]), float(r["exact_epsilon"])
    assert lower <= lo <= hi < hi + 1e-3
    for m in ("rdp", "best") + (() if "fixed" in r["scenario"] else ("profile",)):
      assert hi <= float(r[f"accounted_{m}"]), (r["scenario"], m)
  assert float(non_private["exact_epsilon"]) == math.inf
  assert rows[-1]["exact_epsilon"] == "nan"  # the realistic search has no exact value


@pytest.mark.slow
def test_an_under_accounted_search_is_caught(tmp_path, monkeypatch, capsys):
  # An accounting bug: every method reports a third of its epsilon. The gadget's exact epsilon
  # is then above the accounted one, which no audit trial count can excuse: exit 3.
  real = game._accounted  # pylint: disable=protected-access
  monkeypatch.setattr(game, "_accounted", lambda *a, **k: {m: e / 3 for m, e in real(*a, **k).items()})
  assert audit.main(["--out", str(tmp_path), "--no-progress"], profiles={"quick": TINY}) == 3
  err = capsys.readouterr().err
  assert "AUDIT VIOLATION" in err and "gadget, K ~ Poisson(4): exact" in err and "> accounted best" in err
  with open(tmp_path / "audit.json") as f:
    broken = json.load(f)["violations"]
  assert {v["scenario"] for v in broken} >= {"gadget, K ~ Poisson(4)", "gadget, K ~ fixed(4)"}


def _row(lower, lo, hi, **accounted):
  return dict(scenario="s", lower_bound=lower, exact_epsilon_lo=lo, exact_epsilon=hi,
              **{f"accounted_{m}": accounted.get(m, math.nan) for m in audit.METHODS})


@pytest.mark.parametrize("row,broken", [
    (_row(4.0, 10.0, 10.001, rdp=14.0, best=12.0), []),
    (_row(10.0005, 10.0, 10.001, best=12.0), []),  # inside the exact bracket: not certain, not counted
    (_row(10.01, 10.0, 10.001, best=12.0), ["lower bound 10.01 > exact 10"]),
    (_row(4.0, 10.0, 10.001, rdp=9.0, best=12.0), ["exact 10 > accounted rdp 9"]),
    (_row(4.0, math.nan, math.nan, best=3.0), ["lower bound 4 > accounted best 3"]),
    (_row(7.0, math.inf, math.inf, best=math.inf), []),  # the non-private search
], ids=["ok", "within-bracket", "lower-above-exact", "exact-above-accounted", "lower-above-accounted",
        "non-private"])
def test_violations_are_the_certain_breaks_of_the_order(row, broken):
  assert [why for _, why in audit.violations([row])] == broken


def test_unwritable_out_is_a_usage_error(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  assert audit.main(["--out", str(blocker / "sub")]) == 2
