"""A user's own task (issue 12) through every entry point: lone run, engine, pool, every tuner.

The task (tests/conftest.py) is a Flax MLP whose `width` the model
factory reads (static), a per-example sigmoid cross-entropy and an accuracy
score over dict batches, and `optax.chain(clip_by_global_norm, adamw)` built
from learning_rate and weight_decay (traced), on NumPy dict data.
"""

import jax
import numpy as np
import pytest

from jaxdp import accounting as acc
from jaxdp.sweep import (Candidate, ResultPool, SearchSpace, TaskPlan, engine, grid_candidates,
                         run_sweep)
from jaxdp.train import LoopSpec, Task, TrainConfig, scale_learning_rate, train_candidate, trainer
from jaxdp.tuning import (dry_run, extrapolate, LocalTrainer, random_search, RunConfig,
                          subsampled_search, SubsetTuning, threshold_search)


from tests.conftest import USER_N, user_optimizer

PUBLIC = trainer.PUBLIC_SOURCE
REPS = acc.Poisson(mean=3)
GRID = {"learning_rate": [0.02, 0.1], "width": [4, 8]}


def _kernel_width(params):
  return params["params"]["hidden"]["kernel"].shape[1]


def _assert_same_params(a, b, **tol):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), **tol)


def test_train_candidate(user_config, user_data):
  res = train_candidate(user_config, user_data, jax.random.key(0))
  assert res.steps == res.planned_steps == 10 == user_config.num_steps_for(USER_N)  # ceil(1 / (20/200))
  assert not res.diverged and 0.0 <= res.score <= 1.0
  assert res.score == res.test_score and res.score_source == PUBLIC  # plain score: public test split
  assert np.isfinite(res.test_loss)
  assert res.epsilon == user_config.epsilon(USER_N)
  assert _kernel_width(res.params) == 8
  again = train_candidate(user_config, user_data, jax.random.key(0))
  _assert_same_params(res.params, again.params, rtol=0, atol=0)


# The traced hyperparameters (C and sigma in the plan; learning_rate and
# weight_decay in the optimizer) vary within a group; width (model factory)
# and batch_size (q = b / N, hence padded batch and steps) make the groups.
# Three of the grid's four groups train (each costs two compilations).
STATIC = [(8, 20), (4, 20), (8, 10)]
TRACED = [dict(learning_rate=0.02, weight_decay=0.0, l2_clip_norm=0.5, noise_multiplier=0.8),
          dict(learning_rate=0.1, weight_decay=1e-3, l2_clip_norm=1.0, noise_multiplier=1.5)]


@pytest.fixture(scope="module")
def equivalence_space(user_config):
  grid = {"width": [4, 8], "batch_size": [10, 20]}
  grid.update({name: sorted({t[name] for t in TRACED}) for name in TRACED[0]})
  return SearchSpace(user_config, grid)


def test_groups_traced_and_static(equivalence_space, user_data):
  space = equivalence_space
  assert len(space) == 64
  groups = TaskPlan.build(space, user_data).summary()["groups"]
  assert len(groups) == 4 and [g.grid_points for g in groups] == [16] * 4
  assert {(g.static["width"], round(g.sampling_prob * USER_N)) for g in groups} == {
      (w, b) for w in (4, 8) for b in (10, 20)}
  for g in groups:
    assert g.traced == ("learning_rate", "weight_decay")
    assert g.steps == int(np.ceil(1 / g.sampling_prob))  # one epoch at q = b / N
  # batch_size b means q = b / N; each (q, sigma) pair is its own DpEvent (C changes none).
  assert sorted({c.sampling_prob_for(USER_N) for c in space.configs}) == [0.05, 0.1]
  assert len(space.events(USER_N)) == 4
  with pytest.raises(ValueError, match="batch_size=10 sets q = batch_size / N: pass num_examples"):
    space.configs[0].dp_event()


@pytest.mark.slow  # 12 s of compiling; CI's slow set runs it, so make test stays under 5 min
def test_batched_equals_lone_over_traced_and_static(user_config, user_data, two_devices):
  cands = []
  for i, (width, b) in enumerate(STATIC):
    for j, traced in enumerate(TRACED):
      point = dict(width=width, batch_size=b, **traced)
      cands.append(Candidate(point, user_config.replace(**point), seed=10 * i + j))
  batched = engine.train_candidates(cands, user_data, devices=two_devices, max_candidates_per_device=1,
                                    keep_params=True)
  assert len({LoopSpec.from_config(c.config, user_data) for c in cands}) == 3
  for cand, res in zip(cands, batched):
    alone = train_candidate(cand.config, user_data, cand.key())
    assert res.steps == alone.steps == cand.config.num_steps_for(USER_N)
    assert res.score == pytest.approx(alone.score, abs=1e-6)
    assert res.test_score == pytest.approx(alone.test_score, abs=1e-6)
    assert res.test_loss == pytest.approx(alone.test_loss, rel=1e-5)
    assert res.epsilon == alone.epsilon == cand.config.epsilon(USER_N)
    assert _kernel_width(res.params) == cand.point["width"]
    _assert_same_params(res.params, alone.params, rtol=2e-5, atol=2e-6)
  # Different traced values really train differently within a group.
  assert not np.allclose(np.asarray(jax.tree.leaves(batched[0].params)[0]),
                         np.asarray(jax.tree.leaves(batched[1].params)[0]))


@pytest.mark.slow  # suite budget (tests/sweep/test_store.py resumes durable searches by default)
def test_run_sweep_durable_pool(user_config, user_data, two_devices, tmp_path):
  cands = grid_candidates(SearchSpace(user_config, {"learning_rate": [0.02, 0.1]}), seeds=[0, 1])
  calls = []

  local = LocalTrainer(devices=two_devices, max_candidates_per_device=1)

  def counting(todo, plan, **kw):
    calls.append(len(todo))
    return local(todo, plan, **kw)

  fp = {"task": "user-mlp"}
  run_sweep(cands[:3], user_data, tmp_path, fp, trainer=counting)
  pool = run_sweep(cands, user_data, tmp_path, fp, trainer=counting)
  assert calls == [3, 1]
  records = ResultPool(tmp_path, fp, read_only=True).records
  assert {r["id"] for r in records} == {c.id for c in cands} == pool.done_ids()
  lone = {c.id: train_candidate(c.config, user_data, c.key()) for c in cands}
  for r in records:
    assert r["score_source"] == PUBLIC
    assert r["test_score"] == pytest.approx(lone[r["id"]].test_score, abs=1e-6)
    assert r["epsilon"] == user_config.epsilon(USER_N)
    # batch_size configs: the DpEvent is built with q = b / N.
    assert r["dp_event"] == repr(user_config.dp_event(USER_N)) and "sampling_probability=0.1" in r["dp_event"]
  # The record's DpEvent is its run's, from the plan (q = b / N with the declared N).
  plan = TaskPlan.for_candidates(cands[:1], user_data)
  assert plan.record(cands[0], lone[cands[0].id])[0]["dp_event"] == repr(user_config.dp_event(USER_N))
  with pytest.raises(ValueError, match="not one of this TaskPlan's"):
    plan.record(Candidate(cands[0].point, user_config, 0), lone[cands[0].id])


@pytest.fixture(scope="module")
def user_random_search(user_config, user_data, two_devices):
  return random_search(user_config, GRID, user_data, distribution=REPS, key=jax.random.key(1),
                       run_config=RunConfig(trainer=LocalTrainer(devices=two_devices,
                                                                 max_candidates_per_device=1)))


def test_random_search(user_random_search, user_config, user_data):
  res = user_random_search
  assert res.unreleased.num_candidates >= 1 and res.hyperparameters is not None
  assert res.hyperparameters["learning_rate"] in GRID["learning_rate"]
  assert res.hyperparameters["width"] in GRID["width"]
  assert res.config.hparams["width"] == res.hyperparameters["width"] == _kernel_width(res.params)
  assert 0.5 < res.score <= 1.0
  assert res.score_source == PUBLIC and res.noise_multiplier is None
  # Only learning_rate and width vary: every candidate has the base's DpEvent.
  event = acc.RepeatAndSelect(user_config.dp_event(USER_N), REPS)
  assert res.event == event
  assert res.epsilon == acc.epsilon(event, 1e-5, method="best")
  # The selected candidate is reproducible alone from its config.
  again = random_search(user_config, GRID, user_data, distribution=REPS, key=jax.random.key(1),
                        run_config=RunConfig(trainer=LocalTrainer(max_candidates_per_device=1)))
  assert again.hyperparameters == res.hyperparameters and again.score == res.score


def test_dry_run_matches_random_search(no_work, user_random_search, user_config, user_data):
  plan = dry_run(user_config, GRID, user_data, distribution=REPS)
  assert plan.epsilon == user_random_search.epsilon and plan.event == user_random_search.event
  assert len(plan.groups) == 2 and {g.static["width"] for g in plan.groups} == {4, 8}
  assert plan.expected_gradient_evaluations == pytest.approx(3 * 10 * 0.1 * USER_N)
  assert plan.score_source == PUBLIC


@pytest.mark.slow  # suite budget (tests/tuning/test_search.py runs threshold_search by default)
def test_threshold_search(user_config, user_data, two_devices):
  easy = threshold_search(user_config, GRID, user_data, threshold=0.0,
                          distribution=acc.Geometric(gamma=0.5), key=jax.random.key(2),
                          run_config=RunConfig(trainer=LocalTrainer(devices=two_devices,
                                                                    max_candidates_per_device=1)))
  assert easy.unreleased.num_candidates == 1 and easy.hyperparameters is not None and easy.score_source == PUBLIC
  assert easy.config.hparams["width"] == _kernel_width(easy.params)
  assert easy.epsilon == acc.epsilon(acc.ThresholdSelect(user_config.dp_event(USER_N), 0.5), 1e-5, "best")
  never = threshold_search(user_config, GRID, user_data, threshold=2.0, distribution=acc.Fixed(1),
                           key=jax.random.key(2),
                           run_config=RunConfig(trainer=LocalTrainer(devices=two_devices,
                                                                     max_candidates_per_device=1)))
  assert never.unreleased.num_candidates == 1 and never.hyperparameters is None and never.params is None


@pytest.mark.slow  # 8 s of compiling; CI's slow set runs it, so make test stays under 5 min
def test_subsampled_search(user_config, user_data, two_devices):
  base = user_config.replace(sampling_prob=0.1)  # KK tuning needs q, not an expected batch size
  assert base.batch_size is None and base.num_steps == 10
  res = subsampled_search(base, GRID, user_data, subset=SubsetTuning(0.5, 1),
                          distribution=acc.Poisson(mean=2),
                          key=jax.random.key(3),
                          run_config=RunConfig(trainer=LocalTrainer(devices=two_devices,
                                                                    max_candidates_per_device=1)))
  m = int(res.unreleased.subset_mask.sum())
  assert 0 < m < USER_N
  # The declared sizes (from N and q alone), not the count drawn.
  assert res.subset_size == round(0.5 * USER_N) and res.final_train_size == USER_N - res.subset_size
  # keep_hparams (Adam is scale invariant): the final run uses the tuned values.
  assert res.learning_rate_factor == 1.0
  if res.tuned_hyperparameters is not None:
    assert res.hyperparameters == res.tuned_hyperparameters
  assert res.config.hparams["width"] == res.hyperparameters["width"] == _kernel_width(res.params)
  assert 0.0 <= res.score <= 1.0
  event = acc.SubsampledTuning(tune=acc.RepeatAndSelect(base.dp_event(), acc.Poisson(mean=2)),
                               final=base.dp_event(), q=0.5, variant=1)
  assert res.event == event and res.epsilon == acc.epsilon(event, 1e-5, "best")
  # The final run is the documented one: retrain it on X \ X1 with its key.
  final_key = jax.random.split(jax.random.key(3), 3)[2]
  rest = jax.tree.map(lambda leaf: leaf[~res.unreleased.subset_mask], user_data.train)
  again = train_candidate(res.config, type(user_data)(train=rest, test=user_data.test,
                                                            num_examples=res.final_train_size), final_key)
  _assert_same_params(again.params, res.params, rtol=0, atol=0)


def test_subsampled_search_refuses_batch_size(no_work, user_config, user_data):
  with pytest.raises(ValueError, match="subsampled_search needs sampling_prob, not batch_size"):
    subsampled_search(user_config, GRID, user_data, subset=SubsetTuning(0.5, 1), distribution=REPS,
                      key=jax.random.key(0))


def test_extrapolations(user_config, user_task):
  # The user task keeps its hyperparameters (keep_hparams) ...
  kept, factor = extrapolate(user_config, 100, 300)
  assert factor == 1.0 and kept.hparams == user_config.hparams
  # ... an SGD-type task scales the learning rate by n / m (KK Sec. 4) ...
  sgd = Task(model=user_task.model, loss=user_task.loss, score=user_task.score, optimizer=user_optimizer,
             extrapolate=scale_learning_rate(), name="sgd-like")
  scaled, factor = extrapolate(user_config.replace(task=sgd), 100, 300)
  assert factor == pytest.approx(3.0) and scaled.hparams["learning_rate"] == pytest.approx(0.15)
  assert scaled.hparams["weight_decay"] == 1e-4 and scaled.hparams["width"] == 8
  assert scaled.dp_event(USER_N) == user_config.dp_event(USER_N)
  # ... and a task without one is refused with the remedy.
  bare = Task(model=user_task.model, loss=user_task.loss, optimizer=user_optimizer, name="bare")
  with pytest.raises(ValueError, match="has no extrapolate.*scale_learning_rate.*keep_hparams"):
    extrapolate(user_config.replace(task=bare), 100, 300)
  assert isinstance(scaled, TrainConfig)
