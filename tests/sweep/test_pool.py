"""Durable pool: resume, refuse mixing, corrupted tail, survive SIGKILL."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from jaxdp.sweep import PoolMismatchError, ResultPool, SearchSpace, grid_candidates, run_sweep

FP = {"sweep": "test", "version": 1}


def test_append_and_reload(tmp_path):
  pool = ResultPool(tmp_path, FP)
  pool.append([{"id": "a", "score": 0.5}, {"id": "b", "score": float("nan")}])
  again = ResultPool(tmp_path, FP)
  assert again.done_ids() == {"a", "b"}
  assert again.records[0]["score"] == 0.5 and again.records[1]["score"] != again.records[1]["score"]


def test_refuses_a_directory_of_another_sweep(tmp_path):
  ResultPool(tmp_path, FP)
  with pytest.raises(PoolMismatchError, match="differs in: version"):
    ResultPool(tmp_path, {"sweep": "test", "version": 2})


def test_corrupted_last_line_is_dropped_with_a_warning(tmp_path):
  pool = ResultPool(tmp_path, FP)
  pool.append([{"id": "a", "score": 1.0}])
  with open(tmp_path / "results.jsonl", "a") as f:
    f.write('{"id": "b", "sco')  # a write cut by a crash
  with pytest.warns(UserWarning, match="corrupted line"):
    again = ResultPool(tmp_path, FP)
  assert again.done_ids() == {"a"}
  again.append([{"id": "b", "score": 2.0}])
  assert [json.loads(l)["id"] for l in open(tmp_path / "results.jsonl")] == ["a", "b"]


def test_unwritable_run_dir(tmp_path):
  target = tmp_path / "file"
  target.write_text("not a directory")
  with pytest.raises(ValueError, match="cannot be created"):
    ResultPool(target / "sub", FP)


def test_run_sweep_resumes_and_skips_finished(tmp_path, digits, base_config, two_devices):
  space = SearchSpace(base_config, {"learning_rate": [0.5, 2.0]})
  cands = grid_candidates(space, seeds=[0, 1])
  calls = []

  def counting_trainer(todo, data, **kw):
    calls.append(len(todo))
    from jaxdp.sweep import engine  # pylint: disable=g-import-not-at-top
    return engine.train_candidates(todo, data, **kw)

  run_sweep(cands[:3], digits, tmp_path, FP, progress=False, trainer=counting_trainer, devices=two_devices)
  pool = run_sweep(cands, digits, tmp_path, FP, progress=False, trainer=counting_trainer, devices=two_devices)
  assert calls == [3, 1]
  assert pool.done_ids() == {c.id for c in cands}
  rec = pool.records[0]
  for field in ("point", "seed", "score", "test_accuracy", "steps", "epsilon", "delta", "wall_time_s", "dp_event"):
    assert field in rec
  assert "PoissonSampledDpEvent" in rec["dp_event"]


_SCRIPT = textwrap.dedent("""
    import sys
    from jaxdp.data import load_dataset
    from jaxdp.sweep import SearchSpace, grid_candidates, run_sweep
    from jaxdp.train import TrainConfig
    base = TrainConfig(l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=0.05, steps=400,
                       learning_rate=1.0, model="mlp")
    cands = grid_candidates(SearchSpace(base, {"learning_rate": [0.1, 0.2, 0.4, 0.8, 1.6, 3.2]}), seeds=[0])
    run_sweep(cands, load_dataset("digits"), sys.argv[1], {"kill": 1}, progress=False,
              max_candidates_per_device=1)
""")


def test_sigkill_loses_at_most_the_chunk_in_flight(tmp_path):
  script = tmp_path / "sweep.py"
  script.write_text(_SCRIPT)
  run_dir = tmp_path / "run"
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
  proc = subprocess.Popen([sys.executable, str(script), str(run_dir)], env=env)
  results = run_dir / "results.jsonl"
  deadline = time.time() + 240
  while time.time() < deadline and (not results.exists() or results.read_text().count("\n") < 2):
    time.sleep(0.2)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL
  kept = [json.loads(l)["id"] for l in results.read_text().splitlines()]
  assert 2 <= len(kept) < 6, "the kill should land mid-sweep"
  done = subprocess.run([sys.executable, str(script), str(run_dir)], env=env, timeout=600)
  assert done.returncode == 0
  ids = [json.loads(l)["id"] for l in results.read_text().splitlines()]
  assert len(ids) == len(set(ids)) == 6
  assert ids[:len(kept)] == kept  # finished candidates were kept, not retrained
