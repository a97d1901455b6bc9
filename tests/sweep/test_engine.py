"""Batched training: equivalence with lone runs, grouping, sharding, no recompilation."""

import dataclasses

import jax
import numpy as np
import pytest

from jaxdp.sweep import Candidate, SearchSpace, engine, grid_candidates
from jaxdp.train import train_candidate


def _cands(base_config):
  space = SearchSpace(base_config, {"learning_rate": [0.3, 3.0], "l2_clip_norm": [0.5, 2.0],
                                    "noise_multiplier": [0.7]})
  return [Candidate(p, c, s) for (p, c), s in zip(zip(space.points, space.configs), [0, 7, 11, 12])]


@pytest.mark.parametrize("per_device,devices", [(None, 1), (2, 2), (3, 2)],
                         ids=["auto-1dev", "2per-2dev", "3per-2dev-padded"])
def test_batched_candidate_equals_lone_run(digits, base_config, two_devices, per_device, devices):
  cands = _cands(base_config)
  batched = engine.train_candidates(cands, digits, max_candidates_per_device=per_device,
                                    devices=two_devices[:devices], keep_params=True)
  for cand, res in zip(cands, batched):
    alone = train_candidate(cand.config, digits, jax.random.key(cand.seed))
    assert res.steps == alone.steps == cand.config.num_steps
    assert res.test_accuracy == pytest.approx(alone.test_accuracy, abs=1e-6)
    assert res.test_loss == pytest.approx(alone.test_loss, rel=1e-5)
    assert res.epsilon == alone.epsilon
    for a, b in zip(jax.tree.leaves(res.params), jax.tree.leaves(alone.params)):
      np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


def test_groups_by_static_shape_and_keeps_order(digits, base_config, two_devices):
  other = dataclasses.replace(base_config, sampling_prob=0.1, steps=10)
  cands = [Candidate({"i": i}, cfg, i) for i, cfg in enumerate([base_config, other, base_config, other])]
  res = engine.train_candidates(cands, digits, devices=two_devices)
  assert [r.planned_steps for r in res] == [30, 10, 30, 10]
  assert res[0].epsilon != res[1].epsilon and res[0].epsilon == res[2].epsilon


def test_new_hyperparameters_do_not_recompile(digits, base_config, two_devices):
  cands = _cands(base_config)[:2]
  engine.train_candidates(cands, digits, devices=two_devices, max_candidates_per_device=1)
  before = engine._compiled_batch.cache_info().misses  # pylint: disable=protected-access
  changed = [dataclasses.replace(c, config=dataclasses.replace(c.config, learning_rate=0.01,
                                                                noise_multiplier=3.0), seed=99)
             for c in cands]
  engine.train_candidates(changed, digits, devices=two_devices, max_candidates_per_device=1)
  assert engine._compiled_batch.cache_info().misses == before  # pylint: disable=protected-access


def test_divergent_candidate_scores_nan_without_crashing(digits, base_config, two_devices):
  bad = dataclasses.replace(base_config, learning_rate=1e30, noise_multiplier=1e6)
  res = engine.train_candidates([Candidate({"lr": "huge"}, bad, 0), Candidate({"lr": 1}, base_config, 0)],
                                digits, devices=two_devices)
  assert res[0].diverged and np.isnan(res[0].score)
  assert not res[1].diverged and res[1].score > 0.5


def test_progress_and_chunk_callback(digits, base_config, two_devices):
  cands = grid_candidates(SearchSpace(base_config, {"learning_rate": [0.5, 1.0, 2.0]}), seeds=[0])
  seen = []
  engine.train_candidates(cands, digits, devices=two_devices, max_candidates_per_device=1,
                          on_chunk=lambda chunk: seen.append([c.id for c, _ in chunk]))
  assert [len(s) for s in seen] == [2, 1]
  assert sorted(sum(seen, [])) == sorted(c.id for c in cands)


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_candidates_per_device=0), "max_candidates_per_device"),
    (dict(devices=[]), "devices must not be empty"),
])
def test_bad_engine_arguments(digits, base_config, kwargs, match):
  with pytest.raises(ValueError, match=match):
    engine.train_candidates(_cands(base_config)[:1], digits, **kwargs)
