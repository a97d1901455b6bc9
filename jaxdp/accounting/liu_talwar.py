"""Liu & Talwar (STOC 2019), "Private selection from private candidates": events
and their accounting.

Two algorithms over an oracle Q (draw a candidate, run it, return (output, score)):

  * `ThresholdSelect` (their Algorithm 1): call Q until a score reaches a known
    threshold tau; after each failed call stop with probability `stop_prob`
    (output BOT); at most `max_iterations` calls.
  * `RandomStopping` (their Algorithm 2): call Q, then stop with probability
    `stop_prob`; release the best result. This is repeat-and-select with a
    geometric number of runs (capped at `max_iterations` for the hard-stopped
    variant), so it is a `RepeatAndSelect` and every other method applies too.

Accounting (method "liu-talwar"; pure eps1-DP base only):

  * Thm 3.1(b): Algorithm 1 is (2 eps1 + eps0)-DP with eps0 = 2 exp(-gamma T),
    for T >= 1 + 1/(e gamma); T = inf gives 2 eps1. (REFERENCE section 6: recon
    cross-checked with OpenDP's implementation and brute force.) Any T also
    gives T eps1 (the output post-processes T runs); the smaller is used.
  * Thm 3.2: Algorithm 2 without a cap is 3 eps1-DP (= Papernot-Steinke Cor 3
    with eta = 1).
  * Thm 3.5 (hard stop, pure base): its exact constant was lost in the
    extraction, so it is replaced by the pure-DP limit of Papernot-Steinke
    Lemma 7 for K = min(Geometric(gamma), T), evaluated rigorously
    (`pure_selection_epsilon`): D_inf(A||A') <= eps1 + sup log f'(q)/f'(q')
    over pairs with q <= e^eps1 q' and 1 - q' <= e^eps1 (1 - q).

Not implemented (not recoverable from the paper as extracted): Thm 3.1(c) and
Thm 3.4 for (eps, delta)-DP bases; the method then says it does not apply.
For approximate-DP bases use `RandomStopping` with the "profile" method (KRW
Thm 5.2) when there is no cap.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import dp_accounting as dpa
import numpy as np

from jaxdp import _validate
from jaxdp.accounting import distributions as dist_lib
from jaxdp.accounting import guarantees as g_lib
from jaxdp.accounting import profiles as prof_lib
from jaxdp.accounting.events import RepeatAndSelect, check_base
from jaxdp.accounting.profile_selection import ProfileGuarantee


class CappedGeometric(dist_lib.KDistribution):
  """K = min(G, max_k), G ~ Geometric(stop_prob) on {1, 2, ...}: Liu-Talwar's hard stop.

  P[K = k] = gamma (1-gamma)^(k-1) for k < max_k, P[K = max_k] = (1-gamma)^(max_k-1).
  """

  def __init__(self, stop_prob: float, max_k: int):
    self._gamma = _validate.probability("stop_prob", stop_prob)
    self.max_k = _validate.integer("max_k", max_k, low=1)

  gamma = property(lambda self: self._gamma)

  @property
  def mean(self) -> float:
    # E[min(G, T)] = sum_{k<T} P[G > k] = (1 - (1-gamma)^T) / gamma.
    return -math.expm1(self.max_k * math.log1p(-self._gamma)) / self._gamma

  def __repr__(self):
    return f"CappedGeometric(stop_prob={self._gamma!r}, max_k={self.max_k!r})"

  def __eq__(self, other):
    return type(other) is CappedGeometric and (other._gamma, other.max_k) == (self._gamma, self.max_k)

  def __hash__(self):
    return hash(("CappedGeometric", self._gamma, self.max_k))

  def logpmf(self, k):
    k = np.asarray(k, dtype=np.float64)
    g, t = self._gamma, self.max_k
    with np.errstate(divide="ignore", invalid="ignore"):
      body = math.log(g) + (k - 1) * math.log1p(-g)
      cap = (t - 1) * math.log1p(-g)
    out = np.where(k == t, cap, body)
    return np.where((k >= 1) & (k <= t) & (k == np.floor(k)), out, -np.inf)

  def pgf(self, x):
    x = np.asarray(x, dtype=np.float64)
    g, t = self._gamma, self.max_k
    r = (1.0 - g) * x
    # sum_{k<T} g (1-g)^(k-1) x^k = g x (1 - r^(T-1)) / (1 - r), plus the cap atom x r^(T-1).
    with np.errstate(divide="ignore", invalid="ignore"):
      head = np.where(r == 1.0, g * x * (t - 1), g * x * -np.expm1((t - 1) * np.log(r)) / (1.0 - r))
    return head + x * r ** (t - 1)

  def pgf_derivative(self, x):
    x = np.asarray(x, dtype=np.float64)
    g, t = self._gamma, self.max_k
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
    draw = dist_lib._as_generator(rng).geometric(self._gamma, size=size)  # pylint: disable=protected-access
    return np.minimum(draw, self.max_k)


@dataclasses.dataclass(frozen=True, init=False)
class RandomStopping(RepeatAndSelect):
  """Liu-Talwar Algorithm 2: run `base`, stop w.p. `stop_prob` after each run,
  release the best run; `max_iterations` = hard stop T (None: no cap).

  A `RepeatAndSelect` with K ~ Geometric(stop_prob) (or min(Geometric, T)), so
  "rdp" and "profile" also apply; "liu-talwar" adds Thm 3.2 / 3.5 for pure bases.

  Example:
    >>> from jaxdp import accounting as acc
    >>> ev = acc.RandomStopping(acc.PureDp(1.0), stop_prob=0.1)
    >>> acc.epsilon(ev, 1e-6, method="liu-talwar") <= 3.0
    True
  """

  stop_prob: float
  max_iterations: Optional[int]

  def __init__(self, base: Any, stop_prob: float, max_iterations: Optional[int] = None):
    stop_prob = _validate.probability("stop_prob", stop_prob)
    if max_iterations is not None:
      max_iterations = _validate.integer("max_iterations", max_iterations, low=1)
    dist = (dist_lib.Geometric(gamma=stop_prob) if max_iterations is None
            else CappedGeometric(stop_prob, max_iterations))
    object.__setattr__(self, "base", base)
    object.__setattr__(self, "distribution", dist)
    object.__setattr__(self, "stop_prob", stop_prob)
    object.__setattr__(self, "max_iterations", max_iterations)
    self.__post_init__()


@dataclasses.dataclass(frozen=True)
class ThresholdSelect:
  """Liu-Talwar Algorithm 1: call `base` until its score reaches a known
  threshold; after each miss stop with probability `stop_prob` (output BOT);
  at most `max_iterations` calls (None: unbounded).

  Args:
    base: one call's guarantee (as for `RepeatAndSelect`); the accounting
      needs it to be pure DP.
    stop_prob: gamma in (0, 1].
    max_iterations: T >= 1 or None.

  Example:
    >>> from jaxdp import accounting as acc
    >>> round(acc.epsilon(acc.ThresholdSelect(acc.PureDp(0.5), 0.1), 1e-6), 4)
    1.0
  """

  base: Any
  stop_prob: float
  max_iterations: Optional[int] = None

  def __post_init__(self):
    check_base(self.base)
    object.__setattr__(self, "stop_prob",
                       _validate.probability("stop_prob", self.stop_prob, one_ok=True))
    if self.max_iterations is not None:
      object.__setattr__(self, "max_iterations",
                         _validate.integer("max_iterations", self.max_iterations, low=1))


def pure_epsilon(base, orders: Optional[np.ndarray] = None) -> Optional[float]:
  """A pure-DP epsilon of `base`, or None if it has none we can prove."""
  if isinstance(base, g_lib.PureDp):
    return base.epsilon
  if isinstance(base, g_lib.ApproxDp):
    return base.epsilon if base.delta == 0 else None
  if isinstance(base, dpa.LaplaceDpEvent):
    return math.inf if base.noise_multiplier == 0 else 1.0 / base.noise_multiplier
  if isinstance(base, dpa.NoOpDpEvent):
    return 0.0
  from jaxdp.accounting import subsampled  # pylint: disable=g-import-not-at-top
  if isinstance(base, subsampled.UniformCandidates):
    parts = [pure_epsilon(c, orders) for c in base.candidates]
    return None if any(p is None for p in parts) else max(parts)
  if isinstance(base, dpa.SelfComposedDpEvent):
    inner = pure_epsilon(base.event)
    return None if inner is None else base.count * inner
  if isinstance(base, dpa.ComposedDpEvent):
    parts = [pure_epsilon(e) for e in base.events]
    return None if any(p is None for p in parts) else float(sum(parts))
  if isinstance(base, RepeatAndSelect):
    from jaxdp.accounting import accountant  # pylint: disable=g-import-not-at-top
    orders = g_lib.check_orders(None) if orders is None else orders
    candidates = []
    for method in ("rdp", "liu-talwar"):
      try:
        gu = accountant._guarantee(base, orders, method)  # pylint: disable=protected-access
      except ValueError:
        continue
      pure = getattr(gu, "pure_epsilon", None)
      if pure is None and isinstance(gu, ProfileGuarantee):
        pure = gu.profile.pure_epsilon
      if pure is not None:
        candidates.append(pure)
    return min(candidates) if candidates else None
  return None


_N_CELLS = 4000


def pure_selection_epsilon(eps: float, dist: dist_lib.KDistribution) -> float:
  """Pure-DP limit of Papernot-Steinke Lemma 7 (REFERENCE section 3.1), rigorously.

  With A(y) = Q(y) E_t f'(q_y(t)), A(y)/A'(y) <= e^eps sup f'(q)/f'(q') over
  post-processed pairs, which satisfy q <= e^eps q' and q <= 1 - e^-eps (1 - q').
  f' and the largest feasible q, q_max(q'), are non-decreasing, so on a cell
  [a, b] of q' the ratio is at most f'(q_max(b)) / f'(a): an upper bound,
  not an estimate. The K = 0 atom (same on both sides) has ratio 1.

  Args:
    eps: the base's pure epsilon.
    dist: law of K (needs f'(0) > 0, i.e. P[K = 1] > 0).

  Returns:
    An epsilon such that best-of-K is eps-DP; inf if the bound is infinite.
  """
  if eps == 0.0:
    return 0.0
  tail = np.logspace(-14, math.log10(0.5), _N_CELLS // 2)
  qp = np.unique(np.concatenate([[0.0], tail, 1.0 - tail[::-1], np.linspace(0.0, 1.0, 4 * _N_CELLS + 1)]))
  q_max = np.minimum(1.0, np.minimum(math.exp(eps) * qp, 1.0 - math.exp(-eps) * (1.0 - qp)))
  with np.errstate(divide="ignore"):
    log_num = np.log(np.asarray(dist.pgf_derivative(q_max[1:]), dtype=np.float64))
    log_den = np.log(np.asarray(dist.pgf_derivative(qp[:-1]), dtype=np.float64))
  cells = log_num - log_den
  if np.any(np.isnan(cells)):
    return math.inf
  return eps + max(0.0, float(np.max(cells)))


def liu_talwar_method(event, orders: np.ndarray) -> ProfileGuarantee:
  """Accountant method "liu-talwar" (pure-DP guarantees; see the module docstring)."""
  if isinstance(event, ThresholdSelect):
    eps1 = pure_epsilon(event.base, orders)
    if eps1 is None:
      raise prof_lib.not_applicable(
          "Liu-Talwar Thm 3.1 for an (eps, delta)-DP base: delta' is not recoverable "
          "from the paper; needs a pure-DP base")
    gamma, t = event.stop_prob, event.max_iterations
    if t is None:
      eps, theorem = 2.0 * eps1, "LT Thm 3.1(b), T = inf: 2 eps1"
    else:
      eps, theorem = t * eps1, "composition of T calls"
      if t >= 1.0 + 1.0 / (math.e * gamma):
        lt = 2.0 * eps1 + 2.0 * math.exp(-gamma * t)
        if lt < eps:
          eps, theorem = lt, "LT Thm 3.1(b): 2 eps1 + 2 exp(-gamma T)"
    return ProfileGuarantee(prof_lib.PureDpProfile(eps), theorem)
  if not isinstance(event, RepeatAndSelect):
    raise prof_lib.not_applicable("Liu-Talwar bounds cover ThresholdSelect and random stopping")
  dist = event.distribution
  is_geom = isinstance(dist, dist_lib.TruncatedNegativeBinomial) and dist.eta == 1.0
  if not (is_geom or isinstance(dist, CappedGeometric)):
    raise prof_lib.not_applicable(f"Liu-Talwar random stopping needs a geometric K, got {dist!r}")
  eps1 = pure_epsilon(event.base, orders)
  if eps1 is None:
    raise prof_lib.not_applicable(
        "Liu-Talwar Thm 3.2 / 3.5 need a pure-DP base (Thm 3.4's (eps, delta) constants "
        "are not recoverable); use method 'profile'")
  eps = pure_selection_epsilon(eps1, dist)
  theorem = "LT Thm 3.5 via PS Lemma 7, pure limit (numerical)"
  if is_geom and 3.0 * eps1 <= eps:
    eps, theorem = 3.0 * eps1, "LT Thm 3.2: 3 eps1"
  elif is_geom:
    theorem = "LT Thm 3.2 sharpened by PS Lemma 7, pure limit (numerical)"
  return ProfileGuarantee(prof_lib.PureDpProfile(eps), theorem)
