"""The selection gadget's exact privacy profile (`jaxdp.audit.exact`) against independent computations."""

import math

import mpmath
import numpy as np
import pytest
from scipy import integrate, special, stats

from jaxdp import accounting as acc
from jaxdp.audit import exact
from jaxdp.audit.exact import GadgetProfile
from jaxdp.train.noise import round_up_float32

from tests import exact_release

DELTA = 1e-5
SIGMA = 0.5
# The geometric and logarithmic laws (their accounting takes a second each) run in the slow set.
LAWS = [acc.Poisson(mean=4), pytest.param(acc.Geometric(mean=4), marks=pytest.mark.slow),
        pytest.param(acc.Logarithmic(mean=4), marks=pytest.mark.slow), acc.Fixed(4)]


def test_one_candidate_is_a_gaussian_mechanism_on_half_the_draws():
  # K = 1: the arm is public, the sensitive arm (probability 1/2) is N(1, s^2) against N(0, s^2),
  # so delta(eps) = delta_gauss(eps) / 2 and epsilon(1e-5) is the Gaussian's at 2e-5.
  sigma = round_up_float32(SIGMA)
  lo, hi = GadgetProfile(SIGMA, acc.Fixed(1)).epsilon(DELTA)
  want = exact_release.epsilon(0.0, sigma, 1.0, sigma, 2 * DELTA)
  # Each end is a bisection stopped at relative 1e-9 of epsilon ~ 10 (the reference's at 1e-12).
  assert lo <= want + 1e-7 and want <= hi + 1e-7
  assert hi - lo < 1e-3  # the stated numerical error of the default grid


def _delta_by_quadrature(sigma, dist, eps, arms=2, forward=True):
  """delta_{D'||D}(eps) (forward) or delta_{D||D'}(eps) by adaptive quadrature of the release density."""
  p1 = 1.0 - 1.0 / arms
  f0 = lambda s: special.ndtr(s / sigma)
  f1 = lambda s: (1 - p1) * special.ndtr(s / sigma) + p1 * special.ndtr((s - 1) / sigma)
  g = lambda x: float(dist.pgf_derivative(x))
  total = 0.0
  for c, pc in ((0, 1 - p1), (1, p1)):
    dens1 = lambda s: pc * stats.norm.pdf(s - c, scale=sigma) * g(f1(s))
    dens0 = lambda s: pc * stats.norm.pdf(s, scale=sigma) * g(f0(s))
    p, q = (dens1, dens0) if forward else (dens0, dens1)
    total += integrate.quad(lambda s: max(p(s) - math.exp(eps) * q(s), 0.0), -8 * sigma,
                            1 + 8 * sigma, limit=400, epsabs=1e-14, epsrel=1e-10, points=[0.5, 1.0])[0]
  return total


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")  # kinks of (.)_+: tolerance is ours
@pytest.mark.parametrize("dist", [acc.Fixed(2), acc.Poisson(mean=3)], ids=repr)
@pytest.mark.parametrize("eps", [0.5, 2.0, 5.0])
def test_the_bracket_contains_the_quadrature_of_the_density(dist, eps):
  profile = GadgetProfile(SIGMA, dist, cells=20_000)
  lower, upper = profile.deltas(eps)
  quad = _delta_by_quadrature(profile.noise_multiplier, dist, eps)
  assert lower <= quad * (1 + 1e-6) + 1e-15 and quad <= upper * (1 + 1e-6) + 1e-15, (lower, quad, upper)
  assert upper - lower <= 0.02 * upper + 1e-12  # 20,000 cells already bracket it tightly


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")  # kinks of (.)_+: tolerance is ours
@pytest.mark.parametrize("dist", [acc.Fixed(4), acc.Poisson(mean=3)], ids=repr)
def test_each_direction_is_bracketed(dist):
  # D || D' is the smaller side here, so `deltas` (the larger) never shows it: check it on its own.
  profile = GadgetProfile(SIGMA, dist, cells=20_000)
  for eps in (0.2, 1.0):
    for (lower, upper), forward in zip(profile.direction_deltas(eps), (True, False)):
      quad = _delta_by_quadrature(profile.noise_multiplier, dist, eps, forward=forward)
      assert lower <= quad * (1 + 1e-6) + 1e-15 and quad <= upper * (1 + 1e-6) + 1e-15, (eps, forward, lower, quad)
      assert upper - lower <= 0.02 * upper + 1e-12


def test_the_assumed_accuracy_of_ndtr_and_of_the_laws_holds():
  # The bracket's rounding allowance assumes ndtr within NDTR_RTOL and pgf_derivative within
  # PGF_RTOL max(1, E[K]) (relative): measured here against 30-digit mpmath.
  with mpmath.workdps(30):  # not mp.dps = 30: that would outlive the test
    xs = np.linspace(-37.0, 8.0, 1501)
    got = special.ndtr(xs)
    worst = max(float(abs(g - mpmath.ncdf(x)) / mpmath.ncdf(x)) for x, g in zip(xs, got))
    assert worst <= exact.NDTR_RTOL, worst
    us = np.concatenate([np.linspace(0.0, 1.0, 201), np.logspace(-30, -1, 30), 1 - np.logspace(-15, -1, 15)])
    closed = {acc.Poisson(mean=4): lambda x: 4 * mpmath.exp(4 * (x - 1)), acc.Fixed(4): lambda x: 4 * x**3,
              acc.Geometric(mean=4): lambda x: mpmath.mpf(0.25) / (1 - mpmath.mpf(0.75) * x) ** 2}
    for law, want in closed.items():
      got = law.pgf_derivative(us)
      worst = max(float(abs(g - want(mpmath.mpf(u))) / want(mpmath.mpf(u))) for u, g in zip(us, got) if want(u) > 0)
      assert worst <= exact.PGF_RTOL * max(1.0, law.mean), (law, worst)


@pytest.mark.parametrize("dist", LAWS, ids=repr)
def test_exact_is_below_every_accounted_epsilon(dist):
  lo, hi = GadgetProfile(SIGMA, dist).epsilon(DELTA)
  assert 0 < lo <= hi and hi - lo < 1e-3
  event = acc.RepeatAndSelect(acc.dpsgd_event(1.0, SIGMA, 1), dist)
  for method in ("rdp", "best") + (() if isinstance(dist, acc.Fixed) else ("profile",)):
    assert hi <= acc.epsilon(event, DELTA, method), method
  # More candidates (in expectation) can only leak more, and more noise less.
  assert GadgetProfile(SIGMA, acc.Fixed(1)).epsilon(DELTA)[1] < lo
  assert GadgetProfile(2 * SIGMA, dist).epsilon(DELTA)[1] < lo


def test_no_noise_is_not_private_and_bad_input_is_refused():
  assert GadgetProfile(0.0, acc.Poisson(mean=4)).epsilon(DELTA) == (math.inf, math.inf)
  with pytest.raises(ValueError, match="noise_multiplier"):
    GadgetProfile(-1.0, acc.Poisson(mean=4))
  with pytest.raises(ValueError, match="arms"):
    GadgetProfile(SIGMA, acc.Poisson(mean=4), arms=1)
  with pytest.raises(ValueError, match="delta"):
    GadgetProfile(SIGMA, acc.Poisson(mean=4)).epsilon(0.0)


def test_the_log_ratio_is_the_densities_ratio():
  profile = GadgetProfile(SIGMA, acc.Poisson(mean=3))
  sigma, dist = profile.noise_multiplier, profile.distribution
  s = np.array([-1.0, 0.2, 0.9, 2.5])
  f0 = special.ndtr(s / sigma)
  f1 = 0.5 * f0 + 0.5 * special.ndtr((s - 1) / sigma)
  for c in (0, 1):
    want = np.log(stats.norm.pdf(s - c, scale=sigma) * dist.pgf_derivative(f1)
                  / (stats.norm.pdf(s, scale=sigma) * dist.pgf_derivative(f0)))
    np.testing.assert_allclose(profile.log_ratio(np.full(4, c), s), want, rtol=1e-9, atol=1e-12)
