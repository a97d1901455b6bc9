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


class KDistribution:
  """Base class for distributions of K, supported on the non-negative integers."""

  #: Largest possible K, or None if unbounded.
  max_k: Optional[int] = None

  @property
  def mean(self) -> float:
    raise NotImplementedError

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

  def sample(self, rng, size=None) -> np.ndarray:
    """Draws K. `rng` is a numpy Generator or a JAX PRNG key (explicit, no default)."""
    raise NotImplementedError

  def _integral_pgf(self) -> float:
    """Integral of f over [0, 1]; subclasses override with closed forms."""
    val, _ = integrate.quad(lambda x: float(self.pgf(x)), 0.0, 1.0, epsabs=1e-13, epsrel=1e-12)
    return val

  def _log_pgf_exp(self, t: float) -> float:
    """log f(e^t) for t >= 0 (inf where the series diverges)."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
      val = float(self.pgf(math.exp(t)))
    return math.log(val) if val > 0 and math.isfinite(val) else math.inf

  def _t_max(self) -> float:
    """Supremum of t with f(e^t) finite."""
    return 50.0


def _check_x(x):
  x = np.asarray(x, dtype=np.float64)
  if np.isnan(x).any():
    raise ValueError(f"x must not contain NaN, got {x!r}")
  return x


class Poisson(KDistribution):
  """K ~ Poisson(mean). P[K=0] = exp(-mean) > 0: the tuner then outputs a fixed default."""

  def __init__(self, mean: float):
    self._mean = _validate.real("mean", mean, low=0.0, low_open=True)

  @property
  def mean(self) -> float:
    return self._mean

  def __repr__(self):
    return f"Poisson(mean={self._mean!r})"

  def __eq__(self, other):
    return type(other) is Poisson and other._mean == self._mean

  def __hash__(self):
    return hash(("Poisson", self._mean))

  def logpmf(self, k):
    k = np.asarray(k, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
      out = k * math.log(self._mean) - self._mean - special.gammaln(k + 1)
    return np.where((k >= 0) & (k == np.floor(k)), out, -np.inf)

  def pgf(self, x):
    return np.exp(self._mean * (_check_x(x) - 1.0))

  def pgf_derivative(self, x):
    return self._mean * np.exp(self._mean * (_check_x(x) - 1.0))

  def sample(self, rng, size=None):
    return _as_generator(rng).poisson(self._mean, size=size)

  def _integral_pgf(self):
    return -math.expm1(-self._mean) / self._mean


def _tnb_log_mean(log_gamma: float, eta: float) -> float:
  """log E[K] of the truncated negative binomial, stable for gamma -> 0 or 1."""
  # E[K] = eta (1-gamma) / (gamma (1 - gamma^eta)); eta = 0: (1/gamma - 1)/log(1/gamma).
  one_minus_gamma = -math.expm1(log_gamma)
  if eta == 0.0:
    ratio = -1.0 / log_gamma  # limit of eta / (1 - gamma^eta)
  else:
    ratio = eta / -math.expm1(eta * log_gamma)
  return math.log(one_minus_gamma) - log_gamma + math.log(ratio)


class TruncatedNegativeBinomial(KDistribution):
  """Truncated negative binomial D_{eta, gamma} of Papernot & Steinke (Def. 1).

  Support {1, 2, ...}; P[K=k] proportional to (1-gamma)^k prod_{l<k} (l+eta)/(l+1).
  eta = 0 is the logarithmic and eta = 1 the geometric distribution. Give
  exactly one of `mean` (> 1) or `gamma` (in (0, 1)).

  When built from `mean`, gamma is found by bisection in log-space to machine
  precision and rounded towards the smaller gamma (a slightly larger mean, the
  conservative side, as in dp-accounting); `mean` keeps the requested value.
  """

  def __init__(self, eta: float, *, mean: Optional[float] = None, gamma: Optional[float] = None):
    self._eta = _validate.real("eta", eta, low=-1.0, low_open=True)
    if (mean is None) == (gamma is None):
      raise ValueError(f"give exactly one of mean or gamma, got mean={mean!r}, gamma={gamma!r}")
    if gamma is not None:
      self._gamma = _validate.probability("gamma", gamma)
      self._mean = math.exp(_tnb_log_mean(math.log(self._gamma), self._eta))
    else:
      self._mean = _validate.real("mean", mean, low=1.0, low_open=True)
      self._gamma = tnb_gamma_from_mean(self._eta, self._mean)

  eta = property(lambda self: self._eta)
  gamma = property(lambda self: self._gamma)

  @property
  def mean(self) -> float:
    return self._mean

  def __repr__(self):
    return f"{type(self).__name__}(eta={self._eta!r}, mean={self._mean!r}, gamma={self._gamma!r})"

  def __eq__(self, other):
    return (isinstance(other, TruncatedNegativeBinomial)
            and (other._eta, other._gamma) == (self._eta, self._gamma))

  def __hash__(self):
    return hash(("TNB", self._eta, self._gamma))

  @property
  def _log_norm(self) -> float:
    """log of eta / (gamma^-eta - 1) (limit 1/log(1/gamma) at eta = 0)."""
    lg = math.log(self._gamma)
    if self._eta == 0.0:
      return -math.log(-lg)
    return math.log(self._eta / math.expm1(-self._eta * lg))

  def logpmf(self, k):
    k = np.asarray(k, dtype=np.float64)
    eta = self._eta
    with np.errstate(divide="ignore", invalid="ignore"):
      # prod_{l<k} (l+eta)/(l+1) = eta * Gamma(k+eta) / (Gamma(1+eta) Gamma(k+1)).
      out = (k * math.log1p(-self._gamma) + self._log_norm
             + special.gammaln(k + eta) - special.gammaln(1 + eta) - special.gammaln(k + 1))
    return np.where((k >= 1) & (k == np.floor(k)), out, -np.inf)

  def _log_base(self, x):
    """log(1 - (1-gamma) x), via log1p: exact for tiny x, where f(x) ~ P[K=1] x."""
    x = _check_x(x)
    if np.any(x >= 1.0 / (1.0 - self._gamma)):
      raise ValueError(f"the PGF of {self!r} diverges for x >= 1/(1-gamma) = "
                       f"{1 / (1 - self._gamma)!r}")
    return np.log1p(-(1.0 - self._gamma) * x)

  def pgf(self, x):
    log_base = self._log_base(x)
    lg = math.log(self._gamma)
    if self._eta == 0.0:
      return log_base / lg
    return np.expm1(-self._eta * log_base) / math.expm1(-self._eta * lg)

  def pgf_derivative(self, x):
    # f'(x) = eta (1-gamma) base^(-eta-1) / (gamma^-eta - 1).
    return np.exp(self._log_norm + math.log1p(-self._gamma) - (self._eta + 1.0) * self._log_base(x))

  def sample(self, rng, size=None):
    gen = _as_generator(rng)
    eta, gamma = self._eta, self._gamma
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
      draw = gen.negative_binomial(self._eta, self._gamma, size=max(2 * (n - out.size), 16))
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

  def _integral_pgf(self):
    # Closed forms of int_0^1 f(x) dx (checked against pmf sums in the tests).
    eta, gamma = self._eta, self._gamma
    lg = math.log(gamma)
    if eta == 1.0:
      return gamma * (-lg - (1 - gamma)) / (1 - gamma) ** 2
    if eta == 0.0:
      return (1 - gamma + gamma * lg) / ((1 - gamma) * -lg)
    # eta not in {0, 1}: [ (1 - gamma^(1-eta)) / ((1-gamma)(1-eta)) - 1 ] / (gamma^-eta - 1).
    return ((-math.expm1((1 - eta) * lg) / ((1 - gamma) * (1 - eta)) - 1)
            / math.expm1(-eta * lg))

  def _t_max(self):
    return -math.log1p(-self._gamma)


class Geometric(TruncatedNegativeBinomial):
  """K ~ Geometric on {1, 2, ...} with P[K=k] = gamma (1-gamma)^(k-1); mean 1/gamma."""

  def __init__(self, mean: Optional[float] = None, *, gamma: Optional[float] = None):
    super().__init__(1.0, mean=mean, gamma=gamma)

  def __repr__(self):
    return f"Geometric(mean={self.mean!r})"


class Logarithmic(TruncatedNegativeBinomial):
  """K ~ logarithmic: P[K=k] = (1-gamma)^k / (k log(1/gamma)), the eta = 0 member."""

  def __init__(self, mean: Optional[float] = None, *, gamma: Optional[float] = None):
    super().__init__(0.0, mean=mean, gamma=gamma)

  def __repr__(self):
    return f"Logarithmic(mean={self.mean!r})"


def tnb_gamma_from_mean(eta: float, mean: float) -> float:
  """gamma of D_{eta, gamma} with E[K] = mean, rounded to the conservative side.

  E[K] is strictly decreasing in gamma; bisection on log(gamma) runs until the
  bracket is a few ulps wide and returns its lower end, so E[K] at the returned
  gamma is >= `mean` and within ~1e-14 relative of it.
  """
  eta = _validate.real("eta", eta, low=-1.0, low_open=True)
  mean = _validate.real("mean", mean, low=1.0, low_open=True)
  if eta == 1.0:
    return 1.0 / mean
  target = math.log(mean)
  lo, hi = -745.0, 0.0  # log gamma; E[K] -> inf as gamma -> 0 and -> 1 as gamma -> 1.
  if _tnb_log_mean(lo, eta) < target:
    raise ValueError(f"mean={mean!r} is too large for eta={eta!r}: gamma would underflow")
  for _ in range(200):
    mid = 0.5 * (lo + hi)
    if mid in (lo, hi):
      break
    if _tnb_log_mean(mid, eta) >= target:
      lo = mid
    else:
      hi = mid
  return math.exp(lo)


class Binomial(KDistribution):
  """K ~ Binomial(n, p) (Koskela, Redberg & Wang 2024, Sec. 5.2); P[K=0] = (1-p)^n."""

  def __init__(self, n: int, p: float):
    self._n = _validate.integer("n", n, low=1)
    self._p = _validate.probability("p", p, one_ok=True)
    self.max_k = self._n

  n = property(lambda self: self._n)
  p = property(lambda self: self._p)

  @property
  def mean(self):
    return self._n * self._p

  def __repr__(self):
    return f"Binomial(n={self._n!r}, p={self._p!r})"

  def __eq__(self, other):
    return type(other) is Binomial and (other._n, other._p) == (self._n, self._p)

  def __hash__(self):
    return hash(("Binomial", self._n, self._p))

  def logpmf(self, k):
    k = np.asarray(k, dtype=np.float64)
    inside = (k >= 0) & (k <= self._n) & (k == np.floor(k))
    kk = np.where(inside, k, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
      out = (special.gammaln(self._n + 1) - special.gammaln(kk + 1) - special.gammaln(self._n - kk + 1)
             + special.xlogy(kk, self._p) + special.xlog1py(self._n - kk, -self._p))
    return np.where(inside, out, -np.inf)

  def pgf(self, x):
    return (1.0 - self._p + self._p * _check_x(x)) ** self._n

  def pgf_derivative(self, x):
    return self._n * self._p * (1.0 - self._p + self._p * _check_x(x)) ** (self._n - 1)

  def sample(self, rng, size=None):
    return _as_generator(rng).binomial(self._n, self._p, size=size)

  def _integral_pgf(self):
    return -math.expm1((self._n + 1) * math.log1p(-self._p)) / (self._p * (self._n + 1)) \
        if self._p < 1 else 1.0 / (self._n + 1)


class Fixed(KDistribution):
  """K = k always: naive repetition (Papernot & Steinke App. D; bad privacy)."""

  def __init__(self, k: int):
    self._k = _validate.integer("k", k, low=1)
    self.max_k = self._k

  k = property(lambda self: self._k)

  @property
  def mean(self):
    return float(self._k)

  def __repr__(self):
    return f"Fixed(k={self._k!r})"

  def __eq__(self, other):
    return type(other) is Fixed and other._k == self._k

  def __hash__(self):
    return hash(("Fixed", self._k))

  def logpmf(self, k):
    k = np.asarray(k, dtype=np.float64)
    return np.where(k == self._k, 0.0, -np.inf)

  def pgf(self, x):
    return _check_x(x) ** self._k

  def pgf_derivative(self, x):
    return self._k * _check_x(x) ** (self._k - 1)

  def sample(self, rng, size=None):
    _as_generator(rng)  # validate the argument even though no randomness is used
    return np.full(size, self._k, dtype=np.int64) if size is not None else self._k

  def _integral_pgf(self):
    return 1.0 / (self._k + 1)


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
