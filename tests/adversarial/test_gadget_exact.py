"""The gadget's exact epsilon, checked independently (issue 31). `GadgetProfile`'s bracket
[eps_lo, eps_hi] must hold the true epsilon(delta) of the gadget's best-of-K release, from an
independent float64 computation: the hockey-stick divergence by adaptive quadrature (relative
1e-13 per piece) between the roots of the log-likelihood ratio, each law's G' written out from
its pmf, in log space. Its error (1.1e-14 of delta; 1.2e-14 from a 30-digit mpmath quadrature,
the slow test) is far below the truth's distance from either end (4e-8 of delta at the closest),
so each end is checked in its own direction, on twelve settings (six in the default run).
"""

import math
import warnings

import mpmath
import numpy as np
import pytest
from scipy import integrate, optimize, special

from jaxdp import accounting as acc
from jaxdp.audit.exact import GadgetProfile


# Integration window in units of sigma: a side's released mass outside it is
# at most E[K] (Phi(-40) + Phi(-40)) < 1e-340, nothing next to any delta here.
_WINDOW = 40.0
_ROOT_GRID = 4001  # log-ratio samples per class for the sign changes (kinks of (.)_+)


def _float32_up(sigma: float) -> float:
  """The float32 the device adds noise with (the smallest float32 >= sigma), as a float64."""
  narrow = np.float32(sigma)
  if float(narrow) < sigma:
    narrow = np.nextafter(narrow, np.float32(np.inf))
  return float(narrow)


def _log_cdfs(s, sigma, b, p0):
  """(log F_b(s), log(1 - F_b(s))): one candidate's score CDF on D (b = 0) or D' (b = 1)."""
  x0 = s / sigma
  if b == 0:
    return special.log_ndtr(x0), special.log_ndtr(-x0)
  x1 = (s - 1.0) / sigma
  lp0, lp1 = math.log(p0), math.log1p(-p0)
  return (np.logaddexp(lp0 + special.log_ndtr(x0), lp1 + special.log_ndtr(x1)),
          np.logaddexp(lp0 + special.log_ndtr(-x0), lp1 + special.log_ndtr(-x1)))


def _log_pgf_derivative(law, log_x, log_1mx):
  """log G'(x) from log x and log(1 - x), written out from each law's pmf (not the library's code)."""
  x, one_minus_x = np.exp(log_x), np.exp(log_1mx)
  if isinstance(law, acc.Poisson):  # sum k e^-m m^k / k! x^(k-1) = m e^(-m (1 - x))
    return math.log(law.mean) - law.mean * one_minus_x
  if isinstance(law, acc.Fixed):
    return math.log(law.k) + (law.k - 1) * log_x
  if isinstance(law, acc.Binomial):
    return math.log(law.n * law.p) + (law.n - 1) * np.log1p(-law.p * one_minus_x)
  if isinstance(law, acc.TruncatedNegativeBinomial):
    # P[K = k] ~ C(k + eta - 1, k) (1 - g)^k, k >= 1: G(x) = ((1 - (1 - g) x)^-eta - 1) / (g^-eta - 1),
    # G'(x) = eta (1 - g) base^(-eta - 1) / (g^-eta - 1); eta = 0: (1 - g) / (base log(1/g)).
    g, eta = math.exp(law.log_gamma), law.eta
    log_base = np.log(one_minus_x + g * x)  # 1 - (1 - g) x without cancellation near x = 1
    if eta == 0.0:
      return math.log1p(-g) - log_base - math.log(-law.log_gamma)
    norm = math.log(abs(eta)) - math.log(abs(math.expm1(-eta * law.log_gamma)))
    return norm + math.log1p(-g) - (eta + 1.0) * log_base
  raise NotImplementedError(repr(law))


def _log_density(s, c, b, sigma, law, p0):
  """log f_b(c, s) = log p_c phi_sigma(s - b c) G'(F_b(s)): the released (arm class, score)."""
  pc = p0 if c == 0 else 1.0 - p0
  z = (s - b * c) / sigma
  return (math.log(pc) - 0.5 * z * z - 0.5 * math.log(2 * math.pi) - math.log(sigma)
          + _log_pgf_derivative(law, *_log_cdfs(s, sigma, b, p0)))


def _one_way_delta(sigma, law, arms, eps, b):
  """(value, error estimate) of int (f_b - e^eps f_{1-b})_+ over both arm classes."""
  p0 = 1.0 / arms
  lo, hi = -_WINDOW * sigma, 1.0 + _WINDOW * sigma
  total = error = 0.0
  for c in (0, 1):
    log_p = lambda s: _log_density(s, c, b, sigma, law, p0)
    h = lambda s: log_p(s) - _log_density(s, c, 1 - b, sigma, law, p0) - eps
    grid = np.linspace(lo, hi, _ROOT_GRID)
    signs = h(grid) > 0
    cuts = [lo] + [optimize.brentq(h, grid[i], grid[i + 1], xtol=1e-15, rtol=4 * np.finfo(float).eps)
                   for i in np.flatnonzero(signs[1:] != signs[:-1])] + [hi]
    for a, z in zip(cuts[:-1], cuts[1:]):
      if h(0.5 * (a + z)) <= 0:
        continue
      # (f_P - e^eps f_Q) = f_P (1 - e^-h): no cancellation near the roots. Pieces of sigma/2
      # keep every Gauss-Kronrod panel on a smooth, nearly polynomial stretch.
      knots = np.linspace(a, z, max(2, int(math.ceil((z - a) / (0.5 * sigma))) + 1))
      f = lambda s: math.exp(log_p(s)) * -math.expm1(-max(h(s), 0.0))
      for u, v in zip(knots[:-1], knots[1:]):
        val, err = integrate.quad(f, u, v, epsabs=0.0, epsrel=1e-13, limit=200)
        total, error = total + val, error + err
  return total, error


def _true_delta(sigma, law, arms, eps):
  """(delta, error): max of the two directions' hockey-stick divergences at eps, by quadrature."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", integrate.IntegrationWarning)  # roundoff flags at 1e-13: err says
    ways = [_one_way_delta(sigma, law, arms, eps, b) for b in (1, 0)]
  return max(w[0] for w in ways), max(w[1] for w in ways)


# (sigma, law, arms, delta): sigma from 0.5 to 8, six laws of K, two to five arms, delta 1e-3 .. 1e-7.
# Each takes about 0.8 s (the bisections of `epsilon` and the quadratures); half run in the slow set.
_slow = lambda *setting: pytest.param(*setting, marks=pytest.mark.slow)
SETTINGS = [
    (0.5, acc.Poisson(mean=4), 2, 1e-5),
    _slow(0.7, acc.TruncatedNegativeBinomial(-0.5, mean=4), 2, 1e-3),
    _slow(0.9, acc.Poisson(mean=4), 2, 1e-5),
    (0.9, acc.Geometric(mean=4), 2, 1e-5),
    _slow(1.0, acc.Poisson(mean=1), 2, 1e-4),
    (1.3, acc.Fixed(1), 2, 1e-6),
    _slow(2.0, acc.Logarithmic(mean=4), 2, 1e-5),
    _slow(2.5, acc.Fixed(10), 2, 1e-6),
    (3.0, acc.Binomial(8, 0.5), 3, 1e-5),
    (4.5, acc.Geometric(mean=20), 5, 1e-7),
    (6.1, acc.Poisson(mean=4), 2, 1e-5),
    _slow(8.0, acc.Fixed(4), 2, 1e-5),
]


@pytest.mark.parametrize("sigma,law,arms,delta", SETTINGS, ids=lambda v: repr(v))
def test_the_bracket_holds_the_true_epsilon_from_both_sides(sigma, law, arms, delta):
  profile = GadgetProfile(sigma, law, arms=arms)
  run = _float32_up(sigma)
  assert profile.noise_multiplier == run  # the sigma the device adds noise with, exactly
  lo, hi = profile.epsilon(delta)
  assert 0.0 < lo <= hi, (lo, hi)  # never inverted
  assert hi - lo <= 2e-3 * hi, (lo, hi)  # and still tight (200,000 cells; K = 10 fixed is the widest, 1.3e-3)
  at_hi, err_hi = _true_delta(run, law, arms, hi)
  at_lo, err_lo = _true_delta(run, law, arms, lo)
  # The reference's own error is negligible next to the margins asserted.
  assert err_hi <= 1e-9 * delta and err_lo <= 1e-9 * delta, (err_hi, err_lo)
  # delta_true decreases in eps, so eps_true <= hi iff delta_true(hi) <= delta, and >= lo iff ...(lo) >= delta.
  assert at_hi + err_hi <= delta, f"truth above the bracket: delta_true({hi!r}) = {at_hi!r} > {delta}"
  assert at_lo - err_lo >= delta, f"truth below the bracket: delta_true({lo!r}) = {at_lo!r} < {delta}"


@pytest.mark.parametrize("sigma,law,arms", [(0.9, acc.Poisson(mean=4), 2), (6.1, acc.Poisson(mean=4), 2)],
                         ids=lambda v: repr(v))
def test_the_claimed_deltas_hold_the_true_delta(sigma, law, arms):
  # The same in delta: at eps = 0.5, 1, 2 the (lower, upper) pair of `deltas` holds the quadrature.
  profile = GadgetProfile(sigma, law, arms=arms)
  for eps in (0.5, 1.0, 2.0):
    lower, upper = profile.deltas(eps)
    truth, err = _true_delta(profile.noise_multiplier, law, arms, eps)
    assert lower <= truth - err and truth + err <= upper, (eps, lower, truth, upper)


@pytest.mark.slow
@pytest.mark.parametrize("sigma,law,arms,eps", [(0.9, acc.Poisson(mean=4), 2, 5.0),
                                                (6.1, acc.Geometric(mean=4), 3, 0.5)], ids=repr)
def test_the_reference_agrees_with_30_digit_quadrature(sigma, law, arms, eps):
  # The float64 reference is what the bracket is judged by: mpmath at 30 digits, tanh-sinh
  # between the same roots, must agree with it to 1e-12 (the margins above are 4e-8 and more).
  with mpmath.workdps(30):  # not mp.dps = 30: that would outlive the test
    worst = _worst_against_mpmath(mpmath, sigma, law, arms, eps)
  assert worst <= 1e-12, worst  # 1.2e-14 measured


def _worst_against_mpmath(mpmath, sigma, law, arms, eps):
  """Largest relative gap, over both directions, of `_one_way_delta` to an mpmath quadrature."""
  p0 = mpmath.mpf(1) / arms
  sig = mpmath.mpf(sigma)

  def gprime(x):
    if isinstance(law, acc.Poisson):
      return law.mean * mpmath.exp(law.mean * (x - 1))
    g = mpmath.exp(mpmath.mpf(law.log_gamma))  # Geometric: G'(x) = g / (1 - (1 - g) x)^2
    return g / (1 - (1 - g) * x) ** 2

  def dens(s, c, b):
    pc = p0 if c == 0 else 1 - p0
    cdf = mpmath.ncdf(s / sig) if b == 0 else p0 * mpmath.ncdf(s / sig) + (1 - p0) * mpmath.ncdf((s - 1) / sig)
    return pc * mpmath.npdf(s - b * c, 0, sig) * gprime(cdf)

  worst = 0.0
  for b in (1, 0):
    want, _ = _one_way_delta(sigma, law, arms, eps, b)
    total = mpmath.mpf(0)
    for c in (0, 1):
      h = lambda s: mpmath.log(dens(s, c, b)) - mpmath.log(dens(s, c, 1 - b)) - eps
      lo, hi = -_WINDOW * sigma, 1 + _WINDOW * sigma
      grid = np.linspace(lo, hi, _ROOT_GRID)
      signs = [h(mpmath.mpf(float(s))) > 0 for s in grid]
      cuts = [mpmath.mpf(lo)] + [mpmath.findroot(h, (grid[i], grid[i + 1]), solver="anderson")
                                 for i in range(len(grid) - 1) if signs[i] != signs[i + 1]] + [mpmath.mpf(hi)]
      for a, z in zip(cuts[:-1], cuts[1:]):
        if h((a + z) / 2) > 0:
          pts = mpmath.linspace(a, z, max(2, int(math.ceil(float(z - a) / (0.5 * sigma))) + 1))
          total += mpmath.quad(lambda s: dens(s, c, b) - mpmath.exp(eps) * dens(s, c, 1 - b), pts)
    worst = max(worst, abs(float(total) - want) / float(total) if total > 0 else abs(want))
  return worst
