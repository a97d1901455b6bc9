"""Batched training: equivalence with lone runs, grouping, sharding, no recompilation."""

import dataclasses

import jax
import numpy as np
import pytest

from jaxdp.sweep import Candidate, SearchSpace, engine, grid_candidates
from jaxdp.train import program, train_candidate
from jaxdp.train import loop_spec


def _cands(base_config):
  space = SearchSpace(base_config, {"learning_rate": [0.3, 3.0], "l2_clip_norm": [0.5, 2.0],
                                    "noise_multiplier": [0.7]})
  return [Candidate(p, c, s) for (p, c), s in zip(zip(space.points, space.configs), [0, 7, 11, 12])]


# auto-1dev (6 s) runs in the slow set (the suite's 5-minute budget); auto-2dev is its sibling.
@pytest.mark.parametrize("per_device,devices", [pytest.param(None, 1, marks=pytest.mark.slow), (None, 2), (2, 2),
                                                (3, 2)],
                         ids=["auto-1dev", "auto-2dev", "2per-2dev", "3per-2dev-padded"])
def test_batched_candidate_equals_lone_run(digits, base_config, two_devices, per_device, devices):
  cands = _cands(base_config)
  batched = engine.train_candidates(cands, digits, max_candidates_per_device=per_device,
                                    devices=two_devices[:devices], keep_params=True)
  for cand, res in zip(cands, batched):
    alone = train_candidate(cand.config, digits, cand.key())
    assert res.steps == alone.steps == cand.config.num_steps
    assert res.test_score == pytest.approx(alone.test_score, abs=1e-6)
    assert res.test_loss == pytest.approx(alone.test_loss, rel=1e-5)
    assert res.epsilon == alone.epsilon
    for a, b in zip(jax.tree.leaves(res.params), jax.tree.leaves(alone.params)):
      np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


@pytest.mark.slow  # 5 s of compiling; CI's slow set runs it, so make test stays under 5 min
def test_reports_each_groups_compile_time_once(digits, base_config, two_devices):
  # A config no other test uses, so its programs are not compiled yet.
  fresh = base_config.replace(steps=13)
  cands = [Candidate({"i": i}, fresh.replace(learning_rate=lr), i) for i, lr in enumerate([0.1, 0.2, 0.3])]
  first = engine.train_candidates(cands, digits, devices=two_devices)
  # One group: every candidate reports its compilation, which took time.
  assert len({r.compile_time_s for r in first}) == 1 and first[0].compile_time_s > 0
  again = engine.train_candidates(cands, digits, devices=two_devices)
  assert [r.compile_time_s for r in again] == [0.0] * 3  # cached: nothing compiled
  assert [r.score for r in again] == [r.score for r in first]
  alone = [train_candidate(c.config, digits, c.key()) for c in cands]
  assert alone[0].compile_time_s > 0 and alone[1].compile_time_s == alone[2].compile_time_s == 0.0


def test_groups_by_static_shape_and_keeps_order(digits, base_config, two_devices):
  other = base_config.replace(sampling_prob=0.1, steps=10)
  cands = [Candidate({"i": i}, cfg, i) for i, cfg in enumerate([base_config, other, base_config, other])]
  res = engine.train_candidates(cands, digits, devices=two_devices)
  assert [r.planned_steps for r in res] == [30, 10, 30, 10]
  assert res[0].epsilon != res[1].epsilon and res[0].epsilon == res[2].epsilon


class _XlaCompilations:
  """Counts XLA backend compilations (not Python cache misses) while active."""

  _EVENT = "/jax/core/compile/backend_compile_duration"

  def __init__(self):
    self.count = 0

  def _listener(self, event, duration_secs, **kwargs):
    del duration_secs, kwargs
    if event == self._EVENT:
      self.count += 1

  def __enter__(self):
    jax.monitoring.register_event_duration_secs_listener(self._listener)
    return self

  def __exit__(self, *exc):
    jax.monitoring.unregister_event_duration_listener(self._listener)


def test_new_hyperparameters_do_not_recompile(digits, base_config, two_devices):
  cands = _cands(base_config)[:2]
  engine.train_candidates(cands, digits, devices=two_devices, max_candidates_per_device=1)
  changed = [dataclasses.replace(c, point={"other": i},
                                 config=c.config.replace(learning_rate=0.01, noise_multiplier=3.0),
                                 seed=99)
             for i, c in enumerate(cands)]
  with _XlaCompilations() as compiles:
    engine.train_candidates(changed, digits, devices=two_devices, max_candidates_per_device=1)
  assert compiles.count == 0
  # The counter does see compilations: a program never traced before compiles once.
  with _XlaCompilations() as compiles:
    jax.jit(lambda x: x * 3.25 + 1)(np.arange(7.0)).block_until_ready()
  assert compiles.count == 1


def test_equal_seeds_at_different_grid_points_draw_independent_noise(digits, base_config, two_devices):
  # Noise std sigma*C = 1e5 swamps every clipped gradient (norm <= 1 per example),
  # so (final - initial params) / learning_rate is, to within 1e-3, minus the summed
  # noise over the batch sizes. With the old key(seed) the two grid points below
  # drew the same noise: correlation 1.000000. Independent: ~N(0, 1/650), 0.25 is
  # over 6 sigma.
  cfg = base_config.replace(noise_multiplier=1e5)
  space = SearchSpace(cfg, {"learning_rate": [1e-3, 2e-3]})
  cands = grid_candidates(space, seeds=[0])
  res = engine.train_candidates(cands, digits, devices=two_devices, keep_params=True)
  moves = []
  for cand, r in zip(cands, res):
    init_key, _ = jax.random.split(cand.key())
    spec = loop_spec.LoopSpec.from_config(cand.config, digits)
    start = program.init_params(spec, init_key, digits.train)
    moves.append(np.concatenate([np.ravel((a - b) / cand.config.hparams["learning_rate"])
                                 for a, b in zip(jax.tree.leaves(r.params), jax.tree.leaves(start))]))
  assert moves[0].size >= 650
  assert abs(np.corrcoef(moves[0], moves[1])[0, 1]) < 0.25
  # The same (point, seed) reproduces exactly in the layout of its search (alone, without
  # search_size, it would share both devices: the same mechanism, another order of additions).
  again = engine.train_candidates(cands[:1], digits, devices=two_devices, keep_params=True,
                                  search_size=len(cands))
  for a, b in zip(jax.tree.leaves(again[0].params), jax.tree.leaves(res[0].params)):
    np.testing.assert_array_equal(a, b)


def test_divergent_candidate_scores_nan_without_crashing(digits, base_config, two_devices):
  # lr * sigma * C = 1e44 overflows float32 in the first step whatever the key
  # draws (lr=1e30 left a finite loss of 8e35 under some keys).
  bad = base_config.replace(learning_rate=1e38, noise_multiplier=1e6)
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
