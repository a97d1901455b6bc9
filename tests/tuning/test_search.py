"""Private tuners release only what the guarantee covers."""

import dataclasses
import math
import warnings

import jax
import pytest

from jaxdp import accounting as acc
from jaxdp.tuning import random_search, threshold_search

GRID = {"learning_rate": [0.3, 1.0, 3.0]}


def test_random_search_releases_only_the_selected_candidate(digits, base_config, two_devices):
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # no warning unless scores are requested
    res = random_search(base_config, GRID, digits, repetitions=acc.Poisson(mean=4),
                        key=jax.random.key(5), devices=two_devices)
  assert res.all_scores is None
  assert res.num_candidates >= 1 and res.hyperparameters["learning_rate"] in GRID["learning_rate"]
  assert 0.5 < res.score <= 1.0 and res.params is not None
  assert res.config.learning_rate == res.hyperparameters["learning_rate"]
  event = acc.RepeatAndSelect(base_config.dp_event(), acc.Poisson(mean=4))
  assert res.epsilon == acc.epsilon(event, 1e-5, method="best")
  assert res.epsilon > acc.epsilon(base_config.dp_event(), 1e-5)


def test_same_key_same_result_and_scores_are_opt_in(digits, base_config, two_devices):
  kwargs = dict(repetitions=acc.Geometric(mean=3), key=jax.random.key(9), devices=two_devices)
  a = random_search(base_config, GRID, digits, **kwargs)
  with pytest.warns(UserWarning, match="NOT covered"):
    b = random_search(base_config, GRID, digits, release_all_scores=True, **kwargs)
  assert a.hyperparameters == b.hyperparameters and a.score == b.score and a.num_candidates == b.num_candidates
  assert len(b.all_scores) == b.num_candidates
  assert max(s for _, s in b.all_scores) == b.score


def test_k_zero_releases_the_default(digits, base_config):
  res = random_search(base_config, GRID, digits, repetitions=acc.Poisson(mean=1e-9), key=jax.random.key(0))
  assert res.num_candidates == 0 and res.hyperparameters is None and res.params is None
  assert math.isnan(res.score) and res.epsilon >= 0


def test_privacy_changing_hyperparameters_are_accounted_by_the_worst_candidate(digits, base_config):
  grid = {"noise_multiplier": [0.8, 2.0]}
  res = random_search(base_config, grid, digits, repetitions=acc.Poisson(mean=2), key=jax.random.key(1))
  weakest = dataclasses.replace(base_config, noise_multiplier=0.8).dp_event()
  assert res.epsilon == pytest.approx(
      acc.epsilon(acc.RepeatAndSelect(weakest, acc.Poisson(mean=2)), 1e-5, "best"), rel=1e-9)


def test_threshold_search(digits, base_config):
  easy = threshold_search(base_config, GRID, digits, threshold=0.0, stop_prob=0.5, key=jax.random.key(2))
  assert easy.num_candidates == 1 and easy.hyperparameters is not None
  never = threshold_search(base_config, GRID, digits, threshold=2.0, stop_prob=1.0, key=jax.random.key(2))
  assert never.num_candidates == 1 and never.hyperparameters is None
  capped = threshold_search(base_config, GRID, digits, threshold=2.0, stop_prob=0.01, max_candidates=2,
                            key=jax.random.key(2))
  assert capped.num_candidates == 2 and capped.hyperparameters is None
  assert capped.epsilon == acc.epsilon(acc.ThresholdSelect(base_config.dp_event(), 0.01, 2), 1e-5)


@pytest.mark.parametrize("kwargs,match", [
    (dict(key=0), "key must be a typed PRNG key"),
    (dict(repetitions=10), "distribution"),
    (dict(delta=0.0), "delta"),
])
def test_bad_arguments(digits, base_config, kwargs, match):
  args = dict(repetitions=acc.Poisson(2), key=jax.random.key(0))
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    random_search(base_config, GRID, digits, **args)
