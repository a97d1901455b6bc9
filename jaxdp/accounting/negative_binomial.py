"""The truncated negative binomial family D_{eta, gamma} of Papernot & Steinke (Def. 1).

`TruncatedNegativeBinomial` and its named members `Geometric` (eta = 1) and
`Logarithmic` (eta = 0), with `tnb_gamma_from_mean`. Every quantity is
computed from (eta, log gamma), so means so large that gamma underflows keep
finite, accurate PGFs. Exported by `distributions` with the other laws of K.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np
from scipy import special

from jaxdp import _validate
from jaxdp._cache import LruCache
from jaxdp.accounting import kdistribution as kd


def _log1mexp(x: float) -> float:
  """log(1 - e^x) for x < 0, accurate at both ends (Maechler 2012): near 0
  via expm1, and for very negative x via log1p (1 - e^x may round to 1)."""
  return math.log(-math.expm1(x)) if x > -math.log(2.0) else math.log1p(-math.exp(x))


def _log_a_over_expm1(a: float, z: float) -> float:
  """log(a / expm1(a z)) for z > 0 and any real a (limit -log z at a = 0), without overflow."""
  w = a * z
  if a == 0.0:
    return -math.log(z)
  if w > 0.0:
    # expm1(w) = e^w (1 - e^-w): no overflow for huge w.
    return math.log(a) - w - math.log(-math.expm1(-w))
  return math.log(-a) - math.log(-math.expm1(w))


def _tnb_log_mean(log_gamma: float, eta: float) -> float:
  """log E[K] of the truncated negative binomial, stable for gamma -> 0 or 1.

  E[K] = eta (1-gamma) / (gamma (1 - gamma^eta)) (eta = 0: (1/gamma - 1)/log(1/gamma));
  with z = -log(gamma) > 0, eta / (1 - gamma^eta) = (-eta) / expm1(-eta z).
  """
  return _log1mexp(log_gamma) - log_gamma + _log_a_over_expm1(-eta, -log_gamma)


def _tnb_log_mean_lower(log_gamma: float, eta: float) -> float:
  """A lower bound of the exact log E[K]: `_tnb_log_mean` less its rounding.

  Its three terms can be ~10 each and cancel to ~1e-3 (mean near 1), so the
  rounding is a few ulps of the terms, not of the result.
  """
  terms = (_log1mexp(log_gamma), -log_gamma, _log_a_over_expm1(-eta, -log_gamma))
  return sum(terms) - 16.0 * kd.EPS64 * (1.0 + sum(abs(t) for t in terms))


#: Smallest positive normal float64; below it gamma is kept through log(gamma).
_TINY = float(np.finfo(np.float64).tiny)


@dataclasses.dataclass(frozen=True, init=False)
class TruncatedNegativeBinomial(kd.KDistribution):
  """Truncated negative binomial D_{eta, gamma} of Papernot & Steinke (Def. 1).

  Support {1, 2, ...}; P[K=k] proportional to (1-gamma)^k prod_{l<k} (l+eta)/(l+1).
  eta = 0 is the logarithmic and eta = 1 the geometric distribution. Give
  exactly one of `mean` (> 1), `gamma` (in (0, 1)) or `log_gamma` (< 0).

  When built from `mean`, gamma is found by bisection in log-space to machine
  precision and rounded towards the smaller gamma (a slightly larger mean, the
  conservative side, as in dp-accounting); `mean` is then computed from gamma,
  so E[K] >= the requested mean, within ~1e-14 relative.

  Guarantees: every quantity is computed from (eta, log_gamma), so means so
  large that gamma underflows (eta -> -1: TruncatedNegativeBinomial(-0.999,
  mean=5) has gamma = e^-1610; `gamma` then reads 0.0) or that 1 - gamma
  rounds to 1 (Geometric(mean=1e17)) still give finite, accurate PGFs on
  [0, 1]; use `log_gamma` there.
  """

  eta: float
  gamma: float
  log_gamma: float = dataclasses.field(repr=False)

  def __init__(self, eta: float, *, mean: Optional[float] = None, gamma: Optional[float] = None,
               log_gamma: Optional[float] = None):
    eta = _validate.real("eta", eta, low=-1.0, low_open=True)
    if sum(v is not None for v in (mean, gamma, log_gamma)) != 1:
      raise ValueError(f"give exactly one of mean, gamma or log_gamma, got mean={mean!r}, "
                       f"gamma={gamma!r}, log_gamma={log_gamma!r}")
    if gamma is not None:
      gamma = _validate.probability("gamma", gamma)
      lg = math.log(gamma)
    elif log_gamma is not None:
      lg = _validate.real("log_gamma", log_gamma, high=0.0, high_open=True)
      gamma = math.exp(lg)
    else:
      gamma, lg = _tnb_gamma_and_log(eta, _validate.real("mean", mean, low=1.0, low_open=True))
    kd.set_field(self, "eta", eta)
    kd.set_field(self, "gamma", gamma)
    kd.set_field(self, "log_gamma", lg)

  @property
  def mean(self) -> float:
    if self.eta == 1.0 and self.gamma >= _TINY:
      return 1.0 / self.gamma
    try:
      return math.exp(_tnb_log_mean(self.log_gamma, self.eta))
    except OverflowError:  # a mean beyond float64 (gamma far below 1e-308): infinite, as a float says
      return math.inf

  def __repr__(self):
    name = {1.0: "Geometric", 0.0: "Logarithmic"}.get(self.eta)
    prefix = f"{name}(" if name else f"TruncatedNegativeBinomial(eta={self.eta!r}, "
    mean = self.mean
    # The mean form when it rebuilds exactly this distribution, else gamma.
    try:
      if TruncatedNegativeBinomial(self.eta, mean=mean) == self:
        return f"{prefix}mean={mean!r})"
    except ValueError:
      pass
    if self.gamma >= _TINY:
      return f"{prefix}gamma={self.gamma!r})"
    return f"{prefix}log_gamma={self.log_gamma!r})"

  def dp_accounting_shape(self):
    return self.eta if self.eta >= 0.0 else None

  @property
  def _log_one_minus_gamma(self) -> float:
    return _log1mexp(self.log_gamma)

  @property
  def _log_norm(self) -> float:
    """log of eta / (gamma^-eta - 1) (limit 1/log(1/gamma) at eta = 0)."""
    return _log_a_over_expm1(self.eta, -self.log_gamma)

  def logpmf(self, k):
    k = np.asarray(k, dtype=np.float64)
    eta = self.eta
    with np.errstate(divide="ignore", invalid="ignore"):
      # prod_{l<k} (l+eta)/(l+1) = eta * Gamma(k+eta) / (Gamma(1+eta) Gamma(k+1)).
      out = (k * self._log_one_minus_gamma + self._log_norm
             + special.gammaln(k + eta) - special.gammaln(1 + eta) - special.gammaln(k + 1))
    return np.where((k >= 1) & (k == np.floor(k)), out, -np.inf)

  def _log_base(self, x):
    """log(1 - (1-gamma) x), accurate on all of [0, 1] even when 1 - gamma rounds to 1.

    Near 0, log1p keeps f(x) ~ P[K=1] x exact; near 1, 1 - (1-gamma) x =
    (1 - x) + gamma x with 1 - x exact (Sterbenz), added in log space so
    that x = 1 gives log(gamma) even if gamma underflows.
    """
    out, diverges = self._log_base_and_divergence(x)
    if np.any(diverges):
      raise ValueError(f"the PGF of {self!r} diverges for x >= 1/(1-gamma) (gamma={self.gamma!r})")
    return out

  def _log_base_and_divergence(self, x):
    """(`_log_base` without raising, where the PGF's series diverges), elementwise."""
    x = kd.check_x(x)
    lg = self.log_gamma
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
      small = np.log1p(-(-math.expm1(lg)) * x)
      near_one = np.logaddexp(np.log(1.0 - x), lg + np.log(x))
      above = np.log((1.0 - x) + self.gamma * x)  # x > 1: the series may diverge
    out = np.where(x <= 0.5, small, np.where(x <= 1.0, near_one, above))
    return out, (x > 1.0) & ~(out > -np.inf) | np.isnan(out)

  def pgf(self, x):
    return self._pgf_from_log_base(self._log_base(x))

  def pgf_or_nan(self, x):
    """f(x) elementwise, NaN where the series diverges (where `pgf` raises for the whole array).

    Every other element is `pgf` of that element alone, bit for bit (the same
    elementwise operations), so a vectorised caller gets the scalar loop's numbers.
    """
    log_base, diverges = self._log_base_and_divergence(x)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
      out = self._pgf_from_log_base(np.where(diverges, 0.0, log_base))
    return np.where(diverges, np.nan, out)

  def _pgf_from_log_base(self, log_base):
    lg = self.log_gamma
    if self.eta == 0.0:
      return log_base / lg
    a, b = -self.eta * log_base, -self.eta * lg
    if self.eta < 0.0:  # a, b <= 0: (1 - base^-eta) / (1 - gamma^-eta), no overflow
      return np.expm1(a) / math.expm1(b)
    # eta > 0: expm1(a) / expm1(b), 0 <= a <= b, in a form that cannot overflow.
    with np.errstate(divide="ignore", invalid="ignore"):
      out = np.exp(a - b) * (-np.expm1(-a)) / -math.expm1(-b)
    return np.where(a == 0.0, 0.0, out)

  def pgf_derivative(self, x):
    # f'(x) = eta (1-gamma) base^(-eta-1) / (gamma^-eta - 1).
    x = kd.check_x(x)
    out = np.exp(self._log_norm + self._log_one_minus_gamma - (self.eta + 1.0) * self._log_base(x))
    # f'(1) = E[K]: never report less than `mean` through rounding of the logs.
    return np.where(x == 1.0, np.maximum(out, self.mean), out)

  def sample(self, rng, size=None):
    gen = kd.as_generator(rng)
    eta, gamma = self.eta, self.gamma
    if eta == 1.0:
      return gen.geometric(gamma, size=size)
    if eta == 0.0:
      return gen.logseries(1.0 - gamma, size=size)
    if eta > 0.0:
      return self._sample_rejection(gen, size)
    return self._sample_inverse_cdf(gen, size)

  def _sample_rejection(self, gen, size):
    # NB(eta, gamma) conditioned on K >= 1; acceptance 1 - gamma^eta.
    n = int(np.prod(size)) if size is not None else 1
    out = np.empty(0, dtype=np.int64)
    while out.size < n:
      draw = gen.negative_binomial(self.eta, self.gamma, size=max(2 * (n - out.size), 16))
      out = np.concatenate([out, draw[draw >= 1]])
    out = out[:n]
    return out.reshape(size) if size is not None else int(out[0])

  def _sample_inverse_cdf(self, gen, size):
    # eta in (-1, 0) has no untruncated counterpart; invert the CDF chunk by chunk
    # using P[K=k+1]/P[K=k] = (1-gamma)(k+eta)/(k+1).
    u = gen.random(size=size)
    flat = np.atleast_1d(u).ravel()
    out = np.zeros(flat.shape, dtype=np.int64)
    todo = np.ones(flat.shape, dtype=bool)
    start, cdf_before, chunk = 1, 0.0, 4096
    while todo.any():
      ks = np.arange(start, start + chunk, dtype=np.float64)
      cdf = cdf_before + np.cumsum(np.exp(self.logpmf(ks)))
      # Guard against the CDF stalling just below 1 through rounding.
      cdf[-1] = cdf[-1] if cdf[-1] < 1 - 1e-15 else 1.0
      idx = np.searchsorted(cdf, flat[todo], side="right")
      found = idx < chunk
      sel = np.flatnonzero(todo)
      out[sel[found]] = start + idx[found]
      todo[sel[found]] = False
      start, cdf_before = start + chunk, cdf[-1]
      chunk = min(chunk * 2, 1 << 22)
    return out.reshape(np.shape(u)) if size is not None else int(out[0])

  def _sf_scalar(self, k):
    if self.eta == 1.0 and k >= 0:
      # Geometric: P[K > k] = (1-gamma)^k exactly; exp/log1p round within a
      # few ulps of the exponent, added back.
      k = math.floor(k)
      expo = k * self._log_one_minus_gamma
      return min(1.0, math.exp(expo) * (1.0 + 4.0 * kd.EPS64 * (1.0 + abs(expo))))
    return super()._sf_scalar(k)

  def _log_scale(self):
    return abs(self._log_norm) + abs(self.log_gamma)

  def _remainder(self, m):
    # Ratio of successive terms r_j = (1-gamma)(j+eta)/(j+1), j >= m+1.
    eta, g = self.eta, self.gamma
    p_next = float(np.exp(self.logpmf(m + 1.0))) * (1.0 + kd.sf_margin(m + 1, self._log_scale()))
    if p_next == 0.0:
      return 0.0
    if eta > 1.0:
      ratio = math.exp(self._log_one_minus_gamma) * (m + 1.0 + eta) / (m + 2.0)  # decreasing in j
      return p_next / (1.0 - ratio) if ratio < 1.0 else math.inf
    # eta <= 1: r_j <= 1 - gamma (geometric series); for eta < 0 also
    # prod (l+eta)/(l+1) <= ((m+2)/(j+1))^(1-eta), whose sum is <= 1 + (m+2)/(-eta).
    bound = p_next / g if g > 0.0 else math.inf
    if eta < 0.0:
      bound = min(bound, p_next * (1.0 + (m + 2.0) / -eta))
    return bound

  def _integral_pgf(self):
    # Closed forms of int_0^1 f(x) dx (checked against pmf sums in the tests).
    eta, gamma, lg = self.eta, self.gamma, self.log_gamma
    if gamma < 1e-8:  # closed forms cancel; the PGF itself is accurate
      return super()._integral_pgf()
    if eta == 1.0:
      return gamma * (-lg - (1 - gamma)) / (1 - gamma) ** 2
    if eta == 0.0:
      return (1 - gamma + gamma * lg) / ((1 - gamma) * -lg)
    # eta not in {0, 1}: [ (1 - gamma^(1-eta)) / ((1-gamma)(1-eta)) - 1 ] / (gamma^-eta - 1).
    return ((-math.expm1((1 - eta) * lg) / ((1 - gamma) * (1 - eta)) - 1)
            / math.expm1(-eta * lg))

  def _t_max(self):
    return -math.log1p(-self.gamma)


def Geometric(mean: Optional[float] = None, *, gamma: Optional[float] = None) -> TruncatedNegativeBinomial:  # pylint: disable=invalid-name
  """K ~ Geometric on {1, 2, ...} with P[K=k] = gamma (1-gamma)^(k-1); mean 1/gamma.

  The eta = 1 member of `TruncatedNegativeBinomial` (and equal to it).
  """
  return TruncatedNegativeBinomial(1.0, mean=mean, gamma=gamma)


def Logarithmic(mean: Optional[float] = None, *, gamma: Optional[float] = None) -> TruncatedNegativeBinomial:  # pylint: disable=invalid-name
  """K ~ logarithmic: P[K=k] = (1-gamma)^k / (k log(1/gamma)), the eta = 0 member."""
  return TruncatedNegativeBinomial(0.0, mean=mean, gamma=gamma)


# A pure function of two floats (both validated to float by the caller), and
# ~1000 bisection steps (~4 ms): searches build the same distribution again
# and again, and `repr` rebuilds it from its mean (error messages format it).
_GAMMAS = LruCache(1024)


def _tnb_gamma_and_log(eta: float, mean: float):
  """(gamma, log gamma) with E[K] >= mean, as close as float64 allows (cached)."""
  return _GAMMAS.get_or_build((eta, mean), lambda: _solve_tnb_gamma(eta, mean))


def _solve_tnb_gamma(eta: float, mean: float):
  if eta == 1.0:
    gamma = 1.0 / mean
    while 1.0 / gamma < mean:  # round towards the larger mean
      gamma = math.nextafter(gamma, 0.0)
    return gamma, math.log(gamma)
  target = math.log(mean)
  # Bracket log(gamma): E[K] -> inf as gamma -> 0 and -> 1 as gamma -> 1.
  lo, hi = -1.0, 0.0
  # Compare a lower bound of the computed mean with the target, so that the
  # mean computed later from gamma (rounding either way) stays >= `mean`.
  for _ in range(1100):
    if _tnb_log_mean_lower(lo, eta) >= target:
      break
    lo, hi = 2.0 * lo, lo
    if not math.isfinite(lo):
      raise ValueError(f"mean={mean!r} is too large for eta={eta!r}")
  for _ in range(2200):
    mid = 0.5 * (lo + hi)
    if mid in (lo, hi):
      break
    if _tnb_log_mean_lower(mid, eta) >= target:
      lo = mid
    else:
      hi = mid
  gamma = math.exp(lo)
  if gamma < _TINY:  # keep log(gamma) itself: gamma is lost to underflow
    return gamma, lo
  while math.log(gamma) > lo:  # exp rounded up: step down to keep E[K] >= mean
    gamma = math.nextafter(gamma, 0.0)
  return gamma, math.log(gamma)


def tnb_gamma_from_mean(eta: float, mean: float) -> float:
  """gamma of D_{eta, gamma} with E[K] = mean, rounded to the conservative side.

  E[K] is strictly decreasing in gamma; bisection on log(gamma) runs until the
  bracket is a few ulps wide and returns its lower end, so E[K] at the returned
  gamma is >= `mean` and within ~1e-14 relative of it. (0.0 if gamma
  underflows: use `TruncatedNegativeBinomial(eta, mean=mean).log_gamma`.)
  """
  eta = _validate.real("eta", eta, low=-1.0, low_open=True)
  mean = _validate.real("mean", mean, low=1.0, low_open=True)
  return _tnb_gamma_and_log(eta, mean)[0]
