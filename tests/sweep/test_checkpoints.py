"""Checkpoints inside candidates: a candidate killed mid-way resumes, and releases the uninterrupted run.

The resumed run must be the same mechanism as the uninterrupted one: the same
Poisson samples and noise from the step it resumes at, hence (the same
compiled step on the same machine) the same parameters bit for bit, so every
comparison within one process below is exact. The kill tests run the search
in subprocesses of this machine (`checkpoint_driver.py`), with this process's
two host devices (the environment is inherited): the same programs on the
same machine, so their releases are compared exactly too, by sha256.
"""

import dataclasses
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings

import jax
import numpy as np
import optax
import pytest

from jaxdp import accounting as acc
from jaxdp.data import Dataset
from jaxdp.sweep import SearchMismatchError, SearchSpace, TaskPlan, checkpoints, engine
from jaxdp.sweep.space import config_record
from jaxdp.train import ExecutionConfig
from jaxdp.tuning import LocalTrainer, random_search, RunConfig, subsampled_search, SubsetTuning
from jaxdp.tuning.draws import draw_search

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DRIVER = os.path.join(HERE, "checkpoint_driver.py")
GRID = {"learning_rate": [0.3, 3.0]}
REPS = acc.Poisson(mean=3)
STEPS, EVERY = 60, 15


class Crash(RuntimeError):
  """The process died (simulated) right after a checkpoint was complete."""


@pytest.fixture
def crash_after_saves(monkeypatch):
  """`crash_after_saves(n)`: the n-th checkpoint save (counted from now) completes, then Crash."""
  save = checkpoints.Checkpoints.save
  state = {"left": None}

  def crashing(self, candidate_id, identity, step, tree):
    save(self, candidate_id, identity, step, tree)
    if state["left"] is not None:
      state["left"] -= 1
      if state["left"] == 0:
        state["left"] = None
        self.wait()
        raise Crash(f"killed after the checkpoint of {candidate_id} at step {step}")

  monkeypatch.setattr(checkpoints.Checkpoints, "save", crashing)
  return lambda n: state.update(left=n)


def long_config(base_config, every=EVERY, **execution):
  return dataclasses.replace(base_config, steps=STEPS,
                             execution=ExecutionConfig(checkpoint_every=every, **execution))


def search(config, digits, devices, run_dir=None, trainer=None, initial_params=None, **options):
  """random_search over GRID with key 1, on `devices` (LocalTrainer `options`), or `trainer`."""
  trainer = trainer or LocalTrainer(devices=devices, **options)
  return random_search(config, GRID, digits, distribution=REPS, key=jax.random.key(1),
                       initial_params=initial_params,
                       run_config=RunConfig(run_dir=run_dir, trainer=trainer))


def assert_same_release(a, b):
  assert a.hyperparameters == b.hyperparameters and a.unreleased.num_candidates == b.unreleased.num_candidates
  assert a.score == b.score and a.epsilon == b.epsilon and a.event == b.event
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def held_steps(run_dir) -> dict:
  """Candidate id -> the steps of its complete checkpoints on disk."""
  out = {}
  for path in glob.glob(os.path.join(run_dir, checkpoints.DIRNAME, "*", "*")):
    if os.path.basename(path).isdigit():
      out.setdefault(os.path.basename(os.path.dirname(path)), []).append(int(os.path.basename(path)))
  return {cid: sorted(steps) for cid, steps in out.items()}


@pytest.fixture(scope="module")
def uninterrupted(base_config, digits, two_devices):
  """The release without run_dir (no checkpoints at all)."""
  return search(long_config(base_config), digits, two_devices)


def test_checkpoint_every_is_checked_and_is_not_part_of_the_mechanism(base_config):
  for bad in (-1, 1.5, "10", True):
    with pytest.raises(ValueError, match="checkpoint_every"):
      ExecutionConfig(checkpoint_every=bad)
  assert ExecutionConfig(checkpoint_every=3.0).checkpoint_every == 3
  # A resume may change the cadence: the run directory's record of a configuration omits it.
  assert (config_record(long_config(base_config, every=5))
          == config_record(long_config(base_config, every=None)))


@pytest.mark.parametrize("every, total, stops", [
    (15, 60, [15, 30, 45, 60]), (25, 60, [25, 50, 60]), (0, 60, [60]), (100, 60, [60])])
def test_a_fixed_cadence_stops_at_multiples_of_checkpoint_every(every, total, stops):
  cadence, at, got = engine._Cadence(every), 0, []  # pylint: disable=protected-access
  while at < total:
    at = cadence.next_stop(at, total)
    got.append(at)
  assert got == stops
  assert engine._Cadence(15).next_stop(37, 60) == 45  # pylint: disable=protected-access


def test_the_automatic_cadence_probes_then_sizes_segments_by_wall_time():
  cadence = engine._Cadence(None)  # pylint: disable=protected-access
  assert cadence.probing and cadence.next_stop(0, 10**6) == checkpoints.PROBE_STEPS
  cadence.seconds_per_step = 0.5
  stop = cadence.next_stop(8, 10**6)
  assert stop - 8 == int(checkpoints.AUTO_SECONDS / 0.5) and not cadence.probing
  assert cadence.next_stop(8, 100) == 100


def test_a_run_killed_after_checkpoints_resumes_mid_candidate_to_the_same_release(
    uninterrupted, base_config, digits, two_devices, tmp_path, crash_after_saves):
  run_dir = str(tmp_path / "run")
  config = long_config(base_config)
  crash_after_saves(5)  # the first chunk (2 candidates) has saved at 15, 30, and one at 45
  with pytest.raises(Crash):
    search(config, digits, two_devices, run_dir=run_dir)
  held = held_steps(run_dir)
  assert sorted(max(s) for s in held.values()) == [30, 45], held
  assert not os.path.exists(os.path.join(run_dir, "results.jsonl"))  # killed mid-candidate
  resumed = search(config, digits, two_devices, run_dir=run_dir)
  assert_same_release(resumed, uninterrupted)
  assert resumed.unreleased.resumed == 0  # nothing was stored: every candidate trained (on) now
  assert resumed.unreleased.resumed_steps == {cid: max(s) for cid, s in held.items()}
  # Finished candidates keep no checkpoint: an unreleased state is as secret as the data.
  assert held_steps(run_dir) == {}
  records = [json.loads(line) for line in open(os.path.join(run_dir, "results.jsonl"))]
  assert {r["id"]: r["resumed_step"] for r in records if r["resumed_step"]} == resumed.unreleased.resumed_steps


def test_a_partly_frozen_model_resumes_with_its_public_start(base_config, digits, two_devices,
                                                             tmp_path, crash_after_saves):
  # Only the bias trains; the kernel is a public start. A checkpoint holds no frozen leaf: a
  # resume must take it from the start again, never from the empty state it restores into.
  task = dataclasses.replace(base_config.task, trainable=lambda path: path.endswith("bias"),
                             name="bias-only")
  config = dataclasses.replace(long_config(base_config), task=task)
  shapes = TaskPlan.build(SearchSpace(config, GRID), digits).runs[0].params
  rng = np.random.default_rng(0)
  start = jax.tree.map(lambda s: (0.1 * rng.normal(size=s.shape)).astype(s.dtype), shapes)
  # Every candidate's score compared (the warning says they are not covered: a test's business).
  kw = dict(initial_params=start)
  reference = search(config, digits, two_devices, **kw)
  run_dir = str(tmp_path / "run")
  crash_after_saves(3)
  with pytest.raises(Crash):
    search(config, digits, two_devices, run_dir=run_dir, **kw)
  resumed = search(config, digits, two_devices, run_dir=run_dir, **kw)
  assert resumed.unreleased.resumed_steps
  assert_same_release(resumed, reference)
  assert resumed.unreleased.all_scores == reference.unreleased.all_scores
  np.testing.assert_array_equal(resumed.params["params"]["Dense_0"]["kernel"],
                                start["params"]["Dense_0"]["kernel"])


@pytest.mark.slow  # suite budget: the one-kill test above runs by default
def test_two_kills_then_a_changed_cadence_still_release_the_uninterrupted_run(
    uninterrupted, base_config, digits, two_devices, tmp_path, crash_after_saves, capsys):
  run_dir = str(tmp_path / "run")
  crash_after_saves(7)  # the first chunk saves 6 times (15, 30, 45) and is stored; dies in the second
  with pytest.raises(Crash):
    search(long_config(base_config), digits, two_devices, run_dir=run_dir)
  crash_after_saves(3)
  with pytest.raises(Crash):
    search(long_config(base_config), digits, two_devices, run_dir=run_dir)
  second = held_steps(run_dir)
  assert second and all(max(s) > 0 for s in second.values())
  # A cadence of 10 now (checkpoints at 15 and 45 read back all the same).
  resumed = search(long_config(base_config, every=10), digits, two_devices, run_dir=run_dir,
                   progress=True)
  assert_same_release(resumed, uninterrupted)
  assert resumed.unreleased.resumed_steps == {cid: max(s) for cid, s in second.items()}
  # One fixed line: not which candidates continued, nor how many, nor whether any did (issue 42;
  # whether a checkpoint was held depends on K).
  err = capsys.readouterr().err
  assert "this search ran here before: what it stored was read back" in err
  assert not any(cid in err for cid in second)


@pytest.mark.slow  # two more compiled layouts: about 10 s
@pytest.mark.parametrize("execution", [dict(data_parallel=2), dict()], ids=["data-parallel", "vmapped"])
def test_vmapped_and_data_parallel_candidates_resume_to_their_uninterrupted_bits(
    execution, base_config, digits, two_devices, tmp_path, crash_after_saves):
  config = long_config(base_config, **execution)
  per_device = None if execution else 2  # vmapped: two candidates per device
  kw = dict(max_candidates_per_device=per_device)
  reference = search(config, digits, two_devices, **kw)
  run_dir = str(tmp_path / "run")
  crash_after_saves(3)
  with pytest.raises(Crash):
    search(config, digits, two_devices, run_dir=run_dir, **kw)
  held = held_steps(run_dir)
  assert held and not os.path.exists(os.path.join(run_dir, "results.jsonl"))
  resumed = search(config, digits, two_devices, run_dir=run_dir, **kw)
  assert_same_release(resumed, reference)
  assert resumed.unreleased.resumed_steps == {cid: max(s) for cid, s in held.items()}


@pytest.mark.slow  # a subset's programs compiled: about 8 s
def test_a_subsampled_search_resumes_its_candidates_mid_way(base_config, digits, two_devices, tmp_path,
                                                           crash_after_saves):
  kwargs = dict(subset=SubsetTuning(0.5, 1), distribution=acc.Poisson(mean=2), key=jax.random.key(3),
                run_config=RunConfig(trainer=LocalTrainer(devices=two_devices)))
  config = long_config(base_config)
  whole = subsampled_search(config, GRID, digits, **kwargs)
  run_dir = str(tmp_path / "run")
  kwargs["run_config"] = RunConfig(run_dir=run_dir, trainer=LocalTrainer(devices=two_devices))
  crash_after_saves(3)
  with pytest.raises(Crash):
    subsampled_search(config, GRID, digits, **kwargs)
  held = {cid: max(s) for cid, s in held_steps(run_dir).items()}
  assert held
  resumed = subsampled_search(config, GRID, digits, **kwargs)
  assert resumed.unreleased.resumed_steps == held
  assert resumed.tuned_hyperparameters == whole.tuned_hyperparameters
  assert resumed.score == whole.score and resumed.epsilon == whole.epsilon
  for x, y in zip(jax.tree.leaves(whole.params), jax.tree.leaves(resumed.params), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _damage_newest(run_dir, how: str) -> tuple:
  """Damages the newest checkpoint of one candidate; (its id, the step left before it)."""
  held = held_steps(run_dir)
  cid = next(c for c, s in sorted(held.items()) if len(s) == 2)
  newest = os.path.join(run_dir, checkpoints.DIRNAME, cid, str(max(held[cid])))
  files = sorted(f for f in glob.glob(os.path.join(newest, "state", "**", "*"), recursive=True)
                 if os.path.isfile(f) and os.path.getsize(f) > 64)
  target = max(files, key=os.path.getsize)  # the arrays' data
  data = bytearray(open(target, "rb").read())
  if how == "truncated":
    data = data[:len(data) // 2]
  elif how == "flipped":
    data[len(data) // 2] ^= 0x10
  elif how == "metadata":
    meta = os.path.join(newest, "meta", "metadata")
    text = json.loads(open(meta).read())
    text["step"] += 1
    open(meta, "w").write(json.dumps(text))
  if how != "metadata":
    open(target, "wb").write(bytes(data))
  return cid, min(held[cid])


@pytest.mark.parametrize("how", ["truncated", "flipped", "metadata"])
@pytest.mark.slow  # suite budget
def test_a_damaged_checkpoint_is_quarantined_and_the_previous_one_resumes(
    how, uninterrupted, base_config, digits, two_devices, tmp_path, crash_after_saves):
  run_dir = str(tmp_path / "run")
  config = long_config(base_config)
  crash_after_saves(6)  # the first chunk: both candidates at 15, 30 and 45
  with pytest.raises(Crash):
    search(config, digits, two_devices, run_dir=run_dir)
  cid, previous = _damage_newest(run_dir, how)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    resumed = search(config, digits, two_devices, run_dir=run_dir)
  assert_same_release(resumed, uninterrupted)
  assert resumed.unreleased.resumed_steps[cid] == previous
  quarantined = os.path.join(run_dir, checkpoints.DIRNAME, checkpoints.QUARANTINE, cid)
  # The warning says where, not which: the candidate's id (it hashes the key) is not in it.
  assert any(f"moved to {os.path.dirname(quarantined)}" in str(w.message) for w in caught)
  assert not any(cid in str(w.message) for w in caught)
  # Stored: its checkpoints, the quarantined one included, are gone (secret, never needed again).
  assert not os.path.exists(quarantined) and held_steps(run_dir) == {}


def test_a_checkpoint_of_another_run_is_refused_never_resumed(base_config, digits, two_devices,
                                                              tmp_path, crash_after_saves):
  run_dir = str(tmp_path / "run")
  crash_after_saves(2)
  with pytest.raises(Crash):
    search(long_config(base_config), digits, two_devices, run_dir=run_dir)
  assert held_steps(run_dir)
  # Another key, or another mechanism (noise), on that run_dir: refused before anything trains.
  with pytest.raises(SearchMismatchError):
    random_search(long_config(base_config), GRID, digits, distribution=REPS, key=jax.random.key(2),
                  run_config=RunConfig(run_dir=run_dir, trainer=refusing))
  with pytest.raises(SearchMismatchError):
    search(dataclasses.replace(long_config(base_config), noise_multiplier=2.0), digits, two_devices,
           run_dir=run_dir, trainer=refusing)
  # Past the run directory's manifest: the engine on other rows with the same candidates finds
  # a checkpoint whose identity is not theirs.
  other = Dataset(train=jax.tree.map(lambda x: x[::-1], digits.train), test=digits.test,
                  num_examples=digits.num_examples, name="reversed digits")
  held = held_steps(run_dir)
  mine = [c for c in draw_search(SearchSpace(long_config(base_config), GRID), REPS, jax.random.key(1))
          if c.id in held]
  assert mine
  with pytest.raises(SearchMismatchError, match="checkpoint of another run"):
    engine.train_candidates(mine, other, devices=two_devices,
                            checkpoint_dir=os.path.join(run_dir, checkpoints.DIRNAME))


@pytest.mark.slow  # suite budget
def test_a_foreign_or_broken_candidate_directory_is_never_resumed(base_config, digits, two_devices,
                                                                  tmp_path, crash_after_saves):
  run_dir = str(tmp_path / "run")
  config = long_config(base_config)
  crash_after_saves(2)  # both candidates of the first chunk saved at step 15
  with pytest.raises(Crash):
    search(config, digits, two_devices, run_dir=run_dir)
  first, second = sorted(held_steps(run_dir))
  directory = os.path.join(run_dir, checkpoints.DIRNAME)
  # Another candidate's checkpoint in this one's place: intact, but not its run.
  os.rename(os.path.join(directory, second), os.path.join(tmp_path, "kept"))
  shutil.copytree(os.path.join(directory, first), os.path.join(directory, second))
  # The refusal names where, not which: a candidate's id hashes its key (issue 42).
  with pytest.raises(SearchMismatchError, match="is a checkpoint of another run") as err:
    search(config, digits, two_devices, run_dir=run_dir)
  assert second not in str(err.value)
  # A file where a candidate's directory should be: quarantined, the candidate trains from 0.
  shutil.rmtree(os.path.join(directory, second))
  with open(os.path.join(directory, second), "w") as f:
    f.write("not a checkpoint")
  with pytest.warns(UserWarning, match="it is not a directory"):
    resumed = search(config, digits, two_devices, run_dir=run_dir)
  assert resumed.unreleased.resumed_steps == {first: EVERY}


@pytest.mark.slow  # suite budget
def test_a_diverged_candidate_resumes_at_its_segment_stop_not_at_its_own_step(
    base_config, digits, two_devices, tmp_path, crash_after_saves):
  # The step a candidate diverges at depends on the data; the label of its checkpoints, and
  # what the search reports, must be the public stop of the segment.
  # A step size of learning_rate ** t: the parameters overflow within a few steps.
  exploding = dataclasses.replace(base_config.task, name="exploding", optimizer=lambda hp: optax.chain(
      optax.sgd(hp["learning_rate"]), optax.scale_by_schedule(lambda t: hp["learning_rate"] ** t)))
  config = dataclasses.replace(long_config(base_config), task=exploding)
  grid = {"learning_rate": [1e5]}
  kw = dict(distribution=acc.Fixed(1), key=jax.random.key(1))
  local = LocalTrainer(devices=two_devices)
  reference = random_search(config, grid, digits, run_config=RunConfig(trainer=local), **kw)
  run_dir = str(tmp_path / "run")
  kw["run_config"] = RunConfig(run_dir=run_dir, trainer=local)
  crash_after_saves(2)
  with pytest.raises(Crash):
    random_search(config, grid, digits, **kw)
  assert held_steps(run_dir) and all(
      s % EVERY == 0 for steps in held_steps(run_dir).values() for s in steps)
  resumed = random_search(config, grid, digits, **kw)
  assert resumed.unreleased.resumed_steps and set(resumed.unreleased.resumed_steps.values()) == {2 * EVERY}
  assert resumed.hyperparameters == reference.hyperparameters is None  # diverged: no release
  record = json.loads(open(os.path.join(run_dir, "results.jsonl")).readline())
  assert record["diverged"] and record["steps"] < EVERY and record["resumed_step"] == 2 * EVERY


def refusing(candidates, data, **kwargs):
  raise AssertionError(f"trained {len(candidates)} candidate(s): the rerun should have been refused")


@pytest.mark.slow  # suite budget
def test_checkpoints_off_or_without_run_dir_save_nothing(base_config, digits, two_devices, tmp_path,
                                                         monkeypatch, uninterrupted):
  def refuse(*args):
    raise AssertionError("a checkpoint was saved")
  monkeypatch.setattr(checkpoints.Checkpoints, "save", refuse)
  off = search(long_config(base_config, every=0), digits, two_devices, run_dir=str(tmp_path / "off"))
  assert_same_release(off, uninterrupted)  # and a cadence changes no bit
  search(long_config(base_config, every=1), digits, two_devices)  # no run_dir: no checkpoints


@pytest.mark.slow  # a search with a slow compilation: about 3 s
def test_the_automatic_cadence_times_steps_not_the_compilation(base_config, digits, two_devices,
                                                               tmp_path, monkeypatch):
  cadences = []
  make = engine._Cadence  # pylint: disable=protected-access
  monkeypatch.setattr(engine, "_Cadence", lambda every: cadences.append(make(every)) or cadences[-1])
  compiled_chunk = engine._compiled_chunk  # pylint: disable=protected-access

  def slow_compilation(*args):
    time.sleep(2.0)
    return compiled_chunk(*args)
  monkeypatch.setattr(engine, "_compiled_chunk", slow_compilation)
  search(long_config(base_config, every=None), digits, two_devices, run_dir=str(tmp_path / "run"))
  # A step of this model takes about a millisecond; 2 s of compiling over 8 steps would be 0.25 s.
  assert cadences and all(c.seconds_per_step < 0.05 for c in cadences)


@pytest.mark.slow  # many one-step segments: about 4 s
def test_the_default_cadence_saves_by_wall_time(base_config, digits, two_devices, tmp_path,
                                                monkeypatch):
  seen = []
  monkeypatch.setattr(checkpoints, "AUTO_SECONDS", 1e-4)  # every segment is "10 minutes" long
  monkeypatch.setattr(checkpoints, "PROBE_STEPS", 4)
  save = checkpoints.Checkpoints.save

  def recording(self, candidate_id, identity, step, tree):
    seen.append(step)
    save(self, candidate_id, identity, step, tree)
  monkeypatch.setattr(checkpoints.Checkpoints, "save", recording)
  config = dataclasses.replace(long_config(base_config, every=None), steps=12)
  search(config, digits, two_devices, run_dir=str(tmp_path / "auto"))
  # The group's first chunk times its first PROBE_STEPS steps (saving nothing), then saves after
  # every segment of AUTO_SECONDS; the later chunks know the step time from the start.
  assert len(seen) > 2 and seen[0] > checkpoints.PROBE_STEPS and max(seen) < 12
  seen.clear()
  monkeypatch.setattr(checkpoints, "AUTO_SECONDS", 600.0)  # the default: 12 steps take far less
  search(config, digits, two_devices, run_dir=str(tmp_path / "default"))
  assert seen == []


def test_the_reachability_token_names_a_directory_the_driver_wrote(tmp_path):
  token = checkpoints.mark_reachable(str(tmp_path / "shared"))
  checkpoints.check_reachable(str(tmp_path / "shared"), token)
  with pytest.raises(ValueError, match="storage every node reaches"):
    checkpoints.check_reachable(str(tmp_path / "shared"), "another driver's token")
  with pytest.raises(ValueError, match="storage every node reaches"):
    checkpoints.check_reachable(str(tmp_path / "a node's local disk"), token)


# --- SIGKILL: a real process killed mid-candidate --------------------------------------------


def _driver(run_dir, *args, check=True) -> dict:
  proc = subprocess.run([sys.executable, DRIVER, "--run-dir", run_dir, *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
  if not check:
    return proc
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _stored(run_dir) -> list:
  path = os.path.join(run_dir, "results.jsonl")
  return [json.loads(line)["id"] for line in open(path)] if os.path.exists(path) else []


@pytest.mark.slow  # four fresh processes: about 40 s
@pytest.mark.timeout(600)
def test_sigkill_mid_candidate_twice_then_only_the_remaining_steps_train(tmp_path):
  reference = _driver(str(tmp_path / "reference"))
  steps = 200
  assert set(reference["trained_steps"].values()) == {steps}
  run_dir = str(tmp_path / "run")
  expected_trained = {}
  for kills in (10, 3):  # 10: mid second chunk (the first stored); 3: mid a resumed one
    proc = _driver(run_dir, "--kill-after-saves", str(kills), check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    held = {cid: max(s) for cid, s in held_steps(run_dir).items()}
    stored = set(_stored(run_dir))
    assert held and not set(held) & stored  # killed in the middle of candidates
    assert all(0 < step < steps for step in held.values())
  final = _driver(run_dir)
  for field in ("hyperparameters", "score", "epsilon", "num_candidates", "params_sha256"):
    assert final[field] == reference[field], field
  # Only the remaining steps trained: counted on the state the compiled step returned.
  expected_trained = {cid: steps - held.get(cid, 0) for cid in set(final["ids"]) - stored}
  assert final["trained_steps"] == expected_trained
  assert final["resumed_steps"] == held
  assert final["resumed"] == len(stored)
  assert held_steps(run_dir) == {}


@pytest.mark.slow  # two fresh processes and a long candidate: about 30 s
@pytest.mark.timeout(600)
def test_sigkill_from_outside_at_any_moment_resumes_to_the_same_release(tmp_path):
  args = ["--steps", "2000", "--every", "50"]
  reference = _driver(str(tmp_path / "reference"), *args)
  run_dir = str(tmp_path / "run")
  proc = subprocess.Popen([sys.executable, DRIVER, "--run-dir", run_dir, *args], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 240
  while not any(max(s) >= 300 for s in held_steps(run_dir).values()):
    assert proc.poll() is None, proc.communicate()
    assert time.monotonic() < deadline
    time.sleep(0.01)
  proc.send_signal(signal.SIGKILL)  # wherever it is: mid-step, mid-save
  proc.communicate(timeout=30)
  held = {cid: max(s) for cid, s in held_steps(run_dir).items()}
  final = _driver(run_dir, *args)
  for field in ("hyperparameters", "score", "epsilon", "num_candidates", "params_sha256"):
    assert final[field] == reference[field], field
  assert final["resumed_steps"] and set(final["resumed_steps"].items()) <= set(held.items())
