"""The base class of the laws of K (`KDistribution`) and the numerics its families share.

A law of K is a value object exposing its probability generating function
f(x) = E[x^K], all the privacy bounds need (Papernot & Steinke 2022, Sec. 3),
with `pmf`, `mean`, `sample` and a rigorous upper bound on its tail (`sf`).
The families live in `distributions` (Poisson, binomial, fixed, capped
geometric) and `negative_binomial` (the truncated negative binomial family);
`distributions` exports them all. This module imports nothing from jaxdp but
the validators, like the event layer that holds these laws.
"""

from __future__ import annotations

import math
from typing import Optional, Union

import numpy as np
from scipy import integrate


ArrayLike = Union[float, np.ndarray]


def as_generator(rng) -> np.random.Generator:
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


def generators_for_keys(keys) -> list:
  """`as_generator(key)` for each of a batch of JAX PRNG keys (shape (n,)), the bits drawn at once.

  Threefry's `jax.random.bits` is defined key by key, so the vmapped draw gives
  each key the bits `as_generator` draws for it alone: the same generators.
  Other implementations (rbg) are not, and draw key by key.
  """
  import jax  # pylint: disable=g-import-not-at-top
  draw = lambda key: jax.random.bits(key, (4,), dtype=np.uint32)
  if str(jax.random.key_impl(keys)) == "threefry2x32":
    bits = np.asarray(jax.vmap(draw)(keys))
  else:
    bits = np.stack([np.asarray(draw(key)) for key in keys])
  return [np.random.default_rng(row.astype(np.uint64)) for row in bits]


#: Most pmf terms `sf` sums beyond k before bounding the rest, and most it
#: sums below k for 1 - cdf (vectorised: ~10 ms and ~0.2 s).
_SF_MAX_TAIL_TERMS = 1 << 18
_SF_MAX_CDF_TERMS = 1 << 22
EPS64 = float(np.finfo(np.float64).eps)


def sf_margin(k: float, scale: float) -> float:
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
    summed = total * (1.0 + sf_margin(last, scale)) + rem
    if summed < 1e-3:
      return summed
    # Not a small tail: 1 - cdf is accurate, with its rounding added back.
    if k + 1 > _SF_MAX_CDF_TERMS:
      return min(1.0, summed)
    js = np.arange(0, k + 1, dtype=np.float64)
    cdf = float(np.sum(np.exp(self.logpmf(js))))
    comp = 1.0 - cdf * (1.0 - sf_margin(k, scale)) + (k + 2) * EPS64
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


def check_x(x):
  x = np.asarray(x, dtype=np.float64)
  if np.isnan(x).any():
    raise ValueError(f"x must not contain NaN, got {x!r}")
  return x


def set_field(obj, name, value):
  object.__setattr__(obj, name, value)  # frozen dataclasses: normalise in __init__/__post_init__

