"""Distributions of the number of runs K in repeat-and-select tuning.

Each distribution exposes its probability generating function (PGF)
f(x) = E[x^K], which is all the privacy bounds need (Papernot & Steinke 2022,
"Hyperparameter tuning with Renyi differential privacy", Sec. 3), together with
`pmf`, `mean`, `sample` and the utility helpers of their Sec. 3.6.

The PGF is evaluated only on [0, 1] by the bounds; values above 1 are allowed
where the series converges (the tail bound uses them).

This module is where the laws of K are found: Poisson, binomial, fixed and
capped geometric live here, the truncated negative binomial family
(geometric, logarithmic) in `negative_binomial`, and their base class
`KDistribution` with the shared numerics in `kdistribution`; all are
exported from here.

Example:
  >>> from jaxdp import accounting as acc
  >>> round(acc.expected_quantile(acc.Poisson(mean=10)), 6)
  0.900005
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import optimize, special

from jaxdp import _validate
from jaxdp.accounting import kdistribution as kd
from jaxdp.accounting.kdistribution import KDistribution
from jaxdp.accounting.negative_binomial import Geometric
from jaxdp.accounting.negative_binomial import Logarithmic
from jaxdp.accounting.negative_binomial import tnb_gamma_from_mean
from jaxdp.accounting.negative_binomial import TruncatedNegativeBinomial

__all__ = ["Binomial", "CappedGeometric", "check_distribution", "expected_quantile", "Fixed", "Geometric",
           "KDistribution", "Logarithmic", "Poisson", "success_probability", "tail_bound",
           "tnb_gamma_from_mean", "TruncatedNegativeBinomial"]


@dataclasses.dataclass(frozen=True)
class Poisson(KDistribution):
  """K ~ Poisson(mean). P[K=0] = exp(-mean) > 0: the tuner then outputs a fixed default."""

  mean: float

  def __post_init__(self):
    kd.set_field(self, "mean", _validate.real("mean", self.mean, low=0.0, low_open=True))

  def logpmf(self, k):
    k = np.asarray(k, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
      out = k * math.log(self.mean) - self.mean - special.gammaln(k + 1)
    return np.where((k >= 0) & (k == np.floor(k)), out, -np.inf)

  def pgf(self, x):
    return np.exp(self.mean * (kd.check_x(x) - 1.0))

  def pgf_derivative(self, x):
    return self.mean * np.exp(self.mean * (kd.check_x(x) - 1.0))

  def dp_accounting_shape(self):
    # dp-accounting's Poisson case is PS Thm 6, which needs mean >= 1.
    return math.inf if self.mean >= 1.0 else None

  def sample(self, rng, size=None):
    return kd.as_generator(rng).poisson(self.mean, size=size)

  def _log_scale(self):
    return self.mean

  def _remainder(self, m):
    # P[K=j+1]/P[K=j] = mean/(j+1) decreases: a geometric series bounds the rest.
    ratio = self.mean / (m + 2.0)
    if ratio >= 1.0:
      return math.inf
    return float(np.exp(self.logpmf(m + 1.0))) * (1.0 + kd.sf_margin(m + 1, self.mean)) / (1.0 - ratio)

  def _integral_pgf(self):
    return -math.expm1(-self.mean) / self.mean



@dataclasses.dataclass(frozen=True)
class Binomial(KDistribution):
  """K ~ Binomial(n, p) (Koskela, Redberg & Wang 2024, Sec. 5.2); P[K=0] = (1-p)^n."""

  n: int
  p: float

  def __post_init__(self):
    kd.set_field(self, "n", _validate.integer("n", self.n, low=1))
    kd.set_field(self, "p", _validate.probability("p", self.p, one_ok=True))

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
    return (1.0 - self.p + self.p * kd.check_x(x)) ** self.n

  def pgf_derivative(self, x):
    return self.n * self.p * (1.0 - self.p + self.p * kd.check_x(x)) ** (self.n - 1)

  def sample(self, rng, size=None):
    return kd.as_generator(rng).binomial(self.n, self.p, size=size)

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
    p_next = float(np.exp(self.logpmf(m + 1.0))) * (1.0 + kd.sf_margin(m + 1, self._log_scale()))
    return p_next / (1.0 - ratio)

  def _integral_pgf(self):
    return -math.expm1((self.n + 1) * math.log1p(-self.p)) / (self.p * (self.n + 1)) \
        if self.p < 1 else 1.0 / (self.n + 1)


@dataclasses.dataclass(frozen=True)
class Fixed(KDistribution):
  """K = k always: naive repetition (Papernot & Steinke App. D; bad privacy)."""

  k: int

  def __post_init__(self):
    kd.set_field(self, "k", _validate.integer("k", self.k, low=1))

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
    return kd.check_x(x) ** self.k

  def pgf_derivative(self, x):
    return self.k * kd.check_x(x) ** (self.k - 1)

  def sample(self, rng, size=None):
    kd.as_generator(rng)  # validate the argument even though no randomness is used
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
    kd.set_field(self, "stop_prob", _validate.probability("stop_prob", self.stop_prob))
    kd.set_field(self, "max_k", _validate.integer("max_k", self.max_k, low=1))

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
    draw = kd.as_generator(rng).geometric(self.stop_prob, size=size)
    return np.minimum(draw, self.max_k)

  def _sf_scalar(self, k):
    if k < 0:
      return 1.0
    if k >= self.max_k:
      return 0.0
    # P[K > k] = P[G > k] = (1-gamma)^k for k < max_k; rounding added back.
    expo = math.floor(k) * math.log1p(-self.stop_prob)
    return min(1.0, math.exp(expo) * (1.0 + 4.0 * kd.EPS64 * (1.0 + abs(expo))))


def check_distribution(dist) -> KDistribution:
  """`dist` itself if it is a law of K (a `KDistribution`), else ValueError naming it."""
  if not isinstance(dist, KDistribution):
    raise ValueError(f"distribution must be a jaxdp.accounting K distribution "
                     f"(Poisson, TruncatedNegativeBinomial, ...), got {dist!r}")
  return dist


def expected_quantile(dist: KDistribution) -> float:
  """E[K/(K+1)] = 1 - int_0^1 f(x) dx: the expected quantile of the best of K
  uniform scores (Papernot & Steinke Sec. 3.6); K = 0 counts as quantile 0."""
  return 1.0 - check_distribution(dist)._integral_pgf()


def success_probability(dist: KDistribution, p_good: float) -> float:
  """P[at least one of K runs is good] = 1 - f(1 - p_good), each run good w.p. p_good."""
  p_good = _validate.probability("p_good", p_good, zero_ok=True, one_ok=True)
  return float(1.0 - check_distribution(dist).pgf(1.0 - p_good))


def tail_bound(dist: KDistribution, k: float) -> float:
  """Upper bound on P[K >= k]: the smaller of Chernoff and Markov.

  Chernoff: min_{t>0} f(e^t) e^{-tk} (Poisson: e^{-mu} (e mu / k)^k for
  k > mu); Markov: E[K]/k, which wins for the heavy-tailed eta < 0 members.
  Useful to cap run-time: how unlikely is a search longer than k runs?
  """
  dist = check_distribution(dist)
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
