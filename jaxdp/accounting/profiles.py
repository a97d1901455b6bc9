"""Privacy profiles delta_Q(eps) of one candidate run (the base mechanism Q).

A privacy profile is the hockey-stick divergence
delta(eps) = max_{X ~ X'} H_{e^eps}(Q(X) || Q(X')), H_a(P||R) = int [P - a R]_+.
Koskela, Redberg & Wang (ICML 2024) bound the profile of repeat-and-select
from pointwise values of the base profile; this module provides those values.

Every profile here is an *upper bound* of the true one, symmetric (the max over
both neighbouring orders, add and remove), and defined for every real eps: for
eps < 0 it uses H_{e^-a}(P||R) = 1 - e^-a + e^-a H_{e^a}(R||P) (REFERENCE
section 0), which the symmetric profile at a = -eps bounds.

Sources, by base:
  * `dp_accounting.GaussianDpEvent` (and its self-composition): the exact
    Balle & Wang (2018) analytic Gaussian profile.
  * other DpEvents that dp-accounting's `PLDAccountant` supports (DP-SGD =
    self-composed Poisson-subsampled Gaussian): the privacy-loss distribution
    with *pessimistic* discretisation. dp-accounting builds the Gaussian and
    Laplace PLDs with the connect-the-dots algorithm (Doroshenko et al. 2022)
    and `pessimistic_estimate=True` (losses rounded up, truncated tails moved to
    +inf), so the resulting hockey-stick values upper-bound the true ones.
  * `PureDp(eps)`: randomized response (the dominating pair of every eps-DP
    mechanism, exact).
  * `ApproxDp(eps, delta)`: the 4-output dominating pair of every
    (eps, delta)-DP mechanism (Kairouz, Oh & Viswanath 2015), exact.
  * `ReportNoisyMax`: KRW Thm 3.2 / 3.3 (m^k times a Gaussian profile).
  * anything with only an RDP curve (`Zcdp`, `RdpCurve`, other DpEvents): the
    RDP-to-(eps, delta) conversion (Canonne-Kamath-Steinke), minimised over
    the orders: valid, but not tight.

Example:
  >>> import dp_accounting as dpa
  >>> from jaxdp.accounting import profiles
  >>> prof = profiles.base_profile(dpa.GaussianDpEvent(4.0))
  >>> round(prof.epsilon(1e-5), 4)
  0.9263
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import dp_accounting as dpa
import numpy as np
from scipy import optimize, special

from jaxdp import _validate
from jaxdp.accounting import guarantees as g_lib

_rdp_lib = dpa.rdp.rdp_privacy_accountant

#: PLD discretisation (in privacy-loss units). dp-accounting's default; the
#: KRW sanity values of REFERENCE section 9.6 use it.
PLD_DISCRETIZATION = 1e-4


def not_applicable(reason: str) -> Exception:
  """`accountant.NotApplicableError(reason)` (imported late: accountant imports us)."""
  from jaxdp.accounting import accountant  # pylint: disable=g-import-not-at-top
  return accountant.NotApplicableError(reason)


class PrivacyProfile:
  """A symmetric upper bound eps -> delta(eps) of a mechanism's privacy profile.

  Subclasses implement `_delta_nonneg` (vectorised over eps >= 0) and may
  override `epsilon` with a closed form. `pure_epsilon`, if not None, is an eps
  with delta(eps') = 0 for every eps' >= eps.
  """

  pure_epsilon: Optional[float] = None
  description: str = "privacy profile"

  def _delta_nonneg(self, eps: np.ndarray) -> np.ndarray:
    raise NotImplementedError

  def delta(self, epsilon):
    """Upper bound of delta(epsilon), for scalar or array `epsilon` (any real)."""
    eps = np.asarray(epsilon, dtype=np.float64)
    flat = np.atleast_1d(eps).ravel()
    out = np.empty_like(flat)
    pos = flat >= 0
    if pos.any():
      out[pos] = self._delta_nonneg(flat[pos])
    if (~pos).any():
      # H_{e^-a}(P||R) = 1 - e^-a + e^-a H_{e^a}(R||P) <= 1 - e^-a (1 - delta(a)).
      a = -flat[~pos]
      out[~pos] = -np.expm1(-a) + np.exp(-a) * self._delta_nonneg(a)
    # NaN would compare as "small enough" downstream: treat it as no privacy.
    out = np.clip(np.where(np.isnan(out), 1.0, out), 0.0, 1.0)
    return float(out[0]) if eps.ndim == 0 else out.reshape(eps.shape)

  def _round_up(self, eps: float, delta: float) -> float:
    """Smallest eps' >= eps found by growing steps with self.delta(eps') <= delta.

    Closed forms and dp-accounting's inverse can disagree with `delta` in the
    last bits; this keeps epsilon(delta) and delta(epsilon) consistent.
    """
    step = 1e-13 * max(1.0, abs(eps))
    for _ in range(200):
      if not math.isfinite(eps) or self.delta(eps) <= delta:
        return eps
      eps, step = eps + step, step * 2.0
    return math.inf

  def epsilon(self, delta: float) -> float:
    """Smallest eps >= 0 (rounded up) with delta(eps) <= `delta`; inf if none."""
    if delta >= 1.0:
      return 0.0
    if self.delta(0.0) <= delta:
      return 0.0
    if self.pure_epsilon is not None:
      hi = self.pure_epsilon
    else:
      hi = 1.0
      while self.delta(hi) > delta:
        hi *= 2.0
        if hi > 1e4:
          return math.inf
    lo = 0.0
    # Bisection keeps delta(hi) <= target at every step: the answer errs on the private side.
    for _ in range(200):
      if hi - lo <= 1e-12 * max(1.0, hi):
        break
      mid = 0.5 * (lo + hi)
      if self.delta(mid) <= delta:
        hi = mid
      else:
        lo = mid
    return hi


class GaussianProfile(PrivacyProfile):
  """Exact profile of the Gaussian mechanism (Balle & Wang 2018, Thm 8).

  delta(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu), mu = sensitivity / sigma.
  """

  def __init__(self, mu: float):
    self.mu = _validate.real("mu", mu, low=0.0, low_open=True)
    self.description = f"analytic Gaussian profile (mu = sensitivity/sigma = {self.mu:.6g})"

  def _delta_nonneg(self, eps):
    mu = self.mu
    # Log space: both terms are tiny for large eps and nearly equal near eps = 0.
    log_a = special.log_ndtr(mu / 2.0 - eps / mu)
    log_b = eps + special.log_ndtr(-mu / 2.0 - eps / mu)
    with np.errstate(divide="ignore", invalid="ignore"):
      out = np.exp(log_a) * -np.expm1(np.minimum(log_b - log_a, 0.0))
    return np.where(np.isfinite(out), out, 0.0)

  def epsilon(self, delta):
    if delta >= 1.0 or self._delta_nonneg(np.array([0.0]))[0] <= delta:
      return 0.0
    fun = lambda e: math.log(max(float(self._delta_nonneg(np.array([e]))[0]), 1e-320)) - math.log(delta)
    hi = 1.0
    while fun(hi) > 0:
      hi *= 2.0
    eps = optimize.brentq(fun, 0.0, hi, xtol=1e-13, rtol=1e-13)
    return self._round_up(eps, delta)  # round towards privacy


class PureDpProfile(PrivacyProfile):
  """Profile of eps0-DP: randomized response, (e^eps0 - e^eps)_+ / (1 + e^eps0)."""

  def __init__(self, epsilon: float):
    self.eps0 = _validate.real("epsilon", epsilon, low=0.0)
    self.pure_epsilon = self.eps0
    self.description = f"pure {self.eps0:.6g}-DP (randomized response)"

  def _delta_nonneg(self, eps):
    return np.maximum(np.exp(self.eps0) - np.exp(eps), 0.0) / (1.0 + math.exp(self.eps0))

  def epsilon(self, delta):
    return 0.0 if self.delta(0.0) <= delta else self.eps0


class ApproxDpProfile(PrivacyProfile):
  """Profile implied by (eps0, delta0)-DP: delta0 + (1 - delta0) RR_{eps0}(eps).

  Every (eps0, delta0)-DP pair is a post-processing of the 4-output pair
  P = (delta0, (1-delta0) e^eps0/(1+e^eps0), (1-delta0)/(1+e^eps0), 0) and its
  mirror image (Kairouz, Oh & Viswanath 2015, Thm 2.1), whose hockey-stick
  divergence is the formula above: the tightest profile (eps0, delta0) implies.
  """

  def __init__(self, epsilon: float, delta: float):
    self.eps0 = _validate.real("epsilon", epsilon, low=0.0)
    self.delta0 = _validate.probability("delta", delta, zero_ok=True, one_ok=True)
    if self.delta0 == 0.0:
      self.pure_epsilon = self.eps0
    self.description = f"({self.eps0:.6g}, {self.delta0:.3g})-DP"

  def _delta_nonneg(self, eps):
    rr = np.maximum(np.exp(self.eps0) - np.exp(eps), 0.0) / (1.0 + math.exp(self.eps0))
    return self.delta0 + (1.0 - self.delta0) * rr

  def epsilon(self, delta):
    if self.delta(0.0) <= delta:
      return 0.0
    if self.delta0 > delta:
      return math.inf
    if self.delta0 == delta:
      return self.eps0
    # delta0 + (1-delta0)(e^eps0 - e^eps)/(1+e^eps0) = delta, solved for eps.
    val = math.exp(self.eps0) - (delta - self.delta0) / (1.0 - self.delta0) * (1.0 + math.exp(self.eps0))
    eps = math.log(val) if val > 0 else 0.0
    return min(self._round_up(max(eps, 0.0), delta), self.eps0)


class PldProfile(PrivacyProfile):
  """Profile of a DpEvent from dp-accounting's PLD accountant (add/remove-one).

  delta(eps) = max over the remove and add PLDs of
  inf_mass + sum_{L > eps} p_L (1 - e^(eps - L)), dp-accounting's own formula,
  evaluated from suffix sums (O(log n) per eps instead of dp-accounting's
  Python loop over every atom). Pessimistic discretisation (module docstring)
  makes every value an upper bound. Built once per (event, discretisation).
  """

  def __init__(self, event: dpa.DpEvent, value_discretization_interval: float = PLD_DISCRETIZATION):
    self.event = event
    self.interval = value_discretization_interval
    self._pld, self._non_private, self._tables = _pld(event, value_discretization_interval)
    self.description = (f"PLD (dp-accounting, connect-the-dots, pessimistic, "
                        f"discretisation {value_discretization_interval:g})")

  def _delta_nonneg(self, eps):
    if self._non_private:
      return np.ones_like(eps)
    if self._tables is None:  # sparse PMFs: dp-accounting's scalar path
      return np.array([float(self._pld.get_delta_for_epsilon(float(e))) for e in eps])
    return np.max([_suffix_delta(t, eps) for t in self._tables], axis=0)

  def epsilon(self, delta):
    if delta >= 1.0:
      return 0.0
    if self._non_private:
      return math.inf
    # dp-accounting's inverse, made consistent with our (never smaller) delta.
    return self._round_up(float(self._pld.get_epsilon_for_delta(delta)), delta)


def _suffix_tables(pmf):
  """(losses, U, W, inf_mass): U[i] = sum_{j>=i} p_j, W[i] = sum_{j>=i} p_j e^-L_j."""
  if not hasattr(pmf, "_probs"):
    return None
  probs = np.asarray(pmf._probs, dtype=np.float64)  # pylint: disable=protected-access
  losses = (np.arange(probs.size) + pmf._lower_loss) * pmf._discretization  # pylint: disable=protected-access
  probs = np.maximum(probs, 0.0)  # FFT round-off can leave tiny negative masses
  with np.errstate(divide="ignore"):
    w = np.exp(np.log(probs) - losses)
  # Reverse cumulative sums add the small tail terms first.
  upper = np.append(np.cumsum(probs[::-1])[::-1], 0.0)
  lower = np.append(np.cumsum(w[::-1])[::-1], 0.0)
  return losses, upper, lower, float(pmf._infinity_mass)  # pylint: disable=protected-access


def _suffix_delta(table, eps):
  losses, upper, lower, inf_mass = table
  idx = np.searchsorted(losses, eps, side="right")  # first atom with L > eps
  val = inf_mass + upper[idx] - np.exp(eps) * lower[idx]
  # The subtraction loses at most a few ulps of upper[idx]; add them back so
  # rounding can never make the value optimistic.
  return np.maximum(val, 0.0) + 8.0 * np.finfo(np.float64).eps * upper[idx]


@g_lib.cache_per_event(maxsize=32)
def _pld(event, interval):
  # Composition (an FFT per self-composition) is the expensive part: ~0.4 s for
  # DP-SGD with 14063 steps, so it is cached per event.
  accountant = dpa.pld.PLDAccountant(value_discretization_interval=interval)
  accountant.compose(event)
  pld = accountant._pld  # pylint: disable=protected-access
  pmfs = [pld._pmf_remove] if pld._symmetric else [pld._pmf_remove, pld._pmf_add]  # pylint: disable=protected-access
  tables = [_suffix_tables(p) for p in pmfs]
  return pld, accountant._contains_non_dp_event, (None if any(t is None for t in tables) else tables)  # pylint: disable=protected-access


class RdpProfile(PrivacyProfile):
  """Profile from an RDP curve: the Canonne-Kamath-Steinke conversion (with
  dp-accounting's KL bound), minimised over the orders. Valid, not tight."""

  def __init__(self, orders: np.ndarray, rdp: np.ndarray, pure_epsilon: Optional[float] = None):
    self.orders = np.asarray(orders, dtype=np.float64)
    self.rdp = np.asarray(rdp, dtype=np.float64)
    self.pure_epsilon = pure_epsilon
    self.description = "RDP curve converted to a profile (Canonne-Kamath-Steinke)"

  def _delta_nonneg(self, eps):
    out = np.array([_rdp_lib.compute_delta(self.orders, self.rdp, float(e))[0] for e in eps])
    if self.pure_epsilon is not None:
      out = np.minimum(out, PureDpProfile(self.pure_epsilon)._delta_nonneg(eps))
    return out

  def epsilon(self, delta):
    eps = float(_rdp_lib.compute_epsilon(self.orders, self.rdp, delta)[0])
    if self.pure_epsilon is not None and self.pure_epsilon < eps:
      return self.pure_epsilon
    # compute_epsilon and compute_delta may disagree in the last bits.
    return self._round_up(eps, delta)


class ScaledShiftedProfile(PrivacyProfile):
  """delta(eps) = min(1, scale * inner.delta(eps - shift)): every KRW selection bound.

  The inverse separates: eps(delta) = inner.eps(delta / scale) + shift.
  """

  def __init__(self, inner: PrivacyProfile, scale: float, shift: float, description: str = ""):
    self.inner, self.scale, self.shift = inner, float(scale), float(shift)
    if inner.pure_epsilon is not None:
      self.pure_epsilon = inner.pure_epsilon + self.shift
    self.description = description or f"{scale:.6g} x ({inner.description}) shifted by {shift:.6g}"

  def delta(self, epsilon):
    out = np.minimum(1.0, self.scale * np.asarray(self.inner.delta(np.asarray(epsilon) - self.shift)))
    return float(out) if np.ndim(out) == 0 else out

  def _delta_nonneg(self, eps):
    return self.delta(eps)

  def epsilon(self, delta):
    if delta >= 1.0:
      return 0.0
    return self._round_up(max(0.0, self.inner.epsilon(delta / self.scale) + self.shift), delta)


class MaxProfile(PrivacyProfile):
  """Pointwise max of several profiles: the profile of "draw a candidate at
  random, run it" when candidates' guarantees differ (the hockey-stick
  divergence is jointly convex, so the mixture is at most the worst candidate;
  KRW Cor 6.2, Koskela & Kulkarni Lemma 1 for RDP)."""

  def __init__(self, profiles: Sequence[PrivacyProfile]):
    self.profiles = tuple(profiles)
    pures = [p.pure_epsilon for p in self.profiles]
    self.pure_epsilon = None if any(p is None for p in pures) else max(pures)
    self.description = "max of " + "; ".join(p.description for p in self.profiles)

  def delta(self, epsilon):
    out = np.max([np.asarray(p.delta(epsilon)) for p in self.profiles], axis=0)
    return float(out) if np.ndim(out) == 0 else out

  def _delta_nonneg(self, eps):
    return self.delta(eps)

  def epsilon(self, delta):
    return max(p.epsilon(delta) for p in self.profiles)


def report_noisy_max_profile(rnm: g_lib.ReportNoisyMax) -> PrivacyProfile:
  """KRW Thm 3.2 (k = 1) and Thm 3.3 (k rounds): delta(eps) <= m^k delta_Delta^(k)(eps).

  delta_Delta^(k) is the profile of k compositions of the Gaussian mechanism at
  sensitivity Delta = 2 (1 if all scores move in the same direction): a
  Gaussian with mu = Delta sqrt(k) / sigma.
  """
  mu = rnm.score_sensitivity * math.sqrt(rnm.num_rounds) / rnm.noise_multiplier
  return ScaledShiftedProfile(GaussianProfile(mu), float(rnm.num_candidates) ** rnm.num_rounds, 0.0,
                              f"KRW Thm 3.{2 if rnm.num_rounds == 1 else 3}: "
                              f"{rnm.num_candidates}^{rnm.num_rounds} x Gaussian(mu={mu:.6g})")


def _gaussian_mu(event) -> Optional[float]:
  """mu = sensitivity/sigma if `event` is a (self-composed) Gaussian, else None."""
  count = 1
  while isinstance(event, dpa.SelfComposedDpEvent):
    count *= event.count
    event = event.event
  if isinstance(event, dpa.GaussianDpEvent) and event.noise_multiplier > 0:
    return math.sqrt(count) / event.noise_multiplier
  return None


def base_profile(base, orders: Optional[np.ndarray] = None,
                 value_discretization_interval: float = PLD_DISCRETIZATION) -> PrivacyProfile:
  """The privacy profile of one run of `base` (not a `RepeatAndSelect`).

  Args:
    base: `PureDp`, `ApproxDp`, `Zcdp`, `RdpCurve`, `ReportNoisyMax`, or a
      `dp_accounting.DpEvent`.
    orders: RDP orders for bases that only have an RDP curve (default grid).
    value_discretization_interval: PLD discretisation for DpEvents.

  Returns:
    A `PrivacyProfile` upper-bounding the symmetric profile of `base`.

  Raises:
    UnsupportedBaseError: `base` cannot be accounted.
  """
  orders = g_lib.check_orders(orders) if orders is None else np.asarray(orders, dtype=np.float64)
  from jaxdp.accounting import subsampled  # pylint: disable=g-import-not-at-top
  if isinstance(base, subsampled.UniformCandidates):
    return MaxProfile([base_profile(c, orders, value_discretization_interval) for c in base.candidates])
  if isinstance(base, g_lib.PureDp):
    return PureDpProfile(base.epsilon)
  if isinstance(base, g_lib.ApproxDp):
    return ApproxDpProfile(base.epsilon, base.delta)
  if isinstance(base, g_lib.ReportNoisyMax):
    return report_noisy_max_profile(base)
  if isinstance(base, (g_lib.Zcdp, g_lib.RdpCurve)):
    return RdpProfile(orders, base.rdp(orders))
  if isinstance(base, dpa.DpEvent):
    mu = _gaussian_mu(base)
    if mu is not None:
      return GaussianProfile(mu)
    if dpa.pld.PLDAccountant().supports(base):
      return PldProfile(base, value_discretization_interval)
    return RdpProfile(orders, g_lib.dp_event_rdp(base, orders))
  raise g_lib.UnsupportedBaseError(f"no privacy profile for base {base!r}")
