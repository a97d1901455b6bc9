"""Distributions of K: pmf/PGF consistency, mean<->gamma, sampling, utility helpers."""

import dataclasses
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


# --------------------------------------------------------------------------- value objects


def test_distributions_are_frozen_value_objects():
  assert acc.Poisson(10) == acc.Poisson(mean=10.0) and hash(acc.Poisson(10)) == hash(acc.Poisson(mean=10.0))
  assert acc.Binomial(20, 0.5) == acc.Binomial(n=20, p=0.5) != acc.Binomial(20, 0.4)
  assert acc.Fixed(3) == acc.Fixed(k=3) and acc.CappedGeometric(0.2, 6) == acc.CappedGeometric(0.2, 6)
  assert acc.TruncatedNegativeBinomial(0.5, mean=10) == acc.TruncatedNegativeBinomial(0.5, mean=10)
  assert len({acc.Poisson(10), acc.Poisson(10.0), acc.Geometric(mean=4), acc.Geometric(gamma=0.25)}) == 2
  for d in (acc.Poisson(10), acc.Geometric(mean=4), acc.Binomial(3, 0.5), acc.Fixed(2), acc.CappedGeometric(0.2, 6)):
    with pytest.raises(dataclasses.FrozenInstanceError):
      d.mean = 3.0  # pytype: disable=not-writable
  # Reprs rebuild the same distribution.
  for d in DISTS + [acc.CappedGeometric(0.2, 6), acc.TruncatedNegativeBinomial(-0.999, mean=5)]:
    assert eval(repr(d), vars(acc)) == d, repr(d)  # pylint: disable=eval-used


@pytest.mark.parametrize("d,shape", [
    (acc.Poisson(10), math.inf), (acc.Poisson(0.5), None), (acc.Geometric(mean=10), 1.0),
    (acc.Logarithmic(mean=10), 0.0), (acc.TruncatedNegativeBinomial(0.5, mean=10), 0.5),
    (acc.TruncatedNegativeBinomial(-0.5, mean=10), None), (acc.Binomial(20, 0.5), None),
    (acc.Fixed(3), None), (acc.CappedGeometric(0.2, 6), None),
], ids=lambda v: repr(v))
def test_dp_accounting_shape(d, shape):
  assert d.dp_accounting_shape() == shape


# --------------------------------------------------------------------------- sf


SF_DISTS = DISTS + [acc.CappedGeometric(0.2, 6), acc.Binomial(1000, 0.3), acc.Poisson(mean=200)]


@pytest.mark.parametrize("d", SF_DISTS, ids=[repr(d) for d in SF_DISTS])
def test_sf_is_an_accurate_upper_bound(d):
  k = _support(d, 20_000)
  p = d.pmf(k)
  for kk in (-1, 0, 1, 3, 10, 40, 150, 600):
    # The tail summed directly from the pmf (small terms first), not 1 - cdf.
    tail = min(1.0, p[k > kk][::-1].sum())
    got = d.sf(kk)
    assert got >= tail * (1 - 1e-13), (kk, got, tail)
    assert got <= tail * (1 + 1e-8) + 1e-14, (kk, got, tail)
  assert d.sf(-0.5) == 1.0
  if d.max_k is not None:
    assert d.sf(d.max_k) == 0.0


def test_sf_of_tiny_tails_is_not_cancelled():
  # 1 - cdf would give 0 here; the summed tail keeps the digits.
  assert acc.Poisson(10).sf(100) == pytest.approx(stats_poisson_sf(100, 10.0), rel=1e-10)
  tnb = acc.TruncatedNegativeBinomial(2.0, mean=4)
  ks = np.arange(301, 2000, dtype=np.float64)
  assert tnb.sf(300) == pytest.approx(tnb.pmf(ks)[::-1].sum(), rel=1e-8)
  assert 0 < tnb.sf(300) < 1e-50
  np.testing.assert_allclose(acc.Geometric(mean=10).sf(np.array([0, 5, 500])), [1.0, 0.9 ** 5, 0.9 ** 500],
                             rtol=1e-12)


def stats_poisson_sf(k, mu):
  from scipy import stats  # pylint: disable=g-import-not-at-top
  return float(stats.poisson.sf(k, mu))


# --------------------------------------------------------------------------- extreme parameters


EXTREME = [
    acc.TruncatedNegativeBinomial(-0.9, mean=40),      # gamma ~ 3e-17: 1 - gamma rounds to 1
    acc.Geometric(mean=1e17),
    acc.TruncatedNegativeBinomial(-0.5, mean=1e8),
    acc.TruncatedNegativeBinomial(-0.999, mean=5),     # gamma = e^-1610 underflows
    acc.TruncatedNegativeBinomial(0.5, mean=1e15),
]
#: pgf'(1) vs mean: the logs entering both reach |log gamma| (up to 1610), so
#: float64 leaves ~|log gamma| * 2^-52 relative error (3.6e-13 at 1610).
EXTREME_RTOL = 1e-12


@pytest.mark.timeout(30)
@pytest.mark.parametrize("d", EXTREME, ids=[repr(d) for d in EXTREME])
def test_extreme_parameters_construct_and_stay_accurate(d):
  assert math.isfinite(d.mean) and d.mean > 1
  assert math.isfinite(d.log_gamma) and d.log_gamma < 0
  assert float(d.pgf(0.0)) == 0.0
  assert float(d.pgf(1.0)) == pytest.approx(1.0, rel=1e-15)
  assert float(d.pgf_derivative(1.0)) == pytest.approx(d.mean, rel=EXTREME_RTOL)
  x = np.linspace(0.0, 1.0, 101)
  f, fp = d.pgf(x), d.pgf_derivative(x)
  assert np.all(np.isfinite(f)) and np.all(np.isfinite(fp))
  assert np.all(np.diff(f) >= 0) and np.all(np.diff(fp) >= 0)  # f, f' non-decreasing on [0, 1]
  # The series at x = 0.9 converges fast: the pmf and the closed form agree.
  k = np.arange(0, 4000, dtype=np.float64)
  p = d.pmf(k)
  assert (p * 0.9 ** k).sum() == pytest.approx(float(d.pgf(0.9)), rel=1e-9)
  # The pmf sums to one: the first 2e5 terms plus the tail, which lies between
  # the integrals of the (decreasing) pmf from N+1 and from N.
  n = 200_000
  head = d.pmf(np.arange(0, n + 1, dtype=np.float64))[::-1].sum()
  lo_tail, hi_tail = _tail_integral(d, n + 1), _tail_integral(d, n)
  assert head + lo_tail <= 1 + 1e-9 and head + hi_tail >= 1 - 1e-9
  # sf sums 2^18 terms past n, then bounds a power-law rest: O(2^-18) relative slack.
  assert lo_tail * (1 - 1e-6) <= d.sf(n) <= hi_tail * (1 + 1e-5) + d.pmf(n + 1)
  # Quantities the RDP bounds use (PS Thm 2: log(1/gamma), log E[K], P[K=1]).
  assert math.isfinite(-d.log_gamma) and math.isfinite(math.log(d.mean)) and d.pmf(1) > 0


def _tnb_logpmf_continuous(d, s):
  # (1-gamma)^s eta Gamma(s+eta) / ((gamma^-eta - 1) Gamma(1+eta) Gamma(s+1)), PS Def 1.
  from scipy import special  # pylint: disable=g-import-not-at-top
  log_norm = math.log(d.eta / math.expm1(-d.eta * d.log_gamma))
  a, b = d.eta, 1.0
  if s < 1e6:
    log_ratio = special.gammaln(s + a) - special.gammaln(s + b)
  else:  # the gammaln difference cancels; log G(s+a)/G(s+b) = (a-b) log s + (a-b)(a+b-1)/(2s) + O(s^-2)
    log_ratio = (a - b) * math.log(s) + (a - b) * (a + b - 1) / (2 * s)
  return s * math.log1p(-math.exp(d.log_gamma)) + log_norm + log_ratio - special.gammaln(1 + d.eta)


def _tail_integral(d, start):
  """int_start^inf of the pmf's continuous extension (s = start e^u)."""
  from scipy import integrate  # pylint: disable=g-import-not-at-top
  u_max = math.log(1e40 / start)
  fun = lambda u: math.exp(float(_tnb_logpmf_continuous(d, start * math.exp(u))) + u) * start
  val, _ = integrate.quad(fun, 0.0, u_max, limit=400, epsabs=0.0, epsrel=1e-10)
  return val


def test_tnb_mean_keeps_working_when_gamma_underflows():
  d = acc.TruncatedNegativeBinomial(-0.999, mean=5)
  assert d.gamma == 0.0 and d.log_gamma == pytest.approx(-1610.0, rel=1e-3)
  # Within 1e-10: the log-mean's terms are ~1610, so float64 resolves it to ~1e-12
  # and the bisection keeps a rounding margin on the larger-mean side.
  assert d.mean == pytest.approx(5.0, rel=1e-10) and d.mean >= 5.0
  assert acc.TruncatedNegativeBinomial(-0.999, log_gamma=d.log_gamma) == d


TNBS = [acc.Geometric(mean=10), acc.Geometric(mean=1e4), acc.Logarithmic(mean=30), acc.Logarithmic(mean=4e7),
        acc.TruncatedNegativeBinomial(0.5, mean=8), acc.TruncatedNegativeBinomial(0.5, mean=2.4e5),
        acc.TruncatedNegativeBinomial(-0.5, mean=5), acc.TruncatedNegativeBinomial(2.5, mean=3),
        acc.TruncatedNegativeBinomial(-0.999, mean=5)]  # gamma underflows: log_gamma carries it


@pytest.mark.parametrize("d", TNBS, ids=repr)
def test_pgf_or_nan_is_pgf_of_each_element_alone(d):
  # The vectorised PGF the composition bound uses: each element bit for bit
  # what a scalar call gives, NaN exactly where that call raises (divergence).
  x = np.concatenate([[0.0, 1e-300, 0.25, 0.5, 0.5000001, 0.999999, 1.0], 1.0 + np.geomspace(1e-16, 1e3, 40)])
  vals = d.pgf_or_nan(x)
  for xi, v in zip(x, vals):
    try:
      ref = float(d.pgf(float(xi)))
    except ValueError:
      assert math.isnan(v), (xi, v)
      continue
    assert v == ref or (math.isnan(v) and math.isnan(ref)), (xi, v, ref)
  assert np.isnan(vals).any() or d.eta > 0 and d.gamma > 0.5  # the grid reaches the divergent side


def test_tnb_from_mean_is_the_same_distribution_every_time():
  # Construction from a mean is memoised (bisection is ~4 ms); the memo must
  # give back exactly what it computed, for every member and mean.
  for eta, mean in [(1.0, 10.0), (0.0, 4.5e7), (0.5, 2.4e5), (-0.999, 5.0)]:
    a, b = acc.TruncatedNegativeBinomial(eta, mean=mean), acc.TruncatedNegativeBinomial(eta, mean=mean)
    assert a == b and a.log_gamma == b.log_gamma and a.mean >= mean
    assert acc.tnb_gamma_from_mean(eta, mean) == a.gamma
