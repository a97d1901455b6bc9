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
  >>> prof = profiles.GaussianProfile(0.25)   # GaussianDpEvent(4.0): mu = 1/4
  >>> round(prof.epsilon(1e-5), 4)
  0.9263
  >>> pld = profiles.PldProfile(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(8.0), 4))
  >>> round(pld.epsilon(1e-5), 3)
  0.926
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import dp_accounting as dpa
import numpy as np
from scipy import special

from jaxdp import _validate
from jaxdp.accounting import _dpa
from jaxdp.accounting import _dpa_pld
from jaxdp.accounting import events as ev_lib

#: PLD discretisation (in privacy-loss units). dp-accounting's default; the
#: KRW sanity values of REFERENCE section 9.6 use it.
PLD_DISCRETIZATION = 1e-4


#: Relative width to which `epsilon` brackets the smallest valid eps.
EPSILON_RTOL = 1e-12


class PrivacyProfile:
  """A symmetric upper bound eps -> delta(eps) of a mechanism's privacy profile.

  Subclasses implement `_delta_nonneg` (vectorised over eps >= 0) and may
  give `_epsilon_guess`, a closed form or library inverse that seeds the
  search. `pure_epsilon`, if not None, is an eps with delta(eps') = 0 for
  every eps' >= eps.

  Guarantees of `epsilon(delta)`: it returns e >= 0 with delta(e) <= delta
  evaluated by this profile's own `delta` (so no rounding of an inverse
  formula can make it optimistic), and e is the smallest such value up to
  EPSILON_RTOL * max(1, e): delta(e - EPSILON_RTOL * max(1, e)) > delta
  unless e = 0. It returns inf if no eps <= 2^40 qualifies. Every loop is
  bounded, whatever delta (subnormal, 0).
  """

  pure_epsilon: Optional[float] = None
  description: str = "privacy profile"

  @property
  def nbytes(self) -> int:
    """Bytes of large arrays this profile holds (for caches that bound their memory)."""
    return 0

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

  def _epsilon_guess(self, delta: float) -> Optional[float]:
    """An approximate inverse (it may err either way); None if there is none."""
    return None

  def _accepts(self, eps: float, delta: float) -> bool:
    """Whether delta(eps) <= delta, the test `epsilon` inverts (subclasses may
    evaluate it more accurately, e.g. in log space)."""
    return self.delta(eps) <= delta

  def epsilon(self, delta: float) -> float:
    """Smallest eps >= 0 (rounded up) with delta(eps) <= `delta`; inf if none."""
    delta = _validate.real("delta", delta, low=0.0)
    if delta >= 1.0:
      return 0.0
    return _smallest_accepted(lambda e: self._accepts(e, delta), self._epsilon_guess(delta),
                              self.pure_epsilon)


#: The largest eps `epsilon` looks at before answering inf.
_EPS_MAX = 2.0 ** 40


def _smallest_accepted(ok, guess: Optional[float], pure: Optional[float]) -> float:
  """Smallest eps >= 0 with ok(eps), for ok monotone (false, then true).

  Brackets around `guess` (or doubles from 1), then bisects until the bracket
  is EPSILON_RTOL * max(1, hi) wide; returns the accepted end. At most ~400
  calls of `ok`.
  """
  if ok(0.0):
    return 0.0
  lo, hi = 0.0, None
  if guess is not None and math.isfinite(guess) and 0.0 < guess < _EPS_MAX:
    step = 1e-9 * max(1.0, guess)
    cand = guess
    for _ in range(64):  # grow above the guess until accepted
      if ok(cand):
        hi = cand
        break
      lo, cand, step = cand, cand + step, 2.0 * step
    if hi is not None and hi == guess:
      cand, step = guess, 1e-9 * max(1.0, guess)
      for _ in range(64):  # and shrink below it until rejected
        cand = max(0.0, cand - step)
        if not ok(cand):
          lo = cand
          break
        hi, step = cand, 2.0 * step
        if cand == 0.0:
          return 0.0
  if hi is None:
    if pure is not None and math.isfinite(pure) and ok(pure):
      hi = pure
    else:
      cand = max(1.0, 2.0 * lo)
      while cand <= _EPS_MAX and not ok(cand):
        lo, cand = cand, 2.0 * cand
      if cand > _EPS_MAX:
        return math.inf
      hi = cand
  if pure is not None and lo < pure < hi and ok(pure):
    hi = pure  # delta is 0 from pure_epsilon on: it may itself be the answer
  # Bisection keeps ok(hi) at every step: the answer errs on the private side.
  for _ in range(200):
    if hi - lo <= EPSILON_RTOL * max(1.0, hi):
      break
    mid = 0.5 * (lo + hi)
    if mid in (lo, hi):
      break
    if ok(mid):
      hi = mid
    else:
      lo = mid
  return hi


class GaussianProfile(PrivacyProfile):
  """Exact profile of the Gaussian mechanism (Balle & Wang 2018, Thm 8).

  delta(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu), mu = sensitivity / sigma.
  `epsilon` inverts it in log space, so deltas down to the smallest subnormal
  get a correct (large) epsilon, and delta = 0 gets inf.

  Example:
    >>> round(GaussianProfile(0.25).epsilon(1e-5), 4)
    0.9263
  """

  def __init__(self, mu: float):
    self.mu = _validate.real("mu", mu, low=0.0, low_open=True)
    self.description = f"analytic Gaussian profile (mu = sensitivity/sigma = {self.mu:.6g})"

  def _log_delta(self, eps):
    mu = self.mu
    # Log space: both terms are tiny for large eps and nearly equal near eps = 0.
    with np.errstate(divide="ignore", invalid="ignore"):
      log_a = special.log_ndtr(mu / 2.0 - eps / mu)
      log_b = eps + special.log_ndtr(-mu / 2.0 - eps / mu)
      return log_a + np.log(-np.expm1(np.minimum(log_b - log_a, 0.0)))

  def _delta_nonneg(self, eps):
    with np.errstate(invalid="ignore"):
      out = np.exp(self._log_delta(eps))
    # eps = inf gives NaN (inf - inf) and delta 0; any other NaN means "no bound".
    return np.where(np.isinf(eps), 0.0, np.where(np.isnan(out), 1.0, out))

  def _accepts(self, eps, delta):
    if delta <= 0.0:
      return False  # the Gaussian profile is positive for every eps
    # Compare logarithms with a margin for their rounding (terms up to ~eps^2/mu^2),
    # so a delta(eps) that underflows to a subnormal or 0 cannot pass early.
    log_d = float(self._log_delta(np.array([eps]))[0])
    return log_d + 1e-12 * (1.0 + abs(log_d)) <= math.log(delta)

  def _epsilon_guess(self, delta):
    if delta <= 0.0:
      return None
    # Chernoff: delta <= exp(-(eps - mu^2/2)^2 / (2 mu^2)).
    mu = self.mu
    return mu * mu / 2.0 + mu * math.sqrt(2.0 * -math.log(delta)) if delta < 1.0 else None

  def epsilon(self, delta):
    delta = _validate.real("delta", delta, low=0.0)
    if delta <= 0.0:
      return math.inf
    return super().epsilon(delta)


def _randomized_response(eps0: float, eps):
  """(e^eps0 - e^eps)_+ / (1 + e^eps0) = -expm1(min(eps - eps0, 0)) / (1 + e^-eps0):
  no overflow for large eps or eps0, no cancellation near eps0."""
  return -np.expm1(np.minimum(np.asarray(eps, dtype=np.float64) - eps0, 0.0)) / (1.0 + math.exp(-eps0))


def _randomized_response_epsilon(eps0: float, delta: float) -> float:
  """(e^eps0 - e^eps) / (1 + e^eps0) = delta solved for eps (0 if none), a seed for the search.

  As eps0 + log(1 - delta (1 + e^-eps0)) once e^eps0 overflows (eps0 > ~709.78).
  """
  if eps0 <= _dpa.MAX_EXP_ARG:
    val = math.exp(eps0) - delta * (1.0 + math.exp(eps0))
    return math.log(val) if val > 0 else 0.0
  val = 1.0 - delta * (1.0 + math.exp(-eps0))
  return eps0 + math.log(val) if val > 0 else 0.0


class PureDpProfile(PrivacyProfile):
  """Profile of eps0-DP: randomized response, (e^eps0 - e^eps)_+ / (1 + e^eps0)."""

  def __init__(self, epsilon: float):
    self.eps0 = _validate.real("epsilon", epsilon, low=0.0)
    self.pure_epsilon = self.eps0
    self.description = f"pure {self.eps0:.6g}-DP (randomized response)"

  def _delta_nonneg(self, eps):
    return _randomized_response(self.eps0, eps)

  def _epsilon_guess(self, delta):
    return _randomized_response_epsilon(self.eps0, delta)


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
    # delta(eps) = delta0 for every eps >= eps0: the search may stop there.
    self.pure_epsilon = self.eps0 if self.delta0 == 0.0 else None
    self._flat_from = self.eps0
    self.description = f"({self.eps0:.6g}, {self.delta0:.3g})-DP"

  def _delta_nonneg(self, eps):
    return self.delta0 + (1.0 - self.delta0) * _randomized_response(self.eps0, eps)

  def _epsilon_guess(self, delta):
    if delta < self.delta0:
      return None
    return _randomized_response_epsilon(self.eps0, (delta - self.delta0) / (1.0 - self.delta0))

  def epsilon(self, delta):
    delta = _validate.real("delta", delta, low=0.0)
    if delta < 1.0 and not self._accepts(self.eps0, delta):
      return math.inf  # delta(eps) >= delta(eps0) = delta0 > delta for every eps
    return _smallest_accepted(lambda e: self._accepts(e, delta), self._epsilon_guess(delta),
                              self.eps0) if delta < 1.0 else 0.0


class PldProfile(PrivacyProfile):
  """Profile of a DpEvent from dp-accounting's PLD accountant (add/remove-one).

  The PLD value is inf_mass + sum_{L > eps} p_L (1 - e^(eps - L)) maximised
  over the remove and add PLDs, dp-accounting's own formula, evaluated from
  suffix sums (O(log n) per eps instead of dp-accounting's Python loop over
  every atom). Pessimistic discretisation (module docstring) makes it an upper
  bound wherever FFT round-off is negligible, i.e. at or above
  `_dpa_pld.PLD_DELTA_FLOOR` (see its measurement). Below the floor the PLD only
  says "delta(eps) < floor", so this profile is

    delta(eps) = min(max(pld(eps), floor), rdp_fallback.delta(eps)),

  a pointwise min of two valid upper bounds (the RDP term only if given):
  never optimistic. Without a fallback, epsilon(delta) is inf for delta
  below the floor.

  Args:
    event: a DpEvent that dp-accounting's `PLDAccountant` supports.
    value_discretization_interval: PLD discretisation in privacy-loss units;
      None picks it with `_dpa_pld.pld_interval_for(event)` (coarser for events
      with a large privacy loss; still pessimistic, only looser).
    rdp_fallback: an `RdpProfile` of the same event, used below the floor and
      wherever it is tighter.

  Example:
    >>> import dp_accounting as dpa
    >>> ev = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.0)), 1000)
    >>> round(PldProfile(ev).epsilon(1e-6), 2)
    2.12
  """

  def __init__(self, event: dpa.DpEvent, value_discretization_interval: Optional[float] = PLD_DISCRETIZATION,
               rdp_fallback: Optional["RdpProfile"] = None):
    if value_discretization_interval is None:
      value_discretization_interval = _dpa_pld.pld_interval_for(event)
    self.event = event
    self.interval = _validate.real("value_discretization_interval", value_discretization_interval,
                                   low=0.0, low_open=True)
    self.floor = _dpa_pld.PLD_DELTA_FLOOR
    self.rdp_fallback = rdp_fallback
    self._pld, self._non_private = _dpa_pld.pld_of_event(event, self.interval)
    tables = [_dpa_pld.pmf_table(p) for p in _dpa_pld.pld_pmfs(self._pld)]
    self._tables = None if any(t is None for t in tables) else tables
    self.description = (f"PLD (dp-accounting, connect-the-dots, pessimistic, discretisation "
                        f"{self.interval:g}; values below {self.floor:g} not trusted"
                        + ("; RDP fallback)" if rdp_fallback is not None else ")"))

  @property
  def nbytes(self) -> int:
    tables = sum(a.nbytes for t in (self._tables or ()) for a in t[:3])
    return _dpa_pld.pld_nbytes(self._pld) + tables

  def raw_pld_delta(self, epsilon):
    """The PLD's own hockey-stick value, without the floor: an upper bound only
    at or above `_dpa_pld.PLD_DELTA_FLOOR` (for tests and diagnostics)."""
    eps = np.atleast_1d(np.asarray(epsilon, dtype=np.float64))
    if self._non_private:
      out = np.ones_like(eps)
    elif self._tables is None:  # sparse PMFs: dp-accounting's scalar path
      out = np.array([_dpa_pld.pld_delta(self._pld, float(e)) for e in eps])
    else:
      out = np.max([_dpa_pld.suffix_delta(t, eps) for t in self._tables], axis=0)
    return float(out[0]) if np.ndim(epsilon) == 0 else out.reshape(np.shape(epsilon))

  def _pld_bound(self, eps):
    return np.maximum(np.atleast_1d(self.raw_pld_delta(eps)), self.floor)

  def _delta_nonneg(self, eps):
    out = self._pld_bound(eps)
    if self.rdp_fallback is not None:
      out = np.minimum(out, self.rdp_fallback._delta_nonneg(eps))  # pylint: disable=protected-access
    return out

  def _pld_epsilon(self, delta):
    if self._non_private or delta < self.floor:
      return math.inf
    # With suffix tables every evaluation is O(log n), so bisecting from no
    # guess (~50 evaluations, ~2 ms) beats dp-accounting's inverse, a Python
    # loop over the atoms (~20-40 ms for DP-SGD). The answer is the same
    # smallest accepted eps up to EPSILON_RTOL, and accepted either way.
    guess = None if self._tables is not None else _dpa_pld.pld_epsilon(self._pld, max(delta, self.floor))
    return _smallest_accepted(lambda e: float(self._pld_bound(np.array([e]))[0]) <= delta, guess, None)

  def epsilon(self, delta):
    delta = _validate.real("delta", delta, low=0.0)
    if delta >= 1.0:
      return 0.0
    # epsilon of a pointwise min of two profiles is the min of their epsilons.
    eps = self._pld_epsilon(delta)
    if self.rdp_fallback is not None:
      eps = min(eps, self.rdp_fallback.epsilon(delta))
    return eps

  def source(self, delta: float) -> str:
    """"PLD" or "RDP": which bound `epsilon(delta)` comes from."""
    if self.rdp_fallback is not None and self.rdp_fallback.epsilon(delta) < self._pld_epsilon(delta):
      return "RDP"
    return "PLD"


class RdpProfile(PrivacyProfile):
  """Profile from an RDP curve: the Canonne-Kamath-Steinke conversion (with
  dp-accounting's KL bound), minimised over the orders. Valid, not tight."""

  def __init__(self, orders: np.ndarray, rdp: np.ndarray, pure_epsilon: Optional[float] = None):
    self.orders = np.asarray(orders, dtype=np.float64)
    self.rdp = np.asarray(rdp, dtype=np.float64)
    self.pure_epsilon = pure_epsilon
    self.description = "RDP curve converted to a profile (Canonne-Kamath-Steinke)"
    self._deltas = None

  def _delta_nonneg(self, eps):
    # One vectorised conversion, bit for bit `rdp_to_delta` at each eps.
    if self._deltas is None:
      self._deltas = _dpa.RdpDeltas(self.orders, self.rdp)
    out = self._deltas(eps)
    if self.pure_epsilon is not None:
      out = np.minimum(out, PureDpProfile(self.pure_epsilon)._delta_nonneg(eps))  # pylint: disable=protected-access
    return out

  def _epsilon_guess(self, delta):
    if delta <= 0.0:
      return None
    eps = _dpa.rdp_to_epsilon(self.orders, self.rdp, delta)
    if self.pure_epsilon is not None:
      eps = min(eps, self.pure_epsilon)
    return eps


class ScaledShiftedProfile(PrivacyProfile):
  """delta(eps) = min(1, scale * inner.delta(eps - shift) + atom * (1 - e^eps)_+): every KRW selection bound.

  `epsilon` searches for the smallest eps >= 0 whose product
  scale * inner.delta(eps - shift) is <= delta, evaluated directly (not
  inner.epsilon(delta / scale) + shift, which rounding of delta / scale can
  push either way); eps - shift may be negative, where inner.delta is defined.

  `atom` is P[K = 0] of a selection: the fixed output released when no run
  happens has that mass under both neighbours, so it adds
  (atom - e^eps atom)_+ to the hockey-stick divergence, 0 for eps >= 0 (every
  reported epsilon) and atom (1 - e^eps) below; the KRW bound covers the
  other outputs at every real eps (`profile_selection`).
  """

  def __init__(self, inner: PrivacyProfile, scale: float, shift: float, description: str = "",
               atom: float = 0.0):
    self.inner, self.scale, self.shift = inner, float(scale), float(shift)
    self.atom = _validate.probability("atom", atom, zero_ok=True, one_ok=True)
    if inner.pure_epsilon is not None:
      self.pure_epsilon = max(0.0, inner.pure_epsilon + self.shift)
    self.description = description or f"{scale:.6g} x ({inner.description}) shifted by {shift:.6g}"

  def delta(self, epsilon):
    eps = np.asarray(epsilon, dtype=np.float64)
    out = self.scale * np.asarray(self.inner.delta(eps - self.shift))
    if self.atom > 0.0:
      out = out - self.atom * np.expm1(np.minimum(eps, 0.0))
    out = np.minimum(1.0, out)
    return float(out) if np.ndim(out) == 0 else out

  def _delta_nonneg(self, eps):
    return self.delta(eps)

  def _epsilon_guess(self, delta):
    inner = self.inner.epsilon(min(1.0, delta / self.scale)) if delta > 0 else math.inf
    return inner + self.shift if math.isfinite(inner) else None


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
    # delta(e) <= delta iff every member's is: the max of the members' epsilons.
    return max(p.epsilon(delta) for p in self.profiles)


class MinProfile(PrivacyProfile):
  """Pointwise min of several upper bounds of the same mechanism's profile.

  Each member bounds the true profile, so their min does too: the tighter of,
  e.g., a PLD and an RDP bound (see `tighter_of`). epsilon(delta) is the min
  of the members' epsilons, and `source(delta)` names the member it came from.
  """

  def __init__(self, profiles: Sequence[PrivacyProfile]):
    self.profiles = tuple(profiles)
    if not self.profiles:
      raise ValueError("profiles must be a non-empty sequence of PrivacyProfiles, got ()")
    pures = [p.pure_epsilon for p in self.profiles if p.pure_epsilon is not None]
    self.pure_epsilon = min(pures) if pures else None
    self.description = "tighter of " + "; ".join(p.description for p in self.profiles)

  def delta(self, epsilon):
    out = np.min([np.asarray(p.delta(epsilon)) for p in self.profiles], axis=0)
    return float(out) if np.ndim(out) == 0 else out

  def _delta_nonneg(self, eps):
    return self.delta(eps)

  def epsilon(self, delta):
    return min(p.epsilon(delta) for p in self.profiles)

  def source(self, delta: float) -> str:
    """The description of the member whose epsilon(delta) is the smallest."""
    return min(self.profiles, key=lambda p: p.epsilon(delta)).description


def tighter_of(*profiles: PrivacyProfile) -> MinProfile:
  """The pointwise min of upper bounds of one mechanism's profile, e.g.
  `tighter_of(PldProfile(event), RdpProfile(orders, rdp))`."""
  return MinProfile(profiles)


def report_noisy_max_profile(rnm: ev_lib.ReportNoisyMax) -> PrivacyProfile:
  """KRW Thm 3.2 (k = 1) and Thm 3.3 (k rounds): delta(eps) <= m^k delta_Delta^(k)(eps).

  delta_Delta^(k) is the profile of k compositions of the Gaussian mechanism at
  sensitivity Delta = 2 (1 if all scores move in the same direction): a
  Gaussian with mu = Delta sqrt(k) / sigma.
  """
  mu = rnm.score_sensitivity * math.sqrt(rnm.num_rounds) / rnm.noise_multiplier
  return ScaledShiftedProfile(GaussianProfile(mu), float(rnm.num_candidates) ** rnm.num_rounds, 0.0,
                              f"KRW Thm 3.{2 if rnm.num_rounds == 1 else 3}: "
                              f"{rnm.num_candidates}^{rnm.num_rounds} x Gaussian(mu={mu:.6g})")
