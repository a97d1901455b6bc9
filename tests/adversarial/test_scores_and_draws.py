"""Adversarial scores, subsets and coins (issue 31): a released score that reads private data
(`NoisyMean`, a user's `DpScore` through selection) bounds every non-finite or huge value of the
added example instead of propagating it (before, one NaN made the score NaN with probability 1);
the subset of `subsampled_search` is drawn at a rate never above q (before: q rounded up to the
2^-23 grid), and an empty draw is an outcome, not an error; `threshold_search`'s stop coin is
never below its rate.
"""

import dataclasses
import math
import types

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdp import accounting as acc
from jaxdp.data import DataSplit, Dataset
from jaxdp.train.run_plan import plan_runs
from jaxdp.train import (DpScore, LoopOutput, LoopSpec, Model, NoisyMean, Task, TrainConfig,
                         init_params, train_candidate, trainer)
from jaxdp.train.sampling import sampling_threshold
from jaxdp.tuning import LocalTrainer, RunConfig, SubsetTuning, draws, subsampled, subsampled_search
from tests.adversarial.mlp_task import make_config


F32_MAX = float(np.finfo(np.float32).max)
SUBNORMAL = float(np.finfo(np.float32).smallest_subnormal)  # 1.4e-45

# The adversary's value v of the added example, and its share of the noisy
# sum, clip((v - mid) / half, -1, 1), for bounds [-1, 1] (mid 0, half 1):
# NaN counts as `low`; infinities and huge values as the nearer bound;
# subnormals as themselves (0 up to float32 rounding).
ADVERSARIAL = [("nan", float("nan"), -1.0), ("+inf", float("inf"), 1.0),
               ("-inf", float("-inf"), -1.0), ("3.4e38", 3.4e38, 1.0), ("-3.4e38", -3.4e38, -1.0),
               ("float32-max", F32_MAX, 1.0), ("subnormal", SUBNORMAL, 0.0),
               ("-subnormal", -SUBNORMAL, 0.0)]


def _identity(outputs, batch):
  return outputs


# ----------------------------------------------------- NoisyMean: the values


@pytest.mark.parametrize("value,share", [c[1:] for c in ADVERSARIAL], ids=[c[0] for c in ADVERSARIAL])
def test_noisy_mean_bounds_any_value_of_an_added_example(value, share):
  n = 100
  score = NoisyMean(_identity, -1.0, 1.0, 2.0, num_examples=n)
  d = jnp.asarray(np.linspace(-0.9, 0.9, n - 1), jnp.float32)
  d_plus = jnp.append(d, jnp.float32(value))
  for key in jax.random.split(jax.random.key(0), 5):
    base, other = float(score(d, None, key)), float(score(d_plus, None, key))
    assert math.isfinite(base) and math.isfinite(other), (base, other)
    # Same key, same noise: the scores differ by the example's share times half / n,
    # never by more than the sensitivity half / n = 0.01 (float32 rounding: 1e-6).
    assert other - base == pytest.approx(share * 1.0 / n, abs=1e-6)
    assert abs(other - base) <= 1.0 / n + 1e-6


def test_noisy_mean_nan_counts_as_low_and_infinities_as_the_bounds():
  score = NoisyMean(_identity, 0.0, 1.0, 1.0, num_examples=10)
  key = jax.random.key(1)
  values = jnp.array([0.25, np.nan, 0.75, np.inf, -np.inf, 0.5], jnp.float32)
  as_bounds = jnp.array([0.25, 0.0, 0.75, 1.0, 0.0, 0.5], jnp.float32)
  assert float(score(values, None, key)) == float(score(as_bounds, None, key))
  # Every example NaN: the score is the one of every example at `low`, plus noise.
  nans = jnp.full(10, jnp.nan, jnp.float32)
  assert float(score(nans, None, key)) == float(score(jnp.zeros(10, jnp.float32), None, key))


def test_noisy_mean_sum_never_overflows():
  # Bounds of 4e37: ten examples at the bound summed as values overflow float32
  # (4e38 > 3.4e38) and the score was inf with probability 1, for D and D + 1
  # alike; summed as shares in [-1, 1] they cannot.
  n = 10
  score = NoisyMean(_identity, -4e37, 4e37, 0.5, num_examples=n)
  key = jax.random.key(0)
  d = jnp.full(n, 4e37, jnp.float32)
  base = float(score(d, None, key))
  assert math.isfinite(base)
  for value in (4e37, 3.4e38, np.inf, np.nan):
    other = float(score(jnp.append(d, jnp.float32(value)), None, key))
    want = 4e37 / n * (-1.0 if np.isnan(value) else 1.0)
    assert other - base == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("fields,match", [
    (dict(low=-1e38), r"low must be in \[-4.25\d*e\+37, 4.25\d*e\+37\], got -1e\+38"),
    (dict(high=3.4e38), r"high must be in \[-4.25\d*e\+37, 4.25\d*e\+37\], got 3.4e\+38"),
    (dict(low=0.0, high=1e-40), r"NoisyMean needs \(high - low\) / 2 >= 1.17\d*e-38"),
])
def test_noisy_mean_refuses_bounds_its_float32_shares_cannot_hold(fields, match):
  kwargs = dict(fn=_identity, low=0.0, high=1.0, noise_multiplier=1.0, num_examples=10)
  kwargs.update(fields)
  with pytest.raises(ValueError, match=match):
    NoisyMean(**kwargs)


def test_noisy_mean_documents_its_guarantees():
  doc = " ".join(NoisyMean.__doc__.split())
  for fact in ("Guarantees:", "any float32 value", "a NaN value counts as `low`",
               "+inf, -inf and every other value outside [low, high] count as the nearer bound",
               "cannot overflow", "never propagated"):
    assert fact in doc, fact


# ----------------------------------------- NoisyMean through a trained candidate

# A logistic model on dict batches, logits (s, -s) with s = x . w + b and w
# starting at ones: an input of +-3.4e38 (finite, so `Dataset` takes it) makes
# s overflow to +-inf: the cross-entropy of logits (inf, -inf) is NaN.
LOGISTIC = Model(init=lambda key, x: {"w": jnp.ones(x.shape[-1]), "b": jnp.zeros(())},
                 apply=lambda params, x: jnp.stack([1.0, -1.0]) * (x @ params["w"] + params["b"])[:, None])


def _cross_entropy(outputs, batch):
  return optax.softmax_cross_entropy_with_integer_labels(outputs, batch["y"])


def _minus_cross_entropy(outputs, batch):
  return -_cross_entropy(outputs, batch)


def _sgd(hp):
  return optax.sgd(hp["learning_rate"])


VAL_N = 50
SCORED = Task(model=LOGISTIC, loss=_cross_entropy, optimizer=_sgd,
              score=NoisyMean(_minus_cross_entropy, -4.0, 0.0, 1.0, num_examples=VAL_N),
              name="adversarial-score")
CONFIG = TrainConfig(task=SCORED, l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=0.25, steps=5,
                     hparams=dict(learning_rate=0.1))


def _labelled(rng, n):
  x = rng.normal(size=(n, 3)).astype(np.float32)
  return {"x": x, "y": (x @ np.array([0.5, -0.3, 0.2]) > 0).astype(np.int32)}


@pytest.mark.slow  # a candidate program compiled: about 6 s (NoisyMean's own tests above run by default)
@pytest.mark.parametrize("x", [3.4e38, -3.4e38, F32_MAX], ids=["3.4e38", "-3.4e38", "float32-max"])
def test_trained_candidate_score_bounds_an_adversarial_validation_example(x):
  rng = np.random.default_rng(0)
  train, val = _labelled(rng, 40), _labelled(rng, VAL_N - 1)
  adversarial = {"x": np.full((1, 3), x, np.float32), "y": np.zeros(1, np.int32)}
  val_plus = {k: np.concatenate([val[k], adversarial[k]]) for k in val}
  key = jax.random.key(4)
  results = [train_candidate(CONFIG, Dataset(train=train, private_validation=v, num_examples=40), key)
             for v in (val, val_plus)]
  logits = LOGISTIC.apply(results[1].params, jnp.asarray(adversarial["x"]))
  # The adversary's value: NaN for +3.4e38 (logits (inf, -inf)), -inf for -3.4e38.
  assert not np.isfinite(float(_minus_cross_entropy(logits, adversarial)[0]))
  # Before: a NaN made the score NaN with probability 1, the candidate counted
  # as diverged and a search on D + this example released nothing.
  for r in results:
    assert not r.diverged and math.isfinite(r.score), r
  for a, b in zip(jax.tree.leaves(results[0].params), jax.tree.leaves(results[1].params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # same key, same training data
  # Same key, same noise: the added example counts as `low`, its share -1,
  # moving the score by -half / n = -2 / 50 (float32 rounding: 1e-5).
  assert results[1].score - results[0].score == pytest.approx(-2.0 / VAL_N, abs=1e-5)


# ------------------------------------- selection: a non-finite score is the worst


def test_selection_counts_a_non_finite_dp_score_as_the_worst(data):
  # A user's DpScore may return NaN or +-inf: the candidate then counts as
  # diverged (score NaN), and NaN ranks below every finite score. Which
  # candidate is released is a fixed function of the scores (post-processing).
  out = LoopOutput(params=None, steps=jnp.int32(5), finite=jnp.bool_(True))
  (run,) = plan_runs([make_config()], data)
  for bad in (float("nan"), float("inf"), float("-inf")):
    result = trainer.result_of(run, out, bad, 0.0, 0.0, 0.0)
    assert result.diverged and math.isnan(result.score)

  def scored(*scores):
    return [types.SimpleNamespace(score=s) for s in scores]
  nan = float("nan")
  assert draws.best_index(scored(0.5, nan, 0.7, -1e30)) == 2
  assert draws.best_index(scored(nan, -1e30)) == 1
  assert draws.best_index(scored(nan, nan)) is None
  assert draws.best_index(scored(-3.0, nan, -3.0)) == 0  # ties: the first
  # +-inf (a score that overflows in its own post-processing) is as bad as NaN, whatever its sign.
  inf = float("inf")
  assert draws.best_index(scored(inf, 0.5)) == 1
  assert draws.best_index(scored(-inf, nan)) is None
  assert draws.best_index(scored(-inf, -1e30, inf)) == 1


def test_the_threshold_coin_stops_at_least_at_the_accounted_rate():
  # threshold_search's bounds decrease in the stop probability: the coin must never stop less
  # often. It stops when 32 uniform bits are below ceil(p 2^32): a rate in [p, p + 2^-32).
  for p in (2.0 ** -33, 1e-7, 0.3, 0.5, 1.0 - 2.0 ** -40, 1.0):
    for seed in range(64):
      key = jax.random.key(seed)
      bits = int(jax.random.bits(key, dtype=jnp.uint32))
      assert draws.stops(key, p) == (bits < math.ceil(p * 2.0 ** 32))
    assert math.ceil(p * 2.0 ** 32) / 2.0 ** 32 >= p


def test_a_dp_score_that_returns_nan_is_never_selected():
  rng = np.random.default_rng(1)
  data = Dataset(train=_labelled(rng, 40), private_validation=_labelled(rng, 10), num_examples=40)
  score = DpScore(lambda outputs, batch, key: jnp.float32(jnp.nan) + 0.0 * jnp.sum(outputs),
                  dp_accounting.GaussianDpEvent(1.0))
  config = CONFIG.replace(task=dataclasses.replace(SCORED, score=score, name="nan-dp-score"))
  result = train_candidate(config, data, jax.random.key(0))
  assert result.diverged and math.isnan(result.score)
  assert draws.best_index([result]) is None


# -------------------------------------------------- subset draws: the rate


# (q, seed): seeds found by search for which the float32 Bernoulli sampler
# (`jax.random.bernoulli`, a uniform on the 2**-23 grid compared with q in
# float32) includes a row that the exact sampler does not: it realised
# 0.30000007 for q = 0.3, 1.19e-7 for q = 1e-7, 1e-9 and 2**-24.
RATE_CASES = [(0.3, 8), (1e-7, 9), (1e-9, 7), (2.0**-24, 9)]


def _subset_args(rows, q, variant=2):
  """What `_draw_subset` reads of `subsampled_search`'s checked arguments (the draw runs over
  the public row capacity, cut to the rows present: here both are `rows`)."""
  return types.SimpleNamespace(data=types.SimpleNamespace(num_train_rows=rows, row_capacity=rows),
                               subset=types.SimpleNamespace(q=q, variant=variant))


@pytest.mark.parametrize("q,seed", RATE_CASES, ids=[f"q={q:g}" for q, _ in RATE_CASES])
def test_subset_draw_is_the_exact_sampler(q, seed):
  rows = 2**22
  key = jax.random.key(seed)
  mask, final_mask = subsampled._draw_subset(_subset_args(rows, q), key)
  threshold = sampling_threshold(q)
  assert threshold == math.floor(q * 2**32) and threshold / 2**32 <= q
  # Row i is in X1 iff its 32 uniform bits are below floor(q 2**32): realised
  # rate threshold / 2**32 in (q - 2**-32, q], never above the accounted q.
  bits = np.asarray(jax.random.bits(key, (rows,), jnp.uint32))
  np.testing.assert_array_equal(mask, bits < threshold)
  assert final_mask.all()  # variant 2: the final run is on X
  # The float32 Bernoulli draw differs on this key: it samples above q.
  assert not np.array_equal(np.asarray(jax.random.bernoulli(key, q, (rows,))), bits < threshold)
  assert math.ceil(float(np.float32(q)) * 2**23) / 2**23 > q


def test_subset_rate_is_statistically_the_exact_one():
  rows, q = 2**22, 0.3
  mask, final_mask = subsampled._draw_subset(_subset_args(rows, q, variant=1), jax.random.key(0))
  p = sampling_threshold(q) / 2**32
  assert abs(mask.sum() - rows * p) < 5 * math.sqrt(rows * p * (1 - p))
  np.testing.assert_array_equal(final_mask, ~mask)


def test_subset_draws_nobody_below_two_to_the_minus_32():
  # q < 2**-32: threshold 0, no row is ever drawn (the float32 sampler drew
  # rows at 2**-23).
  mask, _ = subsampled._draw_subset(_subset_args(2**20, 1e-10), jax.random.key(7))
  assert not mask.any()


def _subset_key(seed):
  """The key `subsampled_search(key=jax.random.key(seed))` draws its subset with."""
  return jax.random.split(jax.random.key(seed), 3)[0]


@pytest.mark.parametrize("q,seed,variant,empty", [(0.03, 2, 1, "subset"), (0.03, 2, 2, "subset"),
                                                  (0.97, 0, 1, "final set")])
def test_an_empty_draw_is_returned_not_refused(q, seed, variant, empty):
  # 20 rows; the seeds draw no row into X1 (q = 0.03, probability 0.97^20 = 0.54)
  # or every row (q = 0.97, variant 1: no row left for the final run). Before:
  # ValueError after the draw, so whether the call failed depended on the draw.
  mask, final_mask = subsampled._draw_subset(_subset_args(20, q, variant), _subset_key(seed))
  assert not (mask if empty == "subset" else final_mask).any()
  np.testing.assert_array_equal(final_mask, ~mask if variant == 1 else np.ones(20, bool))


# ------------------------------------------- empty subsets: noise-only runs


SMALL_ROWS = 20
SUBSET_GRID = {"learning_rate": [0.3, 1.0]}


@pytest.fixture(scope="module")
def small(digits):
  """20 training rows of the digits (declared N = 20) and their public test split."""
  return Dataset(name="digits-20", train=DataSplit(digits.train.inputs[:SMALL_ROWS], digits.train.labels[:SMALL_ROWS]),
                 test=digits.test, num_examples=SMALL_ROWS, num_classes=digits.num_classes)


@pytest.fixture(scope="module")
def small_config(base_config):
  return base_config.replace(steps=5)


def _subset_search(config, data, devices, q, seed, variant=1):
  return subsampled_search(config, SUBSET_GRID, data, subset=SubsetTuning(q, variant),
                           distribution=acc.Poisson(mean=2),
                           key=jax.random.key(seed),
                           run_config=RunConfig(trainer=LocalTrainer(devices=devices,
                                                                     max_candidates_per_device=1)))


def _accounted(config, q, variant):
  event = config.dp_event()
  return acc.epsilon(acc.SubsampledTuning(tune=acc.RepeatAndSelect(event, acc.Poisson(mean=2)), final=event,
                                          q=q, variant=variant), 1e-5, "best")


@pytest.mark.slow  # a whole search (compiles for 0 and 19 rows): 5-10 s
def test_an_empty_tuning_subset_is_a_valid_outcome(small, small_config, two_devices):
  # q = 0.03 of 20 rows: m = round(0.6) = 1 is declared, and with key 2 no row
  # is drawn (probability 0.97^20 = 0.54). Before: ValueError after the draw.
  res = _subset_search(small_config, small, two_devices, q=0.03, seed=2)
  assert res.unreleased.subset_mask.shape == (SMALL_ROWS,) and not res.unreleased.subset_mask.any()
  assert res.subset_size == 1 and res.final_train_size == SMALL_ROWS - 1
  assert math.isfinite(res.epsilon) and res.epsilon == _accounted(small_config, 0.03, 1)
  assert res.unreleased.num_candidates >= 1 and res.tuned_hyperparameters is not None
  # The candidates trained on no row (noise only) still have a public test score.
  assert math.isfinite(res.tuned_score) and math.isfinite(res.score)
  assert res.learning_rate_factor == pytest.approx((SMALL_ROWS - 1) / 1)


@pytest.mark.slow  # a whole search (compiles for 19 and 0 rows): 5-10 s
def test_an_empty_final_set_is_a_valid_outcome_and_trains_on_noise_only(small, small_config, two_devices):
  # Variant 1, q = 0.97: m = 19, n = 1, and with key 0 every row is drawn into
  # X1 (probability 0.97^20 = 0.54): the final run is on no row.
  res = _subset_search(small_config, small, two_devices, q=0.97, seed=0)
  assert res.unreleased.subset_mask.all() and res.final_train_size == 1
  assert math.isfinite(res.epsilon) and res.epsilon == _accounted(small_config, 0.97, 1)
  assert math.isfinite(res.score)
  # The released model is the final run on zero rows, with the documented key.
  final_key = jax.random.split(jax.random.key(0), 3)[2]
  empty = subsampled._split(small, np.zeros(SMALL_ROWS, bool), "empty", 1)
  again = train_candidate(res.config, empty, final_key)
  for a, b in zip(jax.tree.leaves(again.params), jax.tree.leaves(res.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("clipping", [pytest.param("vmap", marks=pytest.mark.slow), "ghost"])  # slow: 3.5 s
def test_zero_rows_train_on_noise_only(small, small_config, clipping):
  config = small_config.replace(task=dataclasses.replace(small_config.task, clipping=clipping),
                                learning_rate=0.5)
  empty = subsampled._split(small, np.zeros(SMALL_ROWS, bool), "empty", 10)
  assert empty.num_train_rows == 0
  key = jax.random.key(5)
  init = init_params(LoopSpec.from_config(config, empty), jax.random.split(key)[0], empty.train)
  moved = []
  for sigma in (1.0, 2.0):
    result = train_candidate(config.replace(noise_multiplier=sigma), empty, key)
    assert not result.diverged and result.steps == 5
    moved.append([np.asarray(p, np.float64) - np.asarray(i, np.float64)
                  for p, i in zip(jax.tree.leaves(result.params), jax.tree.leaves(init))])
  # SGD on zero rows: each step sums no gradient, so the parameters move by the
  # noise alone, exactly proportional to sigma under the same key.
  for one, two in zip(*moved):
    assert np.abs(one).max() > 0
    np.testing.assert_allclose(two, 2.0 * one, rtol=1e-4, atol=1e-6)
