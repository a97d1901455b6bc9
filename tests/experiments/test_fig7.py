"""Figure 7 pipeline end to end on a tiny configuration, dry run, and bad input."""

import csv
import dataclasses
import json
import os

import numpy as np
import pytest

from jaxdp.experiments import fig7
from jaxdp.sweep.space import config_record
from tests.experiments.tiny_profiles import FIG7_TINY as TINY

def test_outputs_and_csv(fig7_tiny_run):
  for name in ("fig7.png", "fig7.pdf", "fig7.csv", "fig7.json"):
    assert (fig7_tiny_run / name).stat().st_size > 0
  rows = list(csv.DictReader(open(fig7_tiny_run / "fig7.csv")))
  assert tuple(rows[0]) == fig7.CSV_COLUMNS
  curves = {(r["panel"], r["distribution"]) for r in rows}
  assert {d for _, d in curves} == {"Poisson", "TNB eta=-0.5", "TNB eta=0", "TNB eta=0.5", "TNB eta=1",
                                    "naive fixed K"}
  for panel, dist in curves:
    pts = sorted((r for r in rows if r["panel"] == panel and r["distribution"] == dist),
                 key=lambda r: float(r["expected_k"]))
    eps = [float(r["epsilon"]) for r in pts]
    assert np.all(np.diff(eps) > 0), (panel, dist)  # epsilon grows with E[K]
    for r in pts:
      assert 0.0 <= float(r["accuracy_mean"]) <= 1.0
      assert int(r["trials"]) == fig7.N_TRIALS
  best = {(r["distribution"], r["expected_k"]): float(r["epsilon"]) for r in rows if r["panel"] == "best"}
  rdp = {(r["distribution"], r["expected_k"]): float(r["epsilon"]) for r in rows if r["panel"] == "rdp"}
  assert all(best[k] <= rdp[k] + 1e-12 for k in rdp)


def test_manifest_is_complete(fig7_tiny_run):
  m = json.load(open(fig7_tiny_run / "fig7.json"))
  for key in ("profile", "train_config", "seeds", "learning_rates", "packages", "devices", "wall_time_s",
              "single_run_epsilon", "pool_size", "delta", "trials"):
    assert key in m, key
  assert m["pool_size"] == len(TINY.learning_rates) * len(TINY.seeds)
  assert set(m["wall_time_s"]) >= {"load data", "plot"}
  assert m["packages"]["jax"] and m["packages"]["dp-accounting"]
  single = m["single_run_epsilon"]["rdp"]
  rows = list(csv.DictReader(open(fig7_tiny_run / "fig7.csv")))
  # The single-run reference lies left of every tuned point except K = 1 repetition.
  assert all(float(r["epsilon"]) > single - 1e-9 for r in rows if r["panel"] == "rdp")


def test_rerun_resumes_from_the_pool(fig7_tiny_run, capsys):
  code = fig7.main(["--profile", "tiny", "--out", str(fig7_tiny_run), "--pool-dir", str(fig7_tiny_run / "pool")],
                   profiles={"tiny": TINY})
  assert code == 0
  out, err = capsys.readouterr()
  assert "pool: 6 candidates] done" in out
  assert (f"run_sweep: resumed 6 of 6 candidates from {fig7_tiny_run / 'pool'} (stored by an "
          "earlier run); nothing left to train") in err


def test_pool_of_another_configuration_is_refused(fig7_tiny_run, tmp_path, capsys):
  other = dataclasses.replace(TINY, epochs=3)
  code = fig7.main(["--profile", "tiny", "--out", str(tmp_path), "--pool-dir", str(fig7_tiny_run / "pool")],
                   profiles={"tiny": other})
  assert code == 2
  err = capsys.readouterr().err
  assert "different search or sweep (differs in: config, profile, configs" in err
  assert "\n  - profile.epochs: stored 2, now 3\n" in err and len(err) < 800 + len("error: \n")
  assert not os.path.exists(tmp_path / "fig7.png")  # nothing half-written


def test_unwritable_output_and_unknown_profile(tmp_path, capsys):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  assert fig7.main(["--out", str(blocker / "sub")]) == 2
  assert "cannot be created" in capsys.readouterr().err
  with pytest.raises(SystemExit) as exc:
    fig7.main(["--profile", "huge"])
  assert exc.value.code == 2


def test_quick_profile_costs_about_one_paper_run():
  # One run of the paper (q = 256/60000, sigma 1.1, 14,063 steps) costs 2.5967 by RDP at delta 1e-5
  # (README); the quick profile is sized to match it: q = 128/4000, 5 epochs = ceil(5 / q) = 157 steps, sigma 1.1.
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  paper = fig7.base_config(fig7.PROFILES["paper"], 60000)
  quick = fig7.base_config(fig7.PROFILES["quick"], 4000)
  assert paper.num_steps == 14063 and quick.num_steps == 157  # the step rule ceil(epochs / q)
  eps_paper = acc.epsilon(paper.dp_event(), fig7.DELTA, method="rdp")
  eps_quick = acc.epsilon(quick.dp_event(), fig7.DELTA, method="rdp")
  assert eps_paper == pytest.approx(2.5967, abs=2e-3)
  assert eps_quick == pytest.approx(2.5536, abs=2e-3)


@pytest.mark.slow
def test_dry_run_builds_the_paper_profile_and_runs_one_step(capsys, one_download_try):
  # Loads TFDS MNIST when present (else, after one failed download, falls back to mnist_offline).
  assert fig7.main(["--profile", "paper", "--dry-run"]) == 0
  out = capsys.readouterr().out
  assert "papernot_steinke_cnn" in out and "one DP step ran: steps=1" in out
  assert "steps per run: 14063" in out


def test_config_record_is_json_and_describes_the_sweep():
  # Pool fingerprints and manifests hold the task's name, every config field and the
  # hyperparameters as plain JSON; the same profile gives the same record (no object addresses).
  config = fig7.base_config(TINY, 1437)
  record = config_record(config)
  assert json.loads(json.dumps(record)) == record
  assert record["task"] == config.task.name and "classifier" in record["task"]
  assert record["hparams"] == {"activation": "tanh", "learning_rate": 0.1, "model": "logreg"}
  assert record["sampling_prob"] == pytest.approx(64 / 1437) and record["epochs"] == 2
  assert config_record(fig7.base_config(TINY, 1437)) == record
  # One task object per preset: configs of a pipeline share compiled programs.
  assert fig7.base_config(TINY, 1437).task is config.task
