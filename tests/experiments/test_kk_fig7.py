"""Koskela-Kulkarni Figure 7 end to end on tiny settings, dry run, bad input."""

import csv
import json
import os

import pytest

from jaxdp.experiments import kk_fig7
from tests.experiments.tiny_profiles import KK_FIG7_TINY as TINY


@pytest.mark.slow  # the whole tiny KK figure-7 pipeline (its fixture): about 26 s
def test_fig7_outputs_and_csv(kk_fig7_tiny_run):
  num_train = json.load(open(kk_fig7_tiny_run / "kk_fig7.json"))["num_train"]
  for name in ("kk_fig7.png", "kk_fig7.pdf", "kk_fig7.csv", "kk_fig7.json"):
    assert (kk_fig7_tiny_run / name).stat().st_size > 0
  assert not [n for n in os.listdir(kk_fig7_tiny_run) if n.startswith(".staging")]
  rows = list(csv.DictReader(open(kk_fig7_tiny_run / "kk_fig7.csv")))
  assert tuple(rows[0]) == kk_fig7.CSV_COLUMNS
  assert {(r["method"], float(r["target_epsilon"])) for r in rows} == {
      (m, t) for m in kk_fig7.METHODS for t in TINY.target_epsilons}
  for method in kk_fig7.METHODS:
    pts = sorted((r for r in rows if r["method"] == method), key=lambda r: float(r["target_epsilon"]))
    eps = [float(r["epsilon"]) for r in pts]
    sig = [float(r["sigma_mean"]) for r in pts]
    assert eps[0] < eps[1] and sig[0] > sig[1]  # a looser target: less noise, larger epsilon
    for r in pts:
      assert 0.0 <= float(r["accuracy_mean"]) <= 1.0 and int(r["repetitions"]) == TINY.repetitions
      assert float(r["sampling_prob_mean"]) == pytest.approx(64 / num_train)
  by = {(r["method"], float(r["target_epsilon"])): r for r in rows}
  for t in TINY.target_epsilons:
    base = by[("baseline", t)]
    assert float(base["relative_training_time"]) == 1.0
    # Variant 1 at small q is cheaper in privacy than tuning on all data (mu = 3, q = 0.2); variant 2
    # pays for the final run in full, so with so few candidates it need not be.
    assert float(by[("variant 1", t)]["epsilon"]) < float(base["epsilon"])
    for v in ("variant 1", "variant 2"):
      # SGD extrapolation: the final learning rate is the tuned one times n/m > 1.
      assert float(by[(v, t)]["final_learning_rate_mean"]) > float(by[(v, t)]["learning_rate_mean"])


@pytest.mark.slow  # the whole tiny KK figure-7 pipeline (its fixture): about 26 s
def test_fig7_manifest_is_complete(kk_fig7_tiny_run):
  m = json.load(open(kk_fig7_tiny_run / "kk_fig7.json"))
  for key in ("profile", "hyperparameter_grid", "calibrated_sigma", "seeds", "packages", "devices",
              "wall_time_s", "runs", "compute_ratio_baseline_over", "delta", "num_train"):
    assert key in m, key
  assert m["profile"]["name"] == "tiny" and m["hyperparameter_grid"]["sampling_probs"] == [64 / m["num_train"]]
  assert len(m["runs"]) == len(kk_fig7.METHODS) * len(TINY.target_epsilons) * TINY.repetitions
  assert set(m["wall_time_s"]) >= {"load data", "plot"}
  assert m["packages"]["jax"] and m["packages"]["dp-accounting"] and m["devices"]
  assert set(m["calibrated_sigma"]) == {str(t) for t in TINY.target_epsilons}
  base_cost = {r["baseline_gradient_evaluations"] for r in m["runs"]}
  assert len(base_cost) == 1  # E[K] x steps x gamma x N: one grid point, the same for every run
  (base_cost,) = base_cost
  for v in ("variant 1", "variant 2"):
    spent = [r["gradient_evaluations"] for r in m["runs"] if r["method"] == v]
    assert m["compute_ratio_baseline_over"][v] == pytest.approx(base_cost / (sum(spent) / len(spent)))


def test_fig7_dry_run_tiny(capsys):
  assert kk_fig7.main(["--profile", "tiny", "--dry-run"], profiles={"tiny": TINY}) == 0
  out = capsys.readouterr().out
  assert "'logreg'" in out and "one DP step ran: steps=1" in out
  assert "steps per run: 1875" in out  # 2 epochs at B = 64 of the 60,000 a dry run assumes


@pytest.mark.slow
def test_fig7_dry_run_paper(capsys, one_download_try):
  # Loads TFDS MNIST when present (else falls back to mnist_offline).
  assert kk_fig7.main(["--profile", "paper", "--dry-run"]) == 0
  out = capsys.readouterr().out
  assert "'opacus_cnn'" in out and "one DP step ran: steps=1" in out
  assert "steps per run: 4688" in out  # 10 epochs at B = 128 of 60,000


def test_fig7_bad_out_and_profile(tmp_path, capsys):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  assert kk_fig7.main(["--out", str(blocker / "sub")], profiles={"tiny": TINY, "quick": TINY}) == 2
  assert "cannot be created" in capsys.readouterr().err
  assert not os.path.exists(blocker / "sub")
  with pytest.raises(SystemExit) as exc:
    kk_fig7.main(["--profile", "huge"])
  assert exc.value.code == 2
