"""Distributions of the number of runs K in repeat-and-select tuning.

Each distribution exposes its probability generating function (PGF)
f(x) = E[x^K], which is all the privacy bounds need (Papernot & Steinke 2022,
"Hyperparameter tuning with Renyi differential privacy", Sec. 3), together with
`pmf`, `mean`, `sample` and the utility helpers of their Sec. 3.6.

The PGF is evaluated only on [0, 1] by the bounds; values above 1 are allowed
where the series converges (the tail bound uses them).

Example:
  >>> from jaxdp import accounting as acc
  >>> round(acc.expected_quantile(acc.Poisson(mean=10)), 6)
  0.900005
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional, Union

import numpy as np
from scipy import integrate, optimize, special

from jaxdp import _validate

ArrayLike = Union[float, np.ndarray]


def _as_generator(rng) -> np.random.Generator:
  """Accepts a numpy Generator or a JAX PRNG key; never invents a seed."""
  if isinstance(rng, np.random.Generator):
    return rng
  try:
    import jax  # pylint: disable=g-import-not-at-top
    bits = np.asarray(jax.random.bits(rng, (4,), dtype=np.uint32))
  except Exception:  # not a key
    raise ValueError(
        "rng must be a numpy.random.Generator or a JAX PRNG key, got "
        f"{type(rng).__name__}") from None
  return np.random.default_rng(bits.astype(np.uint64))


#: Most pmf terms `sf` sums beyond k before bounding the rest, and most it
#: sums below k for 1 - cdf (vectorised: ~10 ms and ~0.2 s).
_SF_MAX_TAIL_TERMS = 1 << 18
_SF_MAX_CDF_TERMS = 1 << 22
_EPS64 = float(np.finfo(np.float64).eps)


def _sf_margin(k: float, scale: float) -> float:
  """Relative error bound of pmf values computed in log space at index ~k.

  logpmf sums terms as large as ~k log k + `scale` (gammaln, k log(mean)),
  each with a few ulps (~1e-15 per unit) of absolute error, which exp()
  turns into relative error; 1e-14 per unit covers it with a margin of 10.
  """
  return 1e-14 * (1.0 + k * math.log(k + 2.0) + abs(scale))


class KDistribution:
  """Base class for distributions of K, supported on the non-negative integers.

  Subclasses are frozen dataclasses (value objects: equal and hashable by
  their parameters) and provide `mean`, `logpmf`, `pgf` and `pgf_derivative`.
  """

  #: Largest possible K, or None if unbounded.
  max_k: Optional[int] = None

  def logpmf(self, k) -> np.ndarray:
    raise NotImplementedError

  def pmf(self, k) -> ArrayLike:
    """P[K = k]; zero outside the support. Vectorised over `k`."""
    out = np.exp(self.logpmf(k))
    return float(out) if np.ndim(out) == 0 else out

  def pgf(self, x) -> ArrayLike:
    """f(x) = E[x^K]."""
    raise NotImplementedError

  def pgf_derivative(self, x) -> ArrayLike:
    """f'(x) = E[K x^(K-1)]; f'(1) = E[K]."""
    raise NotImplementedError

  @property
  def prob_zero(self) -> float:
    """P[K = 0] = f(0): the atom at which the tuner outputs its default."""
    return float(self.pgf(0.0))

  def dp_accounting_shape(self) -> Optional[float]:
    """The `shape` of dp-accounting's `RepeatAndSelectDpEvent` for this law of
    K (inf: Poisson, eta: truncated negative binomial), or None if it has none."""
    return None

  def sample(self, rng, size=None) -> np.ndarray:
    """Draws K. `rng` is a numpy Generator or a JAX PRNG key (explicit, no default)."""
    raise NotImplementedError

  def sf(self, k) -> ArrayLike:
    """An upper bound on P[K > k] (vectorised over `k`).

    The terms beyond k are summed (2^18 at most) and the rest is bounded by a
    geometric or power-law series from the ratio of successive terms; where
    the tail is not small, 1 - cdf (with its rounding added back) is used too.

    Guarantees: never below the true tail (accountants use it as the mass
    beyond a truncation point); accurate where the tail is tiny, not only
    where 1 - cdf is (within ~1e-10 relative for light tails; heavy eta < 0
    tails with tiny gamma within O(1/2^18)); 1 for k < 0, 0 for k >= max_k.
    """
    k = np.asarray(k, dtype=np.float64)
    if np.isnan(k).any():
      raise ValueError(f"k must not contain NaN, got {k!r}")
    out = np.array([self._sf_scalar(float(v)) for v in np.atleast_1d(k).ravel()])
    return float(out[0]) if k.ndim == 0 else out.reshape(k.shape)

  def _sf_scalar(self, k: float) -> float:
    if k < 0:
      return 1.0
    if math.isinf(k) or (self.max_k is not None and k >= self.max_k):
      return 0.0
    k = math.floor(k)
    scale = self._log_scale()
    # Sum P[K = j] for j = k+1..M chunk by chunk, then bound the rest.
    total, last, chunk, rem = 0.0, k, 1024, math.inf
    while last - k < _SF_MAX_TAIL_TERMS:
      hi = last + chunk if self.max_k is None else min(last + chunk, self.max_k)
      js = np.arange(last + 1, hi + 1, dtype=np.float64)
      total += float(np.sum(np.exp(self.logpmf(js))[::-1]))  # small terms first
      last = hi
      rem = 0.0 if (self.max_k is not None and last >= self.max_k) else self._remainder(last)
      if rem <= 1e-12 * total or rem == 0.0:
        break
      chunk = min(2 * chunk, _SF_MAX_TAIL_TERMS)
    summed = total * (1.0 + _sf_margin(last, scale)) + rem
    if summed < 1e-3:
      return summed
    # Not a small tail: 1 - cdf is accurate, with its rounding added back.
    if k + 1 > _SF_MAX_CDF_TERMS:
      return min(1.0, summed)
    js = np.arange(0, k + 1, dtype=np.float64)
    cdf = float(np.sum(np.exp(self.logpmf(js))))
    comp = 1.0 - cdf * (1.0 - _sf_margin(k, scale)) + (k + 2) * _EPS64
    return float(min(1.0, summed, max(comp, 0.0)))

  def _log_scale(self) -> float:
    """Magnitude of the parameters' terms in logpmf (for the rounding margin)."""
    return 0.0

  def _remainder(self, m: int) -> float:
    """Upper bound on P[K > m], from P[K = m + 1] and the ratio of successive terms."""
    return math.inf

  def _integral_pgf(self) -> float:
    """Integral of f over [0, 1]; subclasses override with closed forms."""
    val, _ = integrate.quad(lambda x: float(self.pgf(x)), 0.0, 1.0, epsabs=1e-13, epsrel=1e-12)
    return val

  def _log_pgf_exp(self, t: float) -> float:
    """log f(e^t) for t >= 0 (inf where the series diverges)."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
      try:
        val = float(self.pgf(math.exp(t)))
      except ValueError:  # the PGF diverges there
        return math.inf
    return math.log(val) if val > 0 and math.isfinite(val) else math.inf

  def _t_max(self) -> float:
    """Supremum of t with f(e^t) finite."""
    return 50.0


def _check_x(x):
  x = np.asarray(x, dtype=np.float64)
  if np.isnan(x).any():
    raise ValueError(f"x must not contain NaN, got {x!r}")
  return x


def _set(obj, name, value):
  object.__setattr__(obj, name, value)  # frozen dataclasses: normalise in __init__/__post_init__


@dataclasses.dataclass(frozen=True)
class Poisson(KDistribution):
  """K ~ Poisson(mean). P[K=0] = exp(-mean) > 0: the tuner then outputs a fixed default."""

  mean: float

  def __post_init__(self):
    _set(self, "mean", _validate.real("mean", self.mean, low=0.0, low_open=True))

  def logpmf(self, k):
    k = np.asarray(k, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
      out = k * math.log(self.mean) - self.mean - special.gammaln(k + 1)
    return np.where((k >= 0) & (k == np.floor(k)), out, -np.inf)

  def pgf(self, x):
    return np.exp(self.mean * (_check_x(x) - 1.0))

  def pgf_derivative(self, x):
    return self.mean * np.exp(self.mean * (_check_x(x) - 1.0))

  def dp_accounting_shape(self):
    # dp-accounting's Poisson case is PS Thm 6, which needs mean >= 1.
    return math.inf if self.mean >= 1.0 else None

  def sample(self, rng, size=None):
    return _as_generator(rng).poisson(self.mean, size=size)

  def _log_scale(self):
    return self.mean

  def _remainder(self, m):
    # P[K=j+1]/P[K=j] = mean/(j+1) decreases: a geometric series bounds the rest.
    ratio = self.mean / (m + 2.0)
    if ratio >= 1.0:
      return math.inf
    return float(np.exp(self.logpmf(m + 1.0))) * (1.0 + _sf_margin(m + 1, self.mean)) / (1.0 - ratio)

  def _integral_pgf(self):
    return -math.expm1(-self.mean) / self.mean


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
  return sum(terms) - 16.0 * _EPS64 * (1.0 + sum(abs(t) for t in terms))


#: Smallest positive normal float64; below it gamma is kept through log(gamma).
_TINY = float(np.finfo(np.float64).tiny)


@dataclasses.dataclass(frozen=True, init=False)
class TruncatedNegativeBinomial(KDistribution):
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
    _set(self, "eta", eta)
    _set(self, "gamma", gamma)
    _set(self, "log_gamma", lg)

  @property
  def mean(self) -> float:
    if self.eta == 1.0 and self.gamma >= _TINY:
      return 1.0 / self.gamma
    return math.exp(_tnb_log_mean(self.log_gamma, self.eta))

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
    x = _check_x(x)
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
    x = _check_x(x)
    out = np.exp(self._log_norm + self._log_one_minus_gamma - (self.eta + 1.0) * self._log_base(x))
    # f'(1) = E[K]: never report less than `mean` through rounding of the logs.
    return np.where(x == 1.0, np.maximum(out, self.mean), out)

  def sample(self, rng, size=None):
    gen = _as_generator(rng)
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
      return min(1.0, math.exp(expo) * (1.0 + 4.0 * _EPS64 * (1.0 + abs(expo))))
    return super()._sf_scalar(k)

  def _log_scale(self):
    return abs(self._log_norm) + abs(self.log_gamma)

  def _remainder(self, m):
    # Ratio of successive terms r_j = (1-gamma)(j+eta)/(j+1), j >= m+1.
    eta, g = self.eta, self.gamma
    p_next = float(np.exp(self.logpmf(m + 1.0))) * (1.0 + _sf_margin(m + 1, self._log_scale()))
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
@functools.lru_cache(maxsize=1024)
def _tnb_gamma_and_log(eta: float, mean: float):
  """(gamma, log gamma) with E[K] >= mean, as close as float64 allows."""
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


@dataclasses.dataclass(frozen=True)
class Binomial(KDistribution):
  """K ~ Binomial(n, p) (Koskela, Redberg & Wang 2024, Sec. 5.2); P[K=0] = (1-p)^n."""

  n: int
  p: float

  def __post_init__(self):
    _set(self, "n", _validate.integer("n", self.n, low=1))
    _set(self, "p", _validate.probability("p", self.p, one_ok=True))

  @property
  def max_k(self) -> int:
    return self.n

  @property
  def mean(self) -> float:
    return self.n * self.p

  def logpmf(self, k):
    k = np.asarray(k, dtype=np.float64)
    inside = (k >= 0) & (k <= self.n) & (k == np.floor(k))
    kk = np.where(inside, k, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
      out = (special.gammaln(self.n + 1) - special.gammaln(kk + 1) - special.gammaln(self.n - kk + 1)
             + special.xlogy(kk, self.p) + special.xlog1py(self.n - kk, -self.p))
    return np.where(inside, out, -np.inf)

  def pgf(self, x):
    return (1.0 - self.p + self.p * _check_x(x)) ** self.n

  def pgf_derivative(self, x):
    return self.n * self.p * (1.0 - self.p + self.p * _check_x(x)) ** (self.n - 1)

  def sample(self, rng, size=None):
    return _as_generator(rng).binomial(self.n, self.p, size=size)

  def _log_scale(self):
    return self.n * math.log(self.n + 1.0)

  def _remainder(self, m):
    if m >= self.n:
      return 0.0
    if self.p == 1.0:
      return math.inf  # all mass at n; the chunked sum reaches it
    # P[K=j+1]/P[K=j] = (n-j) p / ((j+1)(1-p)) decreases in j.
    ratio = (self.n - m - 1.0) * self.p / ((m + 2.0) * (1.0 - self.p))
    if ratio >= 1.0:
      return math.inf
    p_next = float(np.exp(self.logpmf(m + 1.0))) * (1.0 + _sf_margin(m + 1, self._log_scale()))
    return p_next / (1.0 - ratio)

  def _integral_pgf(self):
    return -math.expm1((self.n + 1) * math.log1p(-self.p)) / (self.p * (self.n + 1)) \
        if self.p < 1 else 1.0 / (self.n + 1)


@dataclasses.dataclass(frozen=True)
class Fixed(KDistribution):
  """K = k always: naive repetition (Papernot & Steinke App. D; bad privacy)."""

  k: int

  def __post_init__(self):
    _set(self, "k", _validate.integer("k", self.k, low=1))

  @property
  def max_k(self) -> int:
    return self.k

  @property
  def mean(self) -> float:
    return float(self.k)

  def logpmf(self, k):
    k = np.asarray(k, dtype=np.float64)
    return np.where(k == self.k, 0.0, -np.inf)

  def pgf(self, x):
    return _check_x(x) ** self.k

  def pgf_derivative(self, x):
    return self.k * _check_x(x) ** (self.k - 1)

  def sample(self, rng, size=None):
    _as_generator(rng)  # validate the argument even though no randomness is used
    return np.full(size, self.k, dtype=np.int64) if size is not None else self.k

  def _sf_scalar(self, k):
    return 1.0 if k < self.k else 0.0

  def _integral_pgf(self):
    return 1.0 / (self.k + 1)


@dataclasses.dataclass(frozen=True)
class CappedGeometric(KDistribution):
  """K = min(G, max_k), G ~ Geometric(stop_prob) on {1, 2, ...}: Liu-Talwar's hard stop.

  P[K = k] = gamma (1-gamma)^(k-1) for k < max_k, P[K = max_k] = (1-gamma)^(max_k-1).
  """

  stop_prob: float
  max_k: int

  def __post_init__(self):
    _set(self, "stop_prob", _validate.probability("stop_prob", self.stop_prob))
    _set(self, "max_k", _validate.integer("max_k", self.max_k, low=1))

  @property
  def gamma(self) -> float:
    return self.stop_prob

  @property
  def mean(self) -> float:
    # E[min(G, T)] = sum_{k<T} P[G > k] = (1 - (1-gamma)^T) / gamma.
    return -math.expm1(self.max_k * math.log1p(-self.stop_prob)) / self.stop_prob

  def logpmf(self, k):
    k = np.asarray(k, dtype=np.float64)
    g, t = self.stop_prob, self.max_k
    with np.errstate(divide="ignore", invalid="ignore"):
      body = math.log(g) + (k - 1) * math.log1p(-g)
      cap = (t - 1) * math.log1p(-g)
    out = np.where(k == t, cap, body)
    return np.where((k >= 1) & (k <= t) & (k == np.floor(k)), out, -np.inf)

  def pgf(self, x):
    x = np.asarray(x, dtype=np.float64)
    g, t = self.stop_prob, self.max_k
    r = (1.0 - g) * x
    # sum_{k<T} g (1-g)^(k-1) x^k = g x (1 - r^(T-1)) / (1 - r), plus the cap atom x r^(T-1).
    with np.errstate(divide="ignore", invalid="ignore"):
      head = np.where(r == 1.0, g * x * (t - 1), g * x * -np.expm1((t - 1) * np.log(r)) / (1.0 - r))
    return head + x * r ** (t - 1)

  def pgf_derivative(self, x):
    x = np.asarray(x, dtype=np.float64)
    g, t = self.stop_prob, self.max_k
    if t <= 4096:  # direct sum: exact to rounding
      ks = np.arange(1, t + 1, dtype=np.float64)
      probs = np.exp(self.logpmf(ks))
      xx = np.atleast_1d(x)[..., None]
      with np.errstate(divide="ignore", invalid="ignore"):
        powers = np.where(ks == 1, 1.0, xx ** (ks - 1))
      out = np.sum(ks * probs * powers, axis=-1)
      return out.reshape(np.shape(x))
    r = (1.0 - g) * x
    # g sum_{k<T} k r^(k-1) = g (1 - T r^(T-1) + (T-1) r^T) / (1-r)^2, plus T r^(T-1).
    return g * (1.0 - t * r ** (t - 1) + (t - 1) * r ** t) / (1.0 - r) ** 2 + t * r ** (t - 1)

  def sample(self, rng, size=None):
    draw = _as_generator(rng).geometric(self.stop_prob, size=size)
    return np.minimum(draw, self.max_k)

  def _sf_scalar(self, k):
    if k < 0:
      return 1.0
    if k >= self.max_k:
      return 0.0
    # P[K > k] = P[G > k] = (1-gamma)^k for k < max_k; rounding added back.
    expo = math.floor(k) * math.log1p(-self.stop_prob)
    return min(1.0, math.exp(expo) * (1.0 + 4.0 * _EPS64 * (1.0 + abs(expo))))


def _check_dist(dist) -> KDistribution:
  if not isinstance(dist, KDistribution):
    raise ValueError(f"distribution must be a jaxdp.accounting K distribution "
                     f"(Poisson, TruncatedNegativeBinomial, ...), got {dist!r}")
  return dist


def expected_quantile(dist: KDistribution) -> float:
  """E[K/(K+1)] = 1 - int_0^1 f(x) dx: the expected quantile of the best of K
  uniform scores (Papernot & Steinke Sec. 3.6); K = 0 counts as quantile 0."""
  return 1.0 - _check_dist(dist)._integral_pgf()


def success_probability(dist: KDistribution, p_good: float) -> float:
  """P[at least one of K runs is good] = 1 - f(1 - p_good), each run good w.p. p_good."""
  p_good = _validate.probability("p_good", p_good, zero_ok=True, one_ok=True)
  return float(1.0 - _check_dist(dist).pgf(1.0 - p_good))


def tail_bound(dist: KDistribution, k: float) -> float:
  """Upper bound on P[K >= k]: the smaller of Chernoff and Markov.

  Chernoff: min_{t>0} f(e^t) e^{-tk} (Poisson: e^{-mu} (e mu / k)^k for
  k > mu); Markov: E[K]/k, which wins for the heavy-tailed eta < 0 members.
  Useful to cap run-time: how unlikely is a search longer than k runs?
  """
  dist = _check_dist(dist)
  k = _validate.real("k", k, low=0.0)
  if dist.max_k is not None and k > dist.max_k:
    return 0.0
  markov = dist.mean / k if k > 0 else 1.0
  if isinstance(dist, Poisson):
    mu = dist.mean
    return min(markov, 1.0 if k <= mu else math.exp(-mu + k - k * math.log(k / mu)))
  t_max = dist._t_max()
  fun = lambda t: dist._log_pgf_exp(t) - t * k
  res = optimize.minimize_scalar(fun, bounds=(0.0, t_max * (1 - 1e-9)), method="bounded",
                                 options={"xatol": 1e-12})
  best = min(res.fun, fun(0.0))
  return float(min(1.0, markov, math.exp(best)))
