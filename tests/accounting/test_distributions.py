"""Distributions of K: pmf/PGF consistency, mean<->gamma, sampling, utility helpers."""

import math

import jax
import numpy as np
import pytest

from jaxdp import accounting as acc

DISTS = [
    acc.Poisson(mean=10),
    acc.Poisson(mean=0.3),
    acc.TruncatedNegativeBinomial(-0.5, mean=10),
    acc.TruncatedNegativeBinomial(0.5, mean=10),
    acc.TruncatedNegativeBinomial(2.0, mean=4),
    acc.Logarithmic(mean=10),
    acc.Geometric(mean=10),
    acc.Binomial(20, 0.5),
    acc.Binomial(3, 1.0),
    acc.Fixed(7),
]
IDS = [repr(d) for d in DISTS]


def _support(d, kmax=200_000):
  return np.arange(0, kmax + 1, dtype=np.float64)


@pytest.mark.parametrize("d", DISTS, ids=IDS)
def test_pmf_sums_to_one_and_matches_mean_and_pgf(d):
  k = _support(d)
  p = d.pmf(k)
  assert p.sum() == pytest.approx(1.0, abs=1e-9)
  assert (p * k).sum() == pytest.approx(d.mean, rel=1e-9)
  for x in (0.0, 0.3, 0.9, 1.0):
    assert (p * x**k).sum() == pytest.approx(float(d.pgf(x)), rel=1e-9, abs=1e-15)
    assert (p * k * np.where(k > 0, x ** np.maximum(k - 1, 0), 0)).sum() == pytest.approx(
        float(d.pgf_derivative(x)), rel=1e-8, abs=1e-15)
  assert d.prob_zero == pytest.approx(p[0], abs=1e-15)
  assert float(d.pgf_derivative(1.0)) == pytest.approx(d.mean, rel=1e-9)


@pytest.mark.parametrize("eta,gamma", [(-0.5, 0.00277008), (0.0, 0.02691826), (0.5, 0.0625), (1.0, 0.1)])
def test_tnb_gamma_for_mean_10_matches_reference(eta, gamma):
  # REFERENCE.md Sec. 2: E[K] = 10 <=> these gammas (given to 8 decimals).
  assert acc.TruncatedNegativeBinomial(eta, mean=10).gamma == pytest.approx(gamma, abs=1e-8)


@pytest.mark.parametrize("eta", [-0.9, -0.5, 0.0, 0.3, 1.0, 2.5, 10.0])
@pytest.mark.parametrize("mean", [1.001, 1.5, 10.0, 1234.5, 1e6])
def test_tnb_mean_gamma_round_trip_1e9(eta, mean):
  d = acc.TruncatedNegativeBinomial(eta, mean=mean)
  back = acc.TruncatedNegativeBinomial(eta, gamma=d.gamma).mean
  assert back == pytest.approx(mean, rel=1e-9)
  assert back >= mean * (1 - 1e-15)  # rounded towards the larger (conservative) mean


def test_closed_form_pgf_matches_small_gamma_limit():
  d = acc.TruncatedNegativeBinomial(0.5, gamma=1e-9)
  # f(x) ~ P[K=1] x for tiny x: the log1p formulation keeps it exact.
  assert float(d.pgf(1e-20)) == pytest.approx(d.pmf(1) * 1e-20, rel=1e-9)


# REFERENCE.md Sec. 9.3 (E[K] = 10).
@pytest.mark.parametrize("d,quantile", [
    (acc.Poisson(mean=10), 0.900005),
    (acc.TruncatedNegativeBinomial(-0.5, mean=10), 0.650000),
    (acc.Logarithmic(mean=10), 0.751034),
    (acc.TruncatedNegativeBinomial(0.5, mean=10), 0.800000),
    (acc.Geometric(mean=10), 0.826841),
    (acc.Binomial(20, 0.5), 0.904762),
], ids=["poisson", "eta-0.5", "log", "eta0.5", "geom", "binom"])
def test_expected_quantile_reference(d, quantile):
  assert acc.expected_quantile(d) == pytest.approx(quantile, abs=1e-6)


@pytest.mark.parametrize("d", DISTS, ids=IDS)
def test_expected_quantile_closed_form_equals_pmf_sum(d):
  k = _support(d)
  assert acc.expected_quantile(d) == pytest.approx((d.pmf(k) * k / (k + 1)).sum(), abs=1e-9)


@pytest.mark.parametrize("d,prob", [
    (acc.Poisson(mean=10), 0.095163),
    (acc.Geometric(mean=10), 0.091743),
    (acc.Logarithmic(mean=10), 0.085363),
    (acc.TruncatedNegativeBinomial(0.5, mean=10), 0.089994),
    (acc.Binomial(20, 0.5), 0.095390),
    (acc.Fixed(10), 0.095618),
], ids=["poisson", "geom", "log", "eta0.5", "binom", "fixed"])
def test_success_probability_reference(d, prob):
  assert acc.success_probability(d, 1 / 100) == pytest.approx(prob, abs=1e-6)


@pytest.mark.parametrize("d", DISTS, ids=IDS)
@pytest.mark.parametrize("k", [2, 10, 25, 60])
def test_tail_bound_is_a_bound_and_not_trivial(d, k):
  support = _support(d)
  exact = d.pmf(support)[support >= k].sum()
  bound = acc.tail_bound(d, k)
  assert bound >= exact - 1e-12
  if d.max_k is None and k >= 4 * d.mean:
    assert bound < 0.5  # the Chernoff bound must actually say something in the far tail


def test_poisson_tail_closed_form():
  mu, k = 10.0, 30
  assert acc.tail_bound(acc.Poisson(mu), k) == pytest.approx(math.exp(-mu) * (math.e * mu / k) ** k, rel=1e-12)
  assert acc.tail_bound(acc.Poisson(mu), 10.2) == pytest.approx(mu / 10.2)  # Markov wins near the mean


@pytest.mark.parametrize("d", DISTS, ids=IDS)
def test_sampling_matches_pmf(d):
  rng = np.random.default_rng(1234)
  n = 200_000
  draws = d.sample(rng, size=n)
  assert draws.shape == (n,)
  assert np.all(draws >= 0)
  # Compare frequencies of the first few values with the pmf: 6 standard errors.
  for k in range(0, 6):
    p = d.pmf(k)
    se = math.sqrt(max(p * (1 - p), 1e-12) / n)
    assert np.mean(draws == k) == pytest.approx(p, abs=6 * se + 1e-12)
  if d.max_k is not None or not isinstance(d, acc.TruncatedNegativeBinomial) or d.eta > 0:
    sd = math.sqrt((d.pmf(_support(d)) * (_support(d) - d.mean) ** 2).sum())
    assert draws.mean() == pytest.approx(d.mean, abs=6 * sd / math.sqrt(n))


def test_sampling_accepts_jax_key_and_is_reproducible():
  d = acc.TruncatedNegativeBinomial(-0.5, mean=10)
  a = d.sample(jax.random.key(3), size=50)
  b = d.sample(jax.random.key(3), size=50)
  c = d.sample(jax.random.key(4), size=50)
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
  assert isinstance(acc.Poisson(3).sample(np.random.default_rng(0)), (int, np.integer))


def test_named_members_of_the_tnb_family():
  assert acc.Geometric(mean=4).eta == 1.0 and acc.Geometric(mean=4).gamma == 0.25
  assert acc.Logarithmic(mean=10).eta == 0.0
  assert acc.Geometric(mean=4) == acc.TruncatedNegativeBinomial(1.0, gamma=0.25)
