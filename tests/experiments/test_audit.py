"""The audit figure pipeline and `jaxdp audit`."""

import csv
import json
import os

import pytest

from jaxdp import cli
from jaxdp.experiments import audit


def test_audit_help_lists_the_options(capsys):
  with pytest.raises(SystemExit) as info:
    cli.main(["audit", "--help"])
  assert info.value.code == 0
  out = capsys.readouterr().out
  assert "--profile" in out and "--out" in out and "lower bound" in out


@pytest.mark.slow
def test_tiny_audit_writes_every_output_and_no_bound_is_violated(tmp_path, monkeypatch):
  monkeypatch.setitem(audit.PROFILES, "quick", audit.Profile(gadget_trials=60, outlier_trials=20,
                                                             gadget_sigma=0.5, outlier_sigma=1.0))
  assert audit.main(["--out", str(tmp_path), "--no-progress"]) == 0
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


def test_unwritable_out_is_a_usage_error(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  assert audit.main(["--out", str(blocker / "sub")]) == 2
