"""The epsilon lower-bound estimator on mechanisms whose epsilon is known exactly."""

import math

import numpy as np
import pytest
from scipy import stats

from jaxdp.audit import estimate


def _randomized_response(rng, eps, n):
  p = math.exp(eps) / (1 + math.exp(eps))
  return (rng.random(n) >= p).astype(float), (rng.random(n) < p).astype(float)


def _laplace(rng, eps, n):
  return rng.laplace(0.0, 1.0 / eps, n), 1.0 + rng.laplace(0.0, 1.0 / eps, n)


@pytest.mark.parametrize("tests", [1, 6], ids=["one-test", "six-tests"])
@pytest.mark.parametrize("mechanism", [_randomized_response, _laplace], ids=["rr", "laplace"])
def test_lower_bound_exceeds_the_true_epsilon_rarely(mechanism, tests):
  # 200 seeded repetitions at 90% confidence: the bound may exceed the true
  # epsilon in at most 10% of them; Binomial(200, 0.1) exceeds 30 with
  # probability ~0.01, so 30 leaves room for chance, not for a wrong bound.
  # With six points of the tradeoff curve the union bound must keep that.
  eps, confidence = 1.0, 0.9
  above = 0
  for seed in range(200):
    without, with_ = mechanism(np.random.default_rng(seed), eps, 400)
    bound = estimate.epsilon_lower_bound(without, with_, delta=1e-6, confidence=confidence, tests=tests)
    assert bound.tests == tests
    above += bound.epsilon > eps
  assert above <= 30


def test_several_tests_read_several_points_of_the_tradeoff_curve():
  rng = np.random.default_rng(1)
  without, with_ = _laplace(rng, 2.0, 20_000)
  half = 10_000
  chosen = estimate._best_tests(without[:half], with_[:half], 1e-6, 0.05 / 8, 4)  # pylint: disable=protected-access
  assert len(chosen) == 4 and len(set(chosen)) == 4  # distinct (threshold, direction) tests
  one = estimate.epsilon_lower_bound(without, with_, delta=1e-6, tests=1)
  four = estimate.epsilon_lower_bound(without, with_, delta=1e-6, tests=4)
  assert 0 < four.epsilon <= 2.0 and 0 < one.epsilon <= 2.0
  # A union bound over 8 intervals costs at most what the 8x smaller alpha costs one test.
  assert estimate.max_certifiable(20_000, 20_000, 1e-6, 0.95, tests=4) < estimate.max_certifiable(
      20_000, 20_000, 1e-6, 0.95)


@pytest.mark.parametrize("mechanism,eps", [(_randomized_response, 1.0), (_randomized_response, 2.0),
                                           (_laplace, 1.0)], ids=["rr1", "rr2", "laplace1"])
def test_lower_bound_approaches_the_true_epsilon_as_trials_grow(mechanism, eps):
  rng = np.random.default_rng(0)
  bounds = [estimate.epsilon_lower_bound(*mechanism(rng, eps, n), delta=1e-6).epsilon
            for n in (300, 3000, 100_000)]
  assert bounds[0] <= bounds[1] <= bounds[2] <= eps
  assert bounds[2] > 0.9 * eps


def test_clopper_pearson_matches_the_beta_quantiles_and_covers():
  lo, hi = estimate.clopper_pearson(3, 20, 0.025)
  assert lo == pytest.approx(stats.beta.ppf(0.025, 3, 18), rel=1e-12)
  assert hi == pytest.approx(stats.beta.ppf(0.975, 4, 17), rel=1e-12)
  assert estimate.clopper_pearson(0, 20, 0.05) == (0.0, pytest.approx(1 - 0.05 ** (1 / 20)))
  assert estimate.clopper_pearson(20, 20, 0.05) == (pytest.approx(0.05 ** (1 / 20)), 1.0)
  # Exact coverage: for p = 0.3, n = 20 the one-sided 5% bounds miss p with
  # probability at most 5% (summed over the binomial law, not sampled).
  ks = np.arange(21)
  pmf = stats.binom.pmf(ks, 20, 0.3)
  miss_low = sum(pm for k, pm in zip(ks, pmf) if estimate.clopper_pearson(int(k), 20, 0.05)[0] > 0.3)
  miss_high = sum(pm for k, pm in zip(ks, pmf) if estimate.clopper_pearson(int(k), 20, 0.05)[1] < 0.3)
  assert miss_low <= 0.05 and miss_high <= 0.05


def test_identical_mechanisms_certify_nothing_and_perfect_separation_is_capped():
  rng = np.random.default_rng(1)
  same = estimate.epsilon_lower_bound(rng.normal(size=2000), rng.normal(size=2000), delta=1e-5)
  assert same.epsilon < 0.2
  # A non-private mechanism (outputs never overlap): the bound is the cap the
  # trial count allows, log of ~n / log(2/alpha), far above 0.
  perfect = estimate.epsilon_lower_bound(np.zeros(1000), np.ones(1000), delta=1e-5)
  cap = estimate.max_certifiable(1000, 1000, 1e-5, 0.95)
  assert perfect.epsilon == pytest.approx(cap) and cap > 4.0
  assert perfect.tpr == 1.0 and perfect.fpr == 0.0


@pytest.mark.parametrize("kwargs,match", [
    (dict(delta=0.0), "delta"), (dict(delta=1.0), "delta"), (dict(confidence=1.0), "confidence"),
    (dict(without=np.zeros((4, 2))), "without must be a 1-d array"),
    (dict(with_=[1.0, float("nan"), 2.0]), "with_ must be finite"),
    (dict(without=np.zeros(6), with_=np.ones(6), confidence=0.999), "too few"),
])
def test_bad_input(kwargs, match):
  args = dict(without=np.zeros(100), with_=np.ones(100), delta=1e-5)
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    estimate.epsilon_lower_bound(args.pop("without"), args.pop("with_"), **args)
