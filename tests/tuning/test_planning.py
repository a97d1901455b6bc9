"""Planning a search before it trains: accounting by candidate, score modes, target epsilon, dry runs,
and bad input caught before K is drawn (issue 12), on the user task of tests/conftest.py."""

import math

import dp_accounting
import jax
import numpy as np
import pytest
from scipy import stats

from jaxdp import accounting as acc
from jaxdp.data import Dataset
from jaxdp.sweep import SearchSpace, build_plan
from jaxdp.sweep.plan import candidate_event
from jaxdp.train import NoisyMean, microbatching, program, trainer
from jaxdp.train.sampling import default_padded_batch_size
from jaxdp.tuning import (dry_run, LocalTrainer, random_search, RunConfig,
                          subsampled_search, SubsetTuning, threshold_search)

from tests.conftest import SEARCH_GRID
from tests.conftest import USER_N, make_user_task, user_correct

PUBLIC, PRIVATE = trainer.PUBLIC_SOURCE, trainer.PRIVATE_SOURCE
REPS = acc.Poisson(mean=3)
LR = {"learning_rate": [0.02, 0.1]}
DELTA = 1e-5
SCORE_SIGMA = 2.0


@pytest.fixture(scope="module")
def dp_task():
  """The user task scored by a NoisyMean of its accuracy on the private validation split."""
  return make_user_task(score=NoisyMean(user_correct, low=0.0, high=1.0, noise_multiplier=SCORE_SIGMA,
                                       num_examples=100),
                        name="user-mlp-dp-score")


@pytest.fixture(scope="module")
def dp_config(user_config, dp_task):
  return user_config.replace(task=dp_task)


def _events(config, grid):
  return [c.dp_event(USER_N) for c in SearchSpace(config, grid).configs]


# --- Candidates that differ in privacy are accounted as UniformCandidates. ---


def test_privacy_changing_grid_is_accounted_as_uniform_candidates(no_work, user_config, user_data):
  grid = {"noise_multiplier": [0.8, 2.0], "batch_size": [10, 20], "l2_clip_norm": [0.5, 1.0], **LR}
  plan = dry_run(user_config, grid, user_data, distribution=REPS)
  event = plan.event
  assert isinstance(event, acc.RepeatAndSelect) and event.distribution == REPS
  assert isinstance(event.base, acc.UniformCandidates)
  # One event per distinct (sigma, q); C and the learning rate change none.
  distinct = []
  for e in _events(user_config, grid):
    if e not in distinct:
      distinct.append(e)
  assert len(distinct) == 4 and list(event.base.candidates) == distinct
  assert plan.epsilon == acc.epsilon(acc.RepeatAndSelect(acc.UniformCandidates(distinct), REPS), DELTA, "best")
  # A grid that changes no candidate's privacy keeps the plain event.
  plain = dry_run(user_config, {"l2_clip_norm": [0.5, 1.0], **LR}, user_data, distribution=REPS).event
  assert plain == acc.RepeatAndSelect(user_config.dp_event(USER_N), REPS)


def test_random_search_accounts_uniform_candidates_with_no_candidate_trained(user_config, user_data):
  # K = 0 for this key (nothing trains), yet the event is the grid's.
  grid = {"noise_multiplier": [0.8, 2.0], **LR}
  res = random_search(user_config, grid, user_data, distribution=acc.Poisson(mean=1e-9),
                      key=jax.random.key(0))
  assert res.unreleased.num_candidates == 0 and res.hyperparameters is None
  assert res.event.base == acc.UniformCandidates([user_config.replace(noise_multiplier=s).dp_event(USER_N)
                                                  for s in (0.8, 2.0)])
  assert res.score_source == PUBLIC


# --- Score modes. ---


def test_public_score_is_reported_as_public(no_work, user_config, user_data):
  plan = dry_run(user_config, LR, user_data, distribution=REPS)
  assert plan.score_source == PUBLIC and "score: public test split (not accounted)" in str(plan)
  assert plan.event.base == user_config.dp_event(USER_N)  # nothing composed for a public score


def test_dp_score_event_is_composed_into_each_candidate(no_work, user_config, dp_config, user_data):
  # The candidate events a search accounts (no accounting here: a selection over a
  # composed event takes the "best" accountant ~20 s; the search below pays it once).
  score_event = dp_accounting.GaussianDpEvent(SCORE_SIGMA)
  one = candidate_event(build_plan(dp_config, LR, user_data))
  assert one == dp_accounting.ComposedDpEvent([user_config.dp_event(USER_N), score_event])
  # With candidates that differ in privacy, each candidate carries exactly one score event.
  varied = candidate_event(build_plan(dp_config, {"noise_multiplier": [0.8, 2.0]}, user_data))
  assert isinstance(varied, acc.UniformCandidates)
  assert list(varied.candidates) == [
      dp_accounting.ComposedDpEvent([user_config.replace(noise_multiplier=s).dp_event(USER_N), score_event])
      for s in (0.8, 2.0)]
  assert candidate_event(build_plan(user_config, LR, user_data)) == user_config.dp_event(USER_N)


def test_dp_score_reads_the_private_validation_split(dp_config, dp_task, user_config, user_data):
  key = jax.random.key(7)
  res = trainer.train_candidate(dp_config, user_data, key)
  assert res.score_source == PRIVATE and not res.diverged
  # The released score is the NoisyMean of the trained model on private_validation,
  # with the candidate's score key; test_score is the public split's accuracy.
  val = user_data.private_validation
  model = dp_task.model_for(dp_config.hparams)
  expected = dp_task.score(model.apply(res.params, val["x"]), val, program.score_key(key))
  assert res.score == pytest.approx(float(expected), abs=1e-6)
  test = user_data.test
  # With a DP selection score, the public test score is minus the mean test loss.
  from tests.conftest import user_loss  # pylint: disable=g-import-not-at-top
  assert res.test_score == -res.test_loss
  assert res.test_loss == pytest.approx(float(user_loss(model.apply(res.params, test["x"]), test).mean()),
                                        rel=1e-5)
  assert res.score != res.test_score
  assert res.epsilon == dp_config.epsilon(USER_N) > user_config.epsilon(USER_N)


@pytest.mark.slow  # a whole search (7 s); CI's slow set runs it, so make test stays under 5 min
def test_random_search_with_a_dp_score(dp_config, user_config, user_data, two_devices):
  reps = acc.Poisson(mean=2)
  res = random_search(dp_config, LR, user_data, distribution=reps, key=jax.random.key(4),
                      run_config=RunConfig(trainer=LocalTrainer(devices=two_devices,
                                                                max_candidates_per_device=1)))
  assert res.unreleased.num_candidates >= 1 and res.hyperparameters is not None
  assert res.score_source == PRIVATE
  assert 0.3 < res.score < 1.2  # an accuracy plus Gaussian noise of std 2 * 0.5 / 100
  # The search's event: each candidate is its training composed with exactly one score event.
  composed = dp_accounting.ComposedDpEvent([user_config.dp_event(USER_N),
                                            dp_accounting.GaussianDpEvent(SCORE_SIGMA)])
  assert res.event == acc.RepeatAndSelect(composed, reps)  # (accounting it again would cost ~20 s)
  assert res.epsilon > acc.epsilon(acc.RepeatAndSelect(user_config.dp_event(USER_N), reps), DELTA, "best")


def _tune(tuner, config, grid, data, **kw):
  key = jax.random.key(0)
  if tuner is random_search:
    return random_search(config, grid, data, distribution=REPS, key=key, **kw)
  if tuner is threshold_search:
    return threshold_search(config, grid, data, threshold=0.5, distribution=acc.Geometric(gamma=0.5),
                            key=key, **kw)
  if tuner is dry_run:
    return dry_run(config, grid, data, distribution=REPS, **kw)
  return subsampled_search(config, grid, data, subset=SubsetTuning(0.5, 1), distribution=REPS, key=key,
                           **kw)


TUNERS = [random_search, threshold_search, dry_run, subsampled_search]
TUNER_IDS = [t.__name__ for t in TUNERS]


def test_subsampled_search_refuses_dp_scores(no_work, dp_config, user_data):
  with pytest.raises(ValueError, match="subsampled_search does not support DP scores"):
    _tune(subsampled_search, dp_config.replace(sampling_prob=0.1), LR, user_data)


@pytest.mark.parametrize("tuner", TUNERS, ids=TUNER_IDS)
def test_missing_score_split_raises_before_any_work(no_work, tuner, user_config, dp_config, user_data):
  base = user_config.replace(sampling_prob=0.1)
  no_test = Dataset(train=user_data.train, private_validation=user_data.private_validation,
                    num_examples=USER_N)
  with pytest.raises(ValueError, match="scores on the public test split, but data.test is None"):
    _tune(tuner, base, LR, no_test)
  if tuner is not subsampled_search:  # which refuses DP scores altogether
    no_validation = Dataset(train=user_data.train, test=user_data.test, num_examples=USER_N)
    with pytest.raises(ValueError, match="reads data.private_validation, but it is None"):
      _tune(tuner, dp_config, LR, no_validation)


# --- target_epsilon: sigma calibrated for the whole search, re-accounted. ---

TARGET = 2.0


@pytest.mark.parametrize("tuner", [random_search, threshold_search, dry_run], ids=lambda t: t.__name__)
def test_target_epsilon_grid_must_not_vary_sigma(no_work, tuner, user_config, user_data):
  with pytest.raises(ValueError, match="remove 'noise_multiplier' from the grid"):
    _tune(tuner, user_config, {"noise_multiplier": [0.8, 2.0]}, user_data, target_epsilon=TARGET)


@pytest.mark.parametrize("target", [0.0, -1.0, float("nan"), "2"])
def test_bad_target_epsilon(no_work, user_config, user_data, target):
  with pytest.raises(ValueError, match="target_epsilon"):
    _tune(random_search, user_config, LR, user_data, target_epsilon=target)


@pytest.mark.parametrize("tuner", [random_search, threshold_search, dry_run], ids=lambda t: t.__name__)
def test_unreachable_target_raises_before_any_work(no_work, tuner, user_config, user_data):
  # Even sigma = 1e3 (the largest tried) leaves epsilon ~1e-3 for this search.
  with pytest.raises(ValueError, match=r"epsilon=0.0001 is out of reach for this search: even "
                                       r"noise_multiplier=1000.0 does not meet it"):
    _tune(tuner, user_config, LR, user_data, target_epsilon=1e-4)


@pytest.fixture(scope="module")
def calibrated_plan(user_config, user_data):
  return dry_run(user_config, {"batch_size": [10, 20], **LR}, user_data, distribution=REPS,
                 target_epsilon=TARGET)


def test_target_epsilon_calibrates_sigma(calibrated_plan, user_config):
  plan = calibrated_plan
  sigma = plan.noise_multiplier
  assert sigma is not None and 0.1 < sigma < 100
  # Re-accounted from the calibrated configurations, not from the target.
  events = [user_config.replace(noise_multiplier=sigma, batch_size=b).dp_event(USER_N) for b in (10, 20)]
  assert plan.event == acc.RepeatAndSelect(acc.UniformCandidates(events), REPS)
  eps = acc.epsilon(plan.event, DELTA, "best")
  assert eps == plan.epsilon
  assert 0.99 * TARGET <= eps <= TARGET
  assert f"calibrated sigma={sigma:.4f}" in str(plan)


@pytest.mark.slow  # a whole search (7 s); CI's slow set runs it, so make test stays under 5 min
def test_random_search_meets_the_target(calibrated_plan, user_config, user_data, two_devices):
  grid = {"batch_size": [10, 20], **LR}
  res = random_search(user_config, grid, user_data, distribution=REPS, key=jax.random.key(1),
                      target_epsilon=TARGET,
                      run_config=RunConfig(trainer=LocalTrainer(devices=two_devices,
                                                                max_candidates_per_device=1)))
  assert res.noise_multiplier == calibrated_plan.noise_multiplier
  assert acc.epsilon(res.event, DELTA, "best") <= TARGET
  assert res.epsilon == calibrated_plan.epsilon and res.event == calibrated_plan.event
  assert res.unreleased.num_candidates >= 1 and res.config.noise_multiplier == res.noise_multiplier


def test_threshold_search_meets_the_target(user_config, user_data, two_devices):
  # Liu-Talwar selection has no RDP theorem: the calibration must not need one.
  res = threshold_search(user_config, LR, user_data, threshold=0.0,
                         distribution=acc.Geometric(gamma=0.5), key=jax.random.key(1),
                         target_epsilon=TARGET,
                         run_config=RunConfig(trainer=LocalTrainer(devices=two_devices,
                                                                   max_candidates_per_device=1)))
  sigma = res.noise_multiplier
  assert res.event == acc.ThresholdSelect(user_config.replace(noise_multiplier=sigma).dp_event(USER_N), 0.5)
  assert 0.99 * TARGET <= res.epsilon == acc.epsilon(res.event, DELTA, "best") <= TARGET
  assert res.unreleased.num_candidates == 1 and res.config.noise_multiplier == sigma


# --- dry_run: what a search would do, without training. ---


def test_dry_run_epsilon_equals_random_searchs(no_work, tiny_random_search, digits, base_config):
  searched, _ = tiny_random_search  # tests/conftest.py: same arguments, really trained
  plan = dry_run(base_config, SEARCH_GRID, digits, distribution=acc.Poisson(mean=4))
  assert plan.epsilon == searched.epsilon and plan.event == searched.event
  assert plan.score_source == searched.score_source == PUBLIC


def test_dry_run_groups_and_compute(no_work, user_config, user_data):
  grid = {"width": [4, 8], "batch_size": [10, 20], "epochs": [1, 2], "learning_rate": [0.02, 0.1, 0.5]}
  plan = dry_run(user_config, grid, user_data, distribution=REPS)
  groups = plan.groups
  assert len(groups) == 8 and all(g.grid_points == 3 for g in groups)
  seen = set()
  for g in groups:
    b = round(g.sampling_prob * USER_N)
    epochs = g.steps * b / USER_N
    seen.add((g.static["width"], b, epochs))
    assert g.traced == ("learning_rate", "weight_decay")
    assert g.steps == math.ceil(epochs * USER_N / b)
    # The padded batch rounded up to a multiple of the microbatch (`poisson_microbatch_size`).
    assert g.padded_batch_size == default_padded_batch_size(USER_N, g.sampling_prob, g.microbatch_size)
  assert seen == {(w, b, e) for w in (4, 8) for b in (10, 20) for e in (1, 2)}
  # E[K] x mean over the grid of (steps, steps x q N): steps 20/40 (b = 10) and 10/20 (b = 20).
  assert plan.expected_candidates == 3.0
  assert plan.expected_steps == pytest.approx(3 * np.mean([20, 40, 10, 20]))
  assert plan.expected_gradient_evaluations == pytest.approx(3 * np.mean([200, 400, 200, 400]))
  assert plan.prob_zero == pytest.approx(math.exp(-3))
  assert plan.k_quantiles == tuple(int(stats.poisson.ppf(p, 3)) for p in (0.5, 0.9, 0.99))
  assert plan.noise_multiplier is None
  assert plan.epsilon == acc.epsilon(plan.event, DELTA, "best")
  text = str(plan)
  assert text.startswith(f"private random search: epsilon={acc.format_epsilon(plan.epsilon)} at delta=1e-05")
  assert "8 compiled group(s):" in text and "E[K]=3" in text and "E[per-example gradients]=900" in text
  assert text.count("3 grid point(s), static {'width': ") == 8
  # Task(clipping="auto") by default: each group names every parameter's path and why.
  for g in groups:
    assert [(param, path) for param, path, _ in g.clipping] == [
        (f"params/{layer}/{leaf}", "ghost") for layer in ("hidden", "out") for leaf in ("bias", "kernel")]
    # This small model's microbatch holds almost every realised batch whole.
    assert microbatching.expected_microbatches(USER_N, g.sampling_prob, g.microbatch_size) < 1.01
  # The summary collapses them by kind; format(verbose=True) names each, after every summary.
  assert text.count("    clipping: ghost norms: 4 leaves") == 8 and "    clipping params/" not in text
  detail = plan.format(verbose=True)
  assert detail.startswith(text + "\n")
  assert detail.count("    clipping params/hidden/kernel: ghost (Dense 'hidden')") == 8
  # What splits the groups, and why each such hyperparameter is static.
  assert all(dict(g.static_reasons) == {"width": "the model factory reads it: it builds the model "
                                                 "(its layers, parameter shapes)"} for g in groups)
  assert text.count("compiled separately:") == 4  # width, steps, padded batch and microbatch
  assert "  compiled separately: one program per value of 'width': the model factory reads it" in text
  assert "one program per number of DP steps" in text and "one program per padded batch size" in text
  one = str(dry_run(user_config, {"learning_rate": [0.02, 0.1]}, user_data, distribution=REPS))
  assert "1 compiled group(s):" in one and "compiled separately" not in one


@pytest.mark.slow  # two more dry runs (the default's layers are checked in the test above)
def test_dry_run_names_the_forced_clipping_path(no_work, user_config, user_data):
  import dataclasses  # pylint: disable=g-import-not-at-top
  vmap = user_config.replace(task=dataclasses.replace(user_config.task, clipping="vmap"))
  assert {(path, why) for _, path, why in dry_run(vmap, LR, user_data,
                                                  distribution=REPS).groups[0].clipping} == {
      ("per-example", "Task(clipping='vmap')")}
  ghost = user_config.replace(task=dataclasses.replace(user_config.task, clipping="ghost"))
  assert [path for _, path, _ in dry_run(ghost, LR, user_data,
                                         distribution=REPS).groups[0].clipping] == [
      "ghost"] * 4


# --- Bad input is refused by every tuner before K is drawn or anything trains. ---


def _optimizer_by_name(hp):
  import optax  # pylint: disable=g-import-not-at-top
  return {"adamw": optax.adamw, "sgd": optax.sgd}[hp["opt"]](hp["learning_rate"])


def _per_example_score(outputs, batch):
  return user_correct(outputs, batch)  # (n,), not a scalar


def _mean_loss(outputs, batch):
  from tests.conftest import user_loss  # pylint: disable=g-import-not-at-top
  return user_loss(outputs, batch).mean()  # not one value per example


BAD = [
    ("optimizer_fails_for_one_value",
     lambda c: c.replace(task=make_user_task(optimizer=_optimizer_by_name), hparams=dict(
         learning_rate=0.05, width=8, opt="adamw")), {"opt": ["adamw", "lion"]},
     r"grid point \{'opt': 'lion'\}: task 'user-mlp': the optimizer factory fails .*KeyError: 'lion'"),
    ("grid_name_not_read", lambda c: c, {"dropout": [0.1]},
     r"hyperparameter\(s\) \['dropout'\] are not read by task 'user-mlp'"),
    ("score_not_scalar", lambda c: c.replace(task=make_user_task(score=_per_example_score)), LR,
     r"task 'user-mlp': the score must return a scalar, got \(100,\)"),
    ("loss_not_per_example", lambda c: c.replace(task=make_user_task(loss=_mean_loss)), LR,
     r"the loss must return one value per example"),
]


@pytest.mark.parametrize("tuner", TUNERS, ids=TUNER_IDS)
@pytest.mark.parametrize("make,grid,match", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_task_or_grid_is_refused_before_k_is_drawn(no_work, tuner, user_config, user_data, make, grid,
                                                       match):
  config = make(user_config.replace(sampling_prob=0.1))
  with pytest.raises(ValueError, match=match):
    _tune(tuner, config, grid, user_data)


@pytest.mark.parametrize("tuner", TUNERS, ids=TUNER_IDS)
def test_data_leaves_disagreeing_on_n_are_refused(no_work, tuner, user_config, user_data):
  bad_train = dict(user_data.train, y=user_data.train["y"][:-1])
  match = r"the leaves of train disagree on N.*\['x'\]: 200, train\['y'\]: 199"
  with pytest.raises(ValueError, match=match):
    Dataset(train=bad_train, test=user_data.test, num_examples=USER_N)
  # A Dataset damaged after its checks is refused by the tuner all the same.
  damaged = Dataset(train=dict(user_data.train), test=user_data.test, num_examples=USER_N)
  object.__setattr__(damaged, "train", bad_train)
  with pytest.raises(ValueError, match=match):
    _tune(tuner, user_config.replace(sampling_prob=0.1), LR, damaged)


def test_an_unreachable_target_names_the_dp_score_that_spends_it(no_work, dp_config, user_data):
  # The case: a NoisyMean with sigma 2 composed into K ~ Poisson(3) candidates costs
  # more than epsilon = 2 by itself; fewer steps or more training noise cannot help.
  fixed = acc.epsilon(acc.RepeatAndSelect(dp_config.task.score_event, REPS), DELTA, "best")
  assert fixed > TARGET
  with pytest.raises(ValueError) as info:
    _tune(random_search, dp_config, LR, user_data, target_epsilon=TARGET)
  message = str(info.value)
  assert "epsilon=2.0 is out of reach for this search" in message
  assert "the DP score (Gaussian(sigma=2" in message
  assert f"alone costs epsilon={acc.format_epsilon(fixed, '.4g')} at this delta" in message
  assert "fewer steps cannot help" in message and "Raise the score's noise_multiplier" in message


def test_an_unreachable_target_without_a_dp_score_says_training_is_all_of_it(no_work, user_config,
                                                                            user_data):
  with pytest.raises(ValueError, match=r"it gives epsilon=[0-9.e-]+\)\. Every part of this search's "
                                       r"event is DP-SGD training, whose cost falls with sigma"):
    _tune(random_search, user_config, LR, user_data, target_epsilon=1e-4)
