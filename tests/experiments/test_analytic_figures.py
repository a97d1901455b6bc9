"""Tests of jaxdp/experiments/analytic_figures.py (Papernot & Steinke Figs 2-6)."""

import csv
import math
import os
from collections import defaultdict

import dp_accounting as dpa
import pytest

from jaxdp.experiments import analytic_figures as af
from jaxdp import accounting as acc

_SERIES_FAMILIES = ("poisson", "truncated_negative_binomial", "fixed")


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("psfigs")
  assert af.main(["--out", str(path), "--quick"]) == 0
  return path


def _read(out_dir, name):
  with open(os.path.join(out_dir, f"{name}.csv"), newline="", encoding="utf-8") as fh:
    reader = csv.DictReader(fh)
    return tuple(reader.fieldnames), list(reader)


def _by_series(rows):
  out = defaultdict(list)
  for r in rows:
    out[r["series"]].append(r)
  return out


def test_all_files_written_and_non_empty(out_dir):
  for name in af.FIGURES:
    for ext in ("png", "pdf", "csv"):
      path = os.path.join(out_dir, f"{name}.{ext}")
      assert os.path.isfile(path), path
      assert os.path.getsize(path) > 0, path
  assert len(af.FIGURES) == 5


def test_csv_columns(out_dir):
  for name in af.FIGURES:
    columns, rows = _read(out_dir, name)
    assert columns == af.COLUMNS[name]
    assert rows
    assert {r["figure"] for r in rows} == {name}
    # The base used is recorded on every row.
    assert {r["base"] for r in rows} == {af.BASE_NAME}


def test_epsilon_increases_with_expected_k(out_dir):
  _, rows = _read(out_dir, "ps_fig4")
  series = _by_series(rows)
  for fam in _SERIES_FAMILIES:
    assert any(r[0]["distribution"] == fam for r in series.values()), fam
  for label, pts in series.items():
    if pts[0]["distribution"] == "single_run":
      continue
    pts = sorted(pts, key=lambda r: float(r["expected_k"]))
    eps = [float(r["epsilon"]) for r in pts]
    assert all(math.isfinite(e) for e in eps), label
    assert all(b > a for a, b in zip(eps, eps[1:])), (label, eps)


def test_every_repetition_costs_more_than_one_run(out_dir):
  _, rows = _read(out_dir, "ps_fig4")
  single = [float(r["epsilon"]) for r in rows if r["distribution"] == "single_run"]
  assert single == [pytest.approx(2.1422, abs=1e-4)]
  for r in rows:
    if r["distribution"] != "single_run" and float(r["expected_k"]) > 1:
      assert float(r["epsilon"]) > single[0], r["series"]


def test_expected_quantile_in_unit_interval_and_increasing_with_epsilon(out_dir):
  _, rows = _read(out_dir, "ps_fig5")
  for label, pts in _by_series(rows).items():
    pts = sorted(pts, key=lambda r: float(r["epsilon"]))
    q = [float(r["expected_quantile"]) for r in pts]
    assert all(0.0 <= v <= 1.0 for v in q), label
    assert all(b > a for a, b in zip(q, q[1:])), (label, q)


def test_success_probability_increasing_with_epsilon(out_dir):
  _, rows = _read(out_dir, "ps_fig6")
  for label, pts in _by_series(rows).items():
    pts = sorted(pts, key=lambda r: float(r["epsilon"]))
    p = [float(r["success_probability"]) for r in pts]
    assert all(0.0 <= v <= 1.0 for v in p), label
    assert all(b > a for a, b in zip(p, p[1:])), (label, p)
    assert {r["p_success_per_run"] for r in pts} == {"0.01"}


def test_naive_composition_worse_from_ten_runs(out_dir):
  _, rows = _read(out_dir, "ps_fig4")
  naive = {float(r["expected_k"]): float(r["epsilon"]) for r in rows
           if r["distribution"] == "fixed"}
  compared = 0
  for r in rows:
    k = float(r["expected_k"])
    if r["distribution"] in ("poisson", "truncated_negative_binomial") and k >= 10:
      assert naive[k] > float(r["epsilon"]), (r["series"], k)
      compared += 1
  assert compared >= 5 * 3  # five distributions at E[K] = 10, 20, ... (quick grid)


def test_values_match_reference_9_4(out_dir):
  # REFERENCE 9.4 (discrete-grid Thm 2 / Thm 6, delta = 1e-6, E[K] = 10). The
  # figures use Zcdp, whose Cor 4 can only lower the TNB numbers.
  _, rows = _read(out_dir, "ps_fig4")
  labels = ("Poisson", "TNB eta=-0.5", "logarithmic (TNB eta=0)", "TNB eta=0.5",
            "geometric (TNB eta=1)", af.NAIVE_LABEL)
  reference = {10.0: (4.6074, 3.0660, 3.4511, 3.7782, 4.0680, 7.7662),
               100.0: (18.7588, 3.5174, 4.0478, 4.5575, 5.0529, 32.2217)}
  for mean, refs in reference.items():
    got = {r["series"]: float(r["epsilon"]) for r in rows if float(r["expected_k"]) == mean}
    for label, ref in zip(labels, refs):
      assert got[label] <= ref + 1e-4, (label, mean)
      assert got[label] == pytest.approx(ref, abs=5e-3), (label, mean)


def test_dp_accounting_zcdp_base_reproduces_reference_exactly():
  orders = af.EPS_ORDERS
  base = dpa.ZCDpEvent(0.1)

  def eps(dist, method="rdp"):
    return acc.epsilon(acc.RepeatAndSelect(base, dist), 1e-6, method=method, orders=orders)

  assert acc.epsilon(base, 1e-6, method="rdp", orders=orders) == pytest.approx(2.1422, abs=1e-4)
  assert eps(acc.Logarithmic(mean=10)) == pytest.approx(3.4511, abs=1e-4)
  assert eps(acc.TruncatedNegativeBinomial(-0.5, mean=10)) == pytest.approx(3.0660, abs=1e-4)
  assert eps(acc.Fixed(10), "composition") == pytest.approx(7.7662, abs=1e-4)
  assert eps(acc.Poisson(mean=10)) == pytest.approx(4.6074, abs=1e-4)
  assert eps(acc.Poisson(mean=100)) == pytest.approx(18.7588, abs=1e-4)
  assert eps(acc.Logarithmic(mean=100)) == pytest.approx(4.0478, abs=1e-4)


def test_unwritable_out_dir_exits_2(tmp_path, capsys):
  blocker = tmp_path / "a_file"
  blocker.write_text("x")
  assert af.main(["--out", str(blocker / "sub")]) == 2
  assert "cannot write" in capsys.readouterr().err


def test_help_exits_zero(capsys):
  with pytest.raises(SystemExit) as exc:
    af.main(["--help"])
  assert exc.value.code == 0
  assert "--quick" in capsys.readouterr().out
