"""Privacy-profile accountant (method "profile"; "profile-refined" as an option).

One event's profile (hockey-stick curve, symmetric over add/remove):
  * `GaussianDpEvent` (self-composed): the exact analytic Gaussian profile;
  * other dp-accounting events: the tighter of dp-accounting's pessimistic PLD
    (never below its trusted floor) and the RDP conversion;
  * `PureDp`, `ApproxDp`: their exact dominating pairs; `ReportNoisyMax`:
    KRW Thm 3.2/3.3; `Zcdp`, `RdpCurve`: the RDP conversion;
  * `RepeatAndSelect` (and uncapped `RandomStopping`): Koskela-Redberg-Wang
    bounds m * delta_Q(eps - c) (`profile_selection`), Q's profile found by this
    same accountant (so bases may be compositions or selections themselves);
  * `UniformCandidates`: the pointwise max of the candidates' profiles.

Composition (several parts, or one part several times): every part becomes a
privacy-loss distribution and dp-accounting composes them. dp-accounting's
events give their own PLDs; a jaxdp part becomes the pair whose tradeoff
function is the envelope max_i f_{eps_i, delta_i} over a grid of points of
its profile: a mechanism that is (eps_i, delta_i)-DP for every i is
dominated by that pair (Dong, Roth & Su 2022, Prop. 2.12 with the (eps, delta)
tradeoff functions, all symmetric), whose privacy losses are exactly
+-eps_i; dp-accounting rounds them up (pessimistic). So the composed bound is
valid however coarse the grid; the grid only decides how tight it is. A
dp-accounting part with no PLD (only an RDP curve) makes the whole
composition go by RDP, unless another part has no RDP curve (an
(eps, delta)-DP guarantee): then it enters like a jaxdp part, through the
envelope of its profile.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple, Optional, Sequence

import dp_accounting as dpa
import numpy as np

from jaxdp import _validate
from jaxdp.accounting import _dpa
from jaxdp.accounting import _dpa_pld
from jaxdp.accounting import base
from jaxdp.accounting import distributions as dist_lib
from jaxdp.accounting import events as ev
from jaxdp.accounting import profile_selection as ps
from jaxdp.accounting import profiles as prof_lib
from jaxdp.accounting import rdp_accountant

_Details = base.CompositionErrorDetails


class _Part(NamedTuple):
  """One part composed into a `ProfileAccountant`: `leaf()` is its (profile, theorem)."""

  event: dpa.DpEvent
  count: int
  leaf: Callable[[], tuple]

#: Points of a jaxdp part's profile turned into its dominating PLD.
_ENVELOPE_POINTS = 240


class ProfileAccountant(base.Accountant):
  """Method "profile" (Koskela-Redberg-Wang), or "profile-refined" with `refined=True`.

  Args:
    refined: use the tighter, derived c(eps1) of `profile_selection` (not in
      the paper; `best` uses it only when the caller opts in).
    orders: RDP orders for parts known only by an RDP curve.
    value_discretization_interval: PLD discretisation; None (default) picks it
      per event (`_dpa_pld.pld_interval_for`: finer than 1e-4 never, coarser only
      for events with a large privacy loss; always pessimistic).

  Attributes (after `compose`):
    theorem: the results used, for reports.

  Example:
    >>> import dp_accounting as dpa
    >>> from jaxdp import accounting as acc
    >>> tune = acc.RepeatAndSelect(dpa.GaussianDpEvent(4.0), acc.Geometric(mean=10))
    >>> round(acc.ProfileAccountant().compose(tune).get_epsilon(1e-5), 4)
    1.862
  """

  def __init__(self, refined: bool = False, orders: Optional[Sequence[float]] = None,
               value_discretization_interval: Optional[float] = None):
    super().__init__()
    if not isinstance(refined, bool):
      raise ValueError(f"refined must be a bool, got {refined!r}")
    self.refined = refined
    self.method = "profile-refined" if refined else "profile"
    self._orders = rdp_accountant.check_orders(orders)
    self._interval = (None if value_discretization_interval is None else _validate.real(
        "value_discretization_interval", value_discretization_interval, low=0.0, low_open=True))
    self._parts: list = []  # a _Part for every part composed so far
    self._cache = None

  # ------------------------------------------------------------------ composition

  def _unrolls(self, event) -> bool:
    # dp-accounting-only self-compositions stay one part: one PLD (or the
    # analytic Gaussian profile) for the whole run.
    return not ev.is_dp_accounting_only(event)

  def _fresh(self) -> "ProfileAccountant":
    return ProfileAccountant(self.refined, self._orders, self._interval)

  def _keep(self, event, count, do_compose, leaf: Callable[[], tuple]) -> None:
    """Hold a part this method accounts; `leaf()` gives its (profile, theorem) when the profile is built."""
    if do_compose:
      self._parts.append(_Part(event, count, leaf))
      self._cache = None
    return None

  def _rules(self):
    return {
        ev.PureDp: self._pure_dp, ev.ApproxDp: self._approx_dp, ev.ReportNoisyMax: self._report_noisy_max,
        ev.Zcdp: self._rdp_guarantee, ev.RdpCurve: self._rdp_guarantee,
        ev.UniformCandidates: self._candidates,
        ev.RandomStopping: self._random_stopping,
        ev.RepeatAndSelect: self._repeat_and_select,
        ev.SelectionWithCount: functools.partial(
            self._refuse, "K is released beside the best (SelectionWithCount): KRW bounds hold for "
                          "the mixture over a hidden K only; methods 'composition' and 'pld' cover "
                          "the pair"),
        ev.ThresholdSelect: functools.partial(
            self._refuse, "KRW bounds cover repeat-and-select, not Liu-Talwar's threshold algorithm; "
                          "see method 'liu-talwar'"),
        ev.SubsampledTuning: functools.partial(
            self._refuse, "no privacy-profile theorem for tuning on a subset; Koskela-Kulkarni's "
                          "bounds are RDP (method 'rdp')"),
    }

  def _pure_dp(self, event, count, do_compose) -> Optional[_Details]:
    return self._keep(event, count, do_compose, lambda: (prof_lib.PureDpProfile(event.epsilon), "single run"))

  def _approx_dp(self, event, count, do_compose) -> Optional[_Details]:
    return self._keep(event, count, do_compose,
                      lambda: (prof_lib.ApproxDpProfile(event.epsilon, event.delta), "single run"))

  def _report_noisy_max(self, event, count, do_compose) -> Optional[_Details]:
    def leaf():
      prof = prof_lib.report_noisy_max_profile(event)
      return prof, prof.description
    return self._keep(event, count, do_compose, leaf)

  def _rdp_guarantee(self, event, count, do_compose) -> Optional[_Details]:
    return self._keep(event, count, do_compose,
                      lambda: (prof_lib.RdpProfile(self._orders, event.rdp(self._orders)), "single run"))

  def _candidates(self, event: ev.UniformCandidates, count, do_compose) -> Optional[_Details]:
    for c in event.candidates:
      err = self._fresh().unsupported(c)
      if err is not None:
        return err
    return self._keep(event, count, do_compose, lambda: (
        prof_lib.MaxProfile([self.profile_of(c) for c in event.candidates]),
        "candidates drawn at random (KRW Cor 6.2)"))

  def _random_stopping(self, event: ev.RandomStopping, count, do_compose) -> Optional[_Details]:
    if event.max_iterations is not None:
      return _Details(event, "no privacy-profile theorem for a capped geometric K "
                             "(KRW covers truncated negative binomial, Poisson and binomial)")
    return self._repeat_and_select(rdp_accountant.as_repeat_and_select(event), count, do_compose)

  def _repeat_and_select(self, event: ev.RepeatAndSelect, count, do_compose) -> Optional[_Details]:
    dist = event.distribution
    if not ps.has_theorem(dist):
      return _Details(event, f"no privacy-profile theorem for K ~ {dist!r} (KRW "
                             "covers truncated negative binomial, Poisson and binomial)")
    err = self._fresh().unsupported(event.base)
    if err is None:
      err = self._binomial_p_one(event)
    if err is not None:
      return err
    return self._keep(event, count, do_compose, lambda: self._selection_profile(event))

  def _binomial_p_one(self, event: ev.RepeatAndSelect) -> Optional[_Details]:
    """Why KRW Thm 5.7 does not hold for K ~ Binomial(n > 1, 1) over this base, or None."""
    dist = event.distribution
    if not (isinstance(dist, dist_lib.Binomial) and dist.p == 1.0 and dist.n > 1):
      return None
    # Thm 5.7's condition at p = 1 holds only where the base's profile
    # reaches 0 (`ps.select`); only building that profile tells, and
    # K ~ Binomial(n, 1) is rare enough to pay for it here.
    try:
      pure = self._fresh().compose(event.base).profile().pure_epsilon
    except ev.NotApplicableError as why:
      return _Details(event, str(why))
    if pure is None:
      return _Details(event, "KRW Thm 5.7 with p = 1 (K = n always) needs delta(eps1) = 0 for "
                             "some eps1, a pure-DP base; this base's profile has none")
    return None

  def _selection_profile(self, event: ev.RepeatAndSelect) -> tuple[prof_lib.PrivacyProfile, str]:
    inner = self._fresh().compose(event.base)
    prof, theorem, _, _ = ps.select(inner.profile(), event.distribution, self.refined)
    base = inner.theorem if inner.theorem != "single run" else inner.profile().description
    return prof, f"{theorem} on [{base}]"

  def _dp_accounting_part(self, event, count, do_compose) -> Optional[_Details]:
    if not (_dpa_pld.pld_supports(event) or dpa.rdp.RdpAccountant(list(self._orders)).supports(event)):
      return _Details(event, "neither dp-accounting's PLD nor its RDP accountant supports this event")
    return self._keep(event, count, do_compose, self._dp_leaf(event))

  def _dp_leaf(self, event) -> Callable[[], tuple]:
    return lambda: (_dp_event_profile(event, self._orders, self._interval), "single run")

  # ------------------------------------------------------------------ profiles

  def profile_of(self, event) -> prof_lib.PrivacyProfile:
    """The profile of one event (not composed with what this accountant holds)."""
    sub = self._fresh()
    sub.compose(event)
    return sub.profile()

  def profile(self) -> prof_lib.PrivacyProfile:
    """A profile upper-bounding everything composed so far."""
    if self._cache is None:
      self._cache = self._build()
    return self._cache[0]

  @property
  def theorem(self) -> str:
    if not self._parts:
      return "nothing composed"
    self.profile()
    return self._cache[1]

  def _build(self):
    if not self._parts:
      return prof_lib.ApproxDpProfile(0.0, 0.0), "nothing composed"
    if len(self._parts) == 1 and self._parts[0].count == 1:
      return self._parts[0].leaf()
    # Several parts: compose privacy-loss distributions.
    dpa_parts = [dpa.SelfComposedDpEvent(p.event, p.count) for p in self._parts
                 if ev.is_dp_accounting_only(p.event)]
    ours = [(p.leaf, p.count) for p in self._parts if not ev.is_dp_accounting_only(p.event)]
    no_pld = [e for e in dpa_parts if not _dpa_pld.pld_supports(e)]
    if no_pld:
      rdp = rdp_accountant.RdpSelectionAccountant(self._orders)
      if all(rdp.supports(p.event) for p in self._parts):
        # Only an RDP curve for some dp-accounting part: compose everything by RDP.
        return _rdp_profile(self._parts, self._orders), "composition by RDP (no PLD for a part)"
      # Another part has no RDP curve (an (eps, delta)-DP guarantee), so RDP
      # cannot compose them all: the parts without a PLD enter through the
      # envelope of their profile (the RDP conversion), like jaxdp's parts.
      dpa_parts = [e for e in dpa_parts if _dpa_pld.pld_supports(e)]
      ours += [(self._dp_leaf(e), 1) for e in no_pld]
    leaves = [(leaf(), count) for leaf, count in ours]
    tops = [_envelope_top(prof) for (prof, _), _ in leaves]
    if any(prof.delta(top) >= 1.0 for ((prof, _), _), top in zip(leaves, tops)):
      # A part with no claim at all (delta = 1 everywhere, e.g. a non-private
      # candidate): nothing to compose (its envelope has no finite atom,
      # which dp-accounting's PLDs cannot hold), and no claim for the whole.
      return prof_lib.ApproxDpProfile(0.0, 1.0), "non-private"
    interval = self._interval
    if interval is None:
      interval = (_dpa_pld.pld_interval_for(dpa.ComposedDpEvent(dpa_parts)) if dpa_parts
                  else prof_lib.PLD_DISCRETIZATION)
      # Envelope losses reach their tops (+-): a pure 1e6-DP part would span
      # 2e10 atoms at 1e-4. Coarser (still pessimistic) only past a summed
      # top of 200, keeping the composed PLD below ~4e6 atoms.
      interval = max(interval, sum(c * t for (_, c), t in zip(leaves, tops)) / 2e6)
    pld = _dpa_pld.pld_identity(interval)
    theorems = []
    if dpa_parts:
      pld_e, non_private = _dpa_pld.pld_of_event(dpa.ComposedDpEvent(dpa_parts), interval)
      if non_private:
        return prof_lib.ApproxDpProfile(0.0, 1.0), "non-private"
      with _dpa_pld.building_pld():
        pld = _dpa_pld.compose_plds(pld, pld_e)
      theorems.append("dp-accounting PLD")
    for ((prof, theorem), count), top in zip(leaves, tops):
      part = envelope_pld(prof, interval, top)
      with _dpa_pld.building_pld():
        pld = _dpa_pld.compose_plds(pld, part if count == 1 else part.self_compose(count))
      theorems.append(theorem)
    return (ComposedPldProfile(pld),
            "PLD composition of [" + "; ".join(dict.fromkeys(theorems)) + "]")

  # ------------------------------------------------------------------ results

  def get_epsilon(self, target_delta: float) -> float:
    target_delta = _validate.probability("target_delta", target_delta)
    return float(self.profile().epsilon(target_delta))

  def get_delta(self, target_epsilon: float) -> float:
    target_epsilon = _validate.real("target_epsilon", target_epsilon, low=0.0, allow_inf=True)
    if math.isinf(target_epsilon):
      return 0.0
    return float(self.profile().delta(target_epsilon))


class ComposedPldProfile(prof_lib.PrivacyProfile):
  """The profile of a composed privacy-loss distribution.

  Its values come from FFT convolutions whose round-off is not bounded below
  `_dpa_pld.PLD_DELTA_FLOOR`, so every value carries that much extra delta: a
  delta below the floor is never claimed (epsilon is then inf).
  """

  def __init__(self, pld):
    self._pld = pld
    tables = [_dpa_pld.pmf_table(p) for p in _dpa_pld.pld_pmfs(pld)]
    # Suffix sums: O(log n) per eps. dp-accounting's own path loops over every
    # atom per eps (~0.4 s per call here, 50 s for one selection bound).
    self._tables = None if any(t is None for t in tables) else tables
    self.description = "composed PLD (dp-accounting, pessimistic)"

  def _delta_nonneg(self, eps):
    eps = np.asarray(eps, dtype=np.float64)
    if self._tables is None:
      vals = np.asarray(self._pld.get_delta_for_epsilon(eps), dtype=np.float64)
    else:
      vals = np.max([_dpa_pld.suffix_delta(t, eps) for t in self._tables], axis=0)
    return np.minimum(1.0, np.maximum(vals, 0.0) + _dpa_pld.PLD_DELTA_FLOOR)

  def _epsilon_guess(self, delta):
    if delta <= _dpa_pld.PLD_DELTA_FLOOR:
      return None
    with np.errstate(over="ignore", divide="ignore"):  # a guess only: inf past exp's range
      return max(0.0, float(self._pld.get_epsilon_for_delta(delta - _dpa_pld.PLD_DELTA_FLOOR)))

  def epsilon(self, delta):
    if delta <= _dpa_pld.PLD_DELTA_FLOOR:
      return math.inf
    return super().epsilon(delta)


def _gaussian_mu(event) -> Optional[float]:
  """mu = sensitivity/sigma if `event` is a (self-composed) Gaussian, else None."""
  count = 1
  while isinstance(event, dpa.SelfComposedDpEvent):
    count *= event.count
    event = event.event
  if isinstance(event, dpa.GaussianDpEvent) and event.noise_multiplier > 0:
    return math.sqrt(count) / event.noise_multiplier
  return None


def _dp_event_profile(event, orders, interval) -> prof_lib.PrivacyProfile:
  orders = tuple(float(o) for o in orders)
  key = ev.event_key(event)
  key = None if key is None else (key, orders, interval)
  found = None if key is None else _profile_cache.get(key)
  if found is None:
    found = _build_dp_event_profile(event, np.asarray(orders), interval)
    if key is not None:
      _profile_cache.put(key, found, found.nbytes)
  return found


# Keyed by value (`events.event_key`): the profile depends on the event, the
# orders and the discretisation only, and profiles are never modified after
# construction. Searches (max_mean, calibration, plan) ask for the same base's
# profile dozens of times, and its PLD costs ~0.15 s for DP-SGD on MNIST. A
# PLD profile holds its PMF and suffix tables (~10 MB for DP-SGD at 1e-4):
# the cache keeps at most 64 profiles and 512 MB of arrays.
_profile_cache = _dpa.LruCache(64, 512 * 2**20)


def _build_dp_event_profile(event, orders, interval) -> prof_lib.PrivacyProfile:
  mu = _gaussian_mu(event)
  if mu is not None:
    return prof_lib.GaussianProfile(mu)
  rdp = _dpa.dp_event_rdp(event, orders)
  # A Laplace part's pure epsilon bounds it where its RDP conversion and PLD
  # (rounded up to the grid) are looser, e.g. any large 1/b.
  pure = rdp_accountant.dp_accounting_pure_epsilon(event)
  rdp_prof = None if rdp is None else prof_lib.RdpProfile(orders, rdp, pure)
  if _dpa_pld.pld_supports(event):
    return prof_lib.PldProfile(event, interval, rdp_fallback=rdp_prof)
  return rdp_prof


def _rdp_profile(parts, orders) -> prof_lib.PrivacyProfile:
  acct = rdp_accountant.RdpSelectionAccountant(orders)
  for part in parts:
    acct.compose(part.event, part.count)
  return prof_lib.RdpProfile(acct.orders, acct.rdp, acct.pure_epsilon)


def _envelope_top(profile: prof_lib.PrivacyProfile) -> float:
  """The largest eps of `envelope_pld`'s grid: where `profile` is ~0 (1e-15), or 60 if it never is."""
  eps_max = profile.epsilon(1e-15)
  if not math.isfinite(eps_max):
    eps_max = max(profile.epsilon(1e-12), 1.0)
  if not math.isfinite(eps_max):
    eps_max = 60.0
  return eps_max


def envelope_pld(profile: prof_lib.PrivacyProfile, interval: float, top: Optional[float] = None):
  """A pessimistic PLD dominating every mechanism whose symmetric profile is below `profile`.

  On a grid eps_0 = 0 < ... < eps_n the mechanism is (eps_i, delta_i)-DP for
  every i, so its tradeoff function is at least T = max_i f_{eps_i, delta_i},
  f_{eps, delta}(a) = max(0, 1 - delta - e^eps a, e^-eps (1 - delta - a)).
  T is convex, piecewise linear and symmetric (its graph is its own mirror
  image in the diagonal); the pair realising it has one atom per segment of
  slope -r (Q-mass = segment length, P-mass = r times it, privacy loss log r)
  and an atom at +inf of mass 1 - T(0) = min_i delta_i. Right of the fixed
  point T(a*) = a*, T is the upper envelope of the lines e^-eps_i (u_i - a),
  u_i = 1 - delta_i; a segment there of length m and slope -e^-L gives an atom
  at -L of P-mass e^-L m, and its mirror segment (slope -e^L, length e^-L m)
  one at +L of P-mass m. Only e^-eps enters, so privacy losses beyond exp's
  range (eps > ~709.78, where e^eps overflows) are handled exactly too. Both
  neighbouring orders have the same T, so one symmetric PLD serves both.

  `top` is the grid's largest eps, `_envelope_top(profile)` if None.
  """
  eps_max = (_envelope_top(profile) if top is None
             else _validate.real("top", top, low=0.0))
  eps = np.unique(np.concatenate([np.linspace(0.0, eps_max, _ENVELOPE_POINTS // 2),
                                  eps_max * np.geomspace(1e-4, 1.0, _ENVELOPE_POINTS // 2)]))
  delta = np.clip(np.asarray(profile.delta(eps), dtype=np.float64), 0.0, 1.0)
  loss_probs: dict = {}
  for start, end, loss in _right_half(1.0 - delta, eps):
    length = end - start
    loss_probs[loss] = loss_probs.get(loss, 0.0) + length
    loss_probs[-loss] = loss_probs.get(-loss, 0.0) + math.exp(-loss) * length  # loss 0: one key
  return _dpa_pld.pld_from_losses(loss_probs, float(np.min(delta)), interval)


def _right_half(u: np.ndarray, eps: np.ndarray) -> list:
  """Segments (a_start, a_end, eps_i) on [a*, 1] of E(a) = max(0, max_i e^-eps_i (u_i - a)),
  a* its fixed point E(a*) = a*; e^eps never evaluated."""
  # Steepest (smallest eps) first: as a grows the maximising line gets
  # shallower (convexity); for equal eps the larger u dominates.
  order = np.lexsort((-u, eps))
  hull: list = []  # (u, eps, a_start)
  for ui, ei in zip(u[order].tolist(), eps[order].tolist()):
    if hull and ei == hull[-1][1]:
      continue
    while hull:
      u0, e0, a0 = hull[-1]
      # e^-e0 (u0 - a) = e^-ei (u - a): a = (u0 - r ui) / (1 - r), r = e^(e0 - ei) < 1.
      r = math.exp(e0 - ei)
      a = (u0 - r * ui) / -math.expm1(e0 - ei)
      if a <= a0:
        hull.pop()
      else:
        hull.append((ui, ei, a))
        break
    else:
      hull.append((ui, ei, 0.0))
  segments = []
  for i, (ui, ei, a0) in enumerate(hull):
    a1 = hull[i + 1][2] if i + 1 < len(hull) else math.inf
    a1 = min(a1, ui, 1.0)  # the line reaches 0 at u; the envelope is 0 beyond the last zero
    if a1 > a0:
      segments.append((a0, a1, ui, ei))
    if ui <= a1:
      break
  # E(a) - a decreases: a* lies on the first segment whose line is <= a at its end.
  out: list = []
  for a0, a1, ui, ei in segments:
    if not out:
      tiny = math.exp(-ei)
      if tiny * (ui - a1) > a1:
        continue
      a0 = min(max(a0, ui * tiny / (1.0 + tiny)), a1)  # e^-ei (ui - a) = a
    out.append((a0, a1, ei))
  return out
