"""Durable, resumable tuners through the store (`jaxdp.sweep.store`): a crash costs nothing, a
rerun is the same draw, another draw is refused."""

import dataclasses
import functools
import json
import os
import sys

import jax
import numpy as np
import pytest

import jaxdp
from jaxdp import accounting as acc
from jaxdp.audit import attacks, audit_search
from jaxdp.data import Dataset
from jaxdp.sweep import PoolLockedError, RayTrainer, ResultPool, engine
from jaxdp.sweep import SearchMismatchError
from jaxdp.sweep.records import data_fingerprint
from jaxdp.tuning import (LocalTrainer, random_search, RunConfig, subsampled_search, SubsetTuning,
                          threshold_search)

GRID = {"learning_rate": [0.3, 1.0, 3.0]}
REPS = acc.Poisson(mean=4)


class Crash(RuntimeError):
  """The process died (simulated): nothing after it ran."""


def crash_after(chunks: int, counter: list):
  """A trainer that trains chunk by chunk (one candidate each) and dies after `chunks` of them."""
  def trainer(candidates, plan, *, on_chunk=None, **kwargs):
    results = []
    for cand in candidates:
      if len(counter) >= chunks:
        raise Crash(f"killed after {chunks} chunk(s)")
      res = LocalTrainer()([cand], plan, on_chunk=on_chunk, **kwargs)
      counter.append(cand.id)
      results += res
    return results
  return trainer


def counting(counter: list):
  def trainer(candidates, plan, **kwargs):
    counter.extend(c.id for c in candidates)
    return LocalTrainer()(candidates, plan, **kwargs)
  return trainer


def refusing(candidates, plan, **kwargs):
  raise AssertionError(f"trained {len(candidates)} candidate(s): the rerun should have been refused")


def assert_same_release(a, b):
  assert a.hyperparameters == b.hyperparameters and a.unreleased.num_candidates == b.unreleased.num_candidates
  np.testing.assert_equal(a.score, b.score)  # NaN (nothing released) equals NaN here
  assert a.epsilon == b.epsilon and a.event == b.event
  assert (a.params is None) == (b.params is None)
  # Bit for bit: the same program on the same machine, and stored bytes read back.
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert np.asarray(x).dtype == np.asarray(y).dtype


def _search(base_config, digits, two_devices, run_dir=None, trainer=None, **kw):
  trainer = LocalTrainer(devices=two_devices) if trainer is None else trainer
  kwargs = dict(distribution=REPS, key=jax.random.key(4), run_config=RunConfig(run_dir, trainer))
  kwargs.update(kw)
  return random_search(base_config, GRID, digits, **kwargs)


@pytest.fixture(scope="module")
def uninterrupted(digits, base_config, two_devices):
  return _search(base_config, digits, two_devices)


def test_a_crashed_random_search_resumes_to_the_uninterrupted_release(uninterrupted, digits, base_config,
                                                                     two_devices, tmp_path):
  assert uninterrupted.unreleased.num_candidates >= 3
  first = []
  with pytest.raises(Crash):
    _search(base_config, digits, two_devices, run_dir=tmp_path, trainer=crash_after(2, first))
  assert len(first) == 2
  stored = [json.loads(line)["id"] for line in (tmp_path / "results.jsonl").read_text().splitlines()]
  assert stored == first  # both chunks on disk before the crash
  second = []
  resumed = _search(base_config, digits, two_devices, run_dir=tmp_path, trainer=counting(second))
  # Only what was missing trains, and the release is the uninterrupted one.
  assert not set(second) & set(first) and len(set(first) | set(second)) == len(set(
      c.id for c in _drawn(base_config, digits)))
  assert_same_release(resumed, uninterrupted)
  # A third run trains nothing at all.
  assert_same_release(_search(base_config, digits, two_devices, run_dir=tmp_path, trainer=refusing),
                      uninterrupted)


def _drawn(base_config, digits):
  from jaxdp.sweep import SearchSpace  # pylint: disable=g-import-not-at-top
  from jaxdp.tuning.draws import draw_search  # pylint: disable=g-import-not-at-top
  return draw_search(SearchSpace(base_config, GRID), REPS, jax.random.key(4))


@pytest.mark.parametrize("change,why", [
    (dict(key=jax.random.key(6)), "key"),
    (dict(distribution=acc.Poisson(mean=5)), "accounted"),
    (dict(grid={"learning_rate": [0.3, 1.0]}), "points"),
    (dict(config=dict(noise_multiplier=1.5)), "configs"),
    (dict(data="one value changed"), "data"),
    (dict(version="9.9"), "jaxdp"),
], ids=["key", "law-of-K", "grid", "config", "data", "jaxdp-version"])
def test_another_draw_on_the_same_run_dir_is_refused_before_training(change, why, digits, base_config,
                                                                     two_devices, tmp_path, monkeypatch):
  _search(base_config, digits, two_devices, run_dir=tmp_path, distribution=acc.Poisson(mean=1))
  kwargs = dict(distribution=acc.Poisson(mean=1), key=jax.random.key(4),
                run_config=RunConfig(run_dir=tmp_path, trainer=refusing))
  config, grid, data = base_config, GRID, digits
  if "key" in change or "distribution" in change:
    kwargs.update(change)
  if "grid" in change:
    grid = change["grid"]
  if "config" in change:
    config = base_config.replace(**change["config"])
  if "data" in change:
    x = np.array(digits.train.inputs)
    x[0, 0, 0, 0] += 1.0
    data = dataclasses.replace(digits, train=digits.train._replace(inputs=x))
  if "version" in change:
    monkeypatch.setattr(jaxdp, "__version__", change["version"])
  with pytest.raises(SearchMismatchError, match=rf"(?s)differs in: [^)]*{why}.*second search on the same data"):
    random_search(config, grid, data, **kwargs)


def test_a_damaged_parameter_file_or_record_costs_only_its_candidates(uninterrupted, digits, base_config,
                                                                      two_devices, tmp_path):
  _search(base_config, digits, two_devices, run_dir=tmp_path)
  files = sorted(os.listdir(tmp_path / "params"))
  assert files
  (tmp_path / "params" / files[0]).write_bytes(b"not what was written")
  lines = (tmp_path / "results.jsonl").read_bytes().split(b"\n")
  lines[-2] = lines[-2].replace(b'"score"', b'"scare"')  # the last record fails its checksum
  (tmp_path / "results.jsonl").write_bytes(b"\n".join(lines))
  retrained = []
  with pytest.warns(UserWarning, match="quarantine"):
    again = _search(base_config, digits, two_devices, run_dir=tmp_path, trainer=counting(retrained))
  assert 1 <= len(retrained) < uninterrupted.unreleased.num_candidates  # the rest was read back
  assert_same_release(again, uninterrupted)
  assert (tmp_path / "results.jsonl.quarantine").stat().st_size > 0


def test_a_run_dir_locked_by_a_live_writer_or_not_writable_is_refused(digits, base_config, two_devices,
                                                                      tmp_path):
  with ResultPool(tmp_path / "busy", {"x": 1}):
    with pytest.raises(PoolLockedError, match="is locked"):
      _search(base_config, digits, two_devices, run_dir=tmp_path / "busy", trainer=refusing)
  # A path that cannot be a directory, for any user (root included).
  (tmp_path / "a-file").write_text("x")
  with pytest.raises(ValueError, match="cannot be created"):
    _search(base_config, digits, two_devices, run_dir=tmp_path / "a-file" / "run", trainer=refusing)


@pytest.mark.parametrize("bad,match", [
    (dict(run_dir=3), "run_dir must be None or a directory path"),
    (dict(trainer="ray"), "trainer must be None, a jaxdp.sweep.LocalTrainer or RayTrainer"),
])
def test_bad_run_dir_or_trainer(bad, match, digits, base_config, two_devices, no_work):
  with pytest.raises(ValueError, match=match):
    _search(base_config, digits, two_devices, run_config=RunConfig(**bad))


@pytest.mark.slow  # three searches of up to 4 candidates: `make test-slow` (CI) runs it
def test_threshold_search_resumes_at_its_candidate_index(digits, base_config, two_devices, tmp_path):
  kwargs = dict(threshold=0.99, distribution=acc.CappedGeometric(0.2, 4), key=jax.random.key(3))
  whole = threshold_search(base_config, GRID, digits, **kwargs)
  assert whole.unreleased.num_candidates >= 3
  first = []
  with pytest.raises(Crash):
    threshold_search(base_config, GRID, digits, run_config=RunConfig(tmp_path, crash_after(2, first)),
                     **kwargs)
  second = []
  resumed = threshold_search(base_config, GRID, digits, run_config=RunConfig(tmp_path, counting(second)),
                             **kwargs)
  assert len(first) == 2 and not set(second) & set(first)
  assert_same_release(resumed, whole)


@pytest.mark.slow  # three subset searches and final runs: `make test-slow` (CI) runs it
def test_subsampled_search_resumes_and_keeps_its_final_model(digits, base_config, two_devices, tmp_path,
                                                             monkeypatch):
  kwargs = dict(subset=SubsetTuning(0.3, 1), distribution=acc.Poisson(mean=2), key=jax.random.key(3))
  whole = subsampled_search(base_config, GRID, digits,
                            run_config=RunConfig(trainer=LocalTrainer(devices=two_devices)),
                            **kwargs)
  durable_run = subsampled_search(base_config, GRID, digits, run_config=RunConfig(run_dir=tmp_path),
                                  **kwargs)
  for x, y in zip(jax.tree.leaves(whole.params), jax.tree.leaves(durable_run.params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  # A rerun trains nothing: the tuning candidates and the final model are read back.
  from jaxdp.tuning import subsampled  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(subsampled, "run_planned", refusing)
  again = subsampled_search(base_config, GRID, digits, run_config=RunConfig(tmp_path, refusing),
                            **kwargs)
  assert again.tuned_hyperparameters == whole.tuned_hyperparameters
  assert again.score == whole.score and again.epsilon == whole.epsilon
  # Every distinct tuning candidate and the final run were read back; the first run read none.
  assert durable_run.unreleased.resumed == 0 and again.unreleased.resumed >= 2 and whole.unreleased.resumed == 0
  for x, y in zip(jax.tree.leaves(whole.params), jax.tree.leaves(again.params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.slow  # two audits of 60 trials per side: `make test-slow` (CI) runs it
def test_audit_search_resumes_without_training_again(tmp_path):
  gadget = attacks.selection_gadget(noise_multiplier=0.5)
  kwargs = dict(distribution=acc.Poisson(mean=2), statistic=gadget.statistic, trials=60,
                key=jax.random.key(0))
  first = audit_search(gadget.config, gadget.grid, gadget.without, gadget.with_,
                       run_config=RunConfig(run_dir=tmp_path), **kwargs)
  again = audit_search(gadget.config, gadget.grid, gadget.without, gadget.with_,
                       run_config=RunConfig(run_dir=tmp_path, trainer=refusing), **kwargs)
  np.testing.assert_array_equal(first.statistics_without, again.statistics_without)
  np.testing.assert_array_equal(first.statistics_with, again.statistics_with)
  assert sorted(os.listdir(tmp_path)) == ["D", "D_prime"]


def test_a_trainer_without_run_dir_is_the_backend(digits, base_config, two_devices, uninterrupted):
  seen = []
  res = _search(base_config, digits, two_devices, trainer=counting(seen))
  assert len(seen) == uninterrupted.unreleased.num_candidates
  assert_same_release(res, uninterrupted)


def test_the_fingerprint_reads_the_data_not_its_name(digits):
  same = Dataset(train=digits.train, test=digits.test, num_examples=digits.num_examples, name="other")
  assert data_fingerprint(same) == data_fingerprint(digits)
  fewer = Dataset(train=digits.train, test=digits.test, num_examples=digits.num_examples - 1)
  assert data_fingerprint(fewer) != data_fingerprint(digits)


def test_ray_not_installed_is_one_clear_error_before_training(digits, base_config, tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
  with pytest.raises(ValueError, match=r"the Ray backend needs Ray: pip install 'jaxdp\[ray\]'"):
    random_search(base_config, GRID, digits, distribution=REPS, key=jax.random.key(4),
                  run_config=RunConfig(run_dir=tmp_path, trainer=RayTrainer()))
  assert not (tmp_path / "results.jsonl").exists()  # nothing trained


def test_ray_trainer_refuses_this_process_devices(two_devices):
  with pytest.raises(ValueError, match="a Ray task does not have"):
    RayTrainer(local=LocalTrainer(devices=two_devices))


def test_an_unreachable_ray_address_is_one_clear_error_before_training(digits, base_config, tmp_path):
  ray = pytest.importorskip("ray")
  assert not ray.is_initialized()  # `address` is read only when Ray is not initialised
  trainer = RayTrainer(address="127.0.0.1:9")  # the discard port
  with pytest.raises(ValueError, match=r"cannot reach Ray at address='127.0.0.1:9' \(Connection refused\)"):
    random_search(base_config, GRID, digits, distribution=REPS, key=jax.random.key(4),
                  run_config=RunConfig(run_dir=tmp_path, trainer=trainer))
  assert not (tmp_path / "results.jsonl").exists()
  with pytest.raises(ValueError, match=r"address must be None, 'auto', 'local' or 'host:port'"):
    RayTrainer(address="nowhere")
