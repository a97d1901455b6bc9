"""PLD accountant: dp-accounting's privacy loss distributions, mixed over a random K.

`PldAccountant` is a `dp_accounting.PrivacyAccountant` (add/remove-one) for
dp-accounting's own events that its `PLDAccountant` supports (Gaussian,
Laplace, Poisson-sampled Gaussian, NoOp, NonPrivate, ...), jaxdp's `PureDp` /
`ApproxDp` (their exact dominating pair, `from_privacy_parameters`), and
repeat-and-select tuning (`RepeatAndSelect`, `RandomStopping`) with a
light-tailed number of runs K, nested in `ComposedDpEvent` /
`SelfComposedDpEvent` in any order.

Theorem used for a selection (best of K runs of `base`, composed with E, the
rest of the release). Given K = k the release is a post-processing of the
(adaptive) composition base^k o E; K is independent of the data and has the
same law on both neighbours, so the release is the mixture over K of these,
and joint convexity of the hockey-stick divergence gives, per neighbour
direction,

  delta(eps) <= sum_{k <= k_max} P(K=k) delta_{base^k o E}(eps) + P(K > k_max),

(delta_k <= 1 bounds every dropped term). Each delta_k is dp-accounting's
pessimistic PLD of base^k o E (composed iteratively, pld_k = pld_{k-1} o base);
K = 0 contributes delta_E (0 when nothing else is released). A hockey-stick
curve is linear in the PLD's probability masses, so the weighted sum of the
curves is exactly the curve of the mixed PMF (dp-accounting's
`compute_mixture`), which dp-accounting inverts exactly; the result is then
checked forward and rounded up until feasible. `Fixed(k)` selections are
plain k-fold composition and go through dp-accounting unchanged.

Example:
  >>> from jaxdp.accounting import events as ev, distributions as dists
  >>> from jaxdp.accounting.pld_accountant import PldAccountant
  >>> acct = PldAccountant().compose(ev.RepeatAndSelect(ev.PureDp(0.5), dists.Poisson(mean=3)))
  >>> round(acct.get_epsilon(1e-6), 4)
  4.9712
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import dp_accounting as dpa
import numpy as np

from jaxdp import _validate
from jaxdp.accounting import _dpa_pld
from jaxdp.accounting import base
from jaxdp.accounting import distributions as dist_lib
from jaxdp.accounting import events as ev
from jaxdp.accounting import rdp_accountant

_Details = dpa.PrivacyAccountant.CompositionErrorDetails
_ADD_REMOVE = dpa.NeighboringRelation.ADD_OR_REMOVE_ONE

#: Default bound on the dropped tail P(K > k_max): 1e-3 of the smallest delta a
#: PLD value is trusted at (`_dpa_pld.PLD_DELTA_FLOOR`), so the truncation costs at
#: most 0.1% of any delta this accountant reports, at every target at once.
DEFAULT_TAIL_TOLERANCE = 1e-3 * _dpa_pld.PLD_DELTA_FLOOR
#: Default cap on the number of compositions of the base (k_max). One term
#: costs one FFT composition, ~0.18 s for a DP-SGD run at interval 1e-4
#: (supports of 2e5-6e5 losses; ~10x less at 1e-3), milliseconds for small
#: PLDs: Poisson(mean=10) over a DP-SGD run (39 terms) takes ~7 s at 1e-4 and
#: under 1 s at 1e-3, and no supported selection takes much more than ~9 s.
#: With the default tail (1e-12) 48 covers Poisson with mean <= 14, geometric
#: with mean <= 2.2, binomial and capped geometric with n, T <= 48; heavier
#: tails belong to method 'rdp'.
DEFAULT_MAX_TERMS = 48
#: Relative slack on the mixture weights: P(K=k) comes from exp(logpmf) through
#: gammaln (relative error ~1e-14), and the running normalisation of the mixed
#: PMF adds k ulps; scaling the head up by this much keeps every weight high.
_WEIGHT_SLACK = 1e-12
#: Terms summed directly beyond k before a Chernoff bound takes the remainder.
_TAIL_TERMS = 256
#: Relative margin by which a partial mixture must exceed delta before
#: `PldAccountant.epsilon_exceeds` stops building it (see `_build_curve`).
_EXCEEDS_MARGIN = 1e-6


def _random_selections(event) -> int:
  """How many random-K selections `event` releases (SelfComposed counts multiply)."""
  if isinstance(event, (ev.RepeatAndSelect, ev.RandomStopping)):
    sel = rdp_accountant.as_repeat_and_select(event)
    inner = _random_selections(sel.base)
    if isinstance(sel.distribution, dist_lib.Fixed):
      return sel.distribution.k * inner
    return 1 + inner
  times = event.count if isinstance(event, dpa.SelfComposedDpEvent) else 1
  return times * sum(_random_selections(c) for c in ev.children(event))


def _tails(dist, top: int) -> np.ndarray:
  """Upper bounds on P[K > k] for k = 0..top, never below the truth.

  The terms beyond k are summed directly by reverse cumulative sums (smallest
  first: no cancellation, unlike 1 - CDF, whose round-off ~1e-16 k would
  swamp tails of 1e-12), scaled up by `_WEIGHT_SLACK` for the pmf's own
  round-off, plus a Chernoff bound on P[K > top + _TAIL_TERMS].
  """
  max_k = getattr(dist, "max_k", None)
  hi = top + _TAIL_TERMS if max_k is None else min(top + _TAIL_TERMS, max_k)
  pmf = np.asarray(dist.pmf(np.arange(hi + 1, dtype=np.float64)), dtype=np.float64)
  beyond = np.append(np.cumsum(pmf[::-1])[::-1][1:], 0.0)  # beyond[k] = sum_{k<j<=hi} P[K=j]
  rest = 0.0 if (max_k is not None and hi >= max_k) else dist_lib.tail_bound(dist, hi + 1)
  tails = np.minimum(beyond * (1.0 + _WEIGHT_SLACK) + rest, 1.0)
  tails = np.append(tails, np.zeros(max(0, top + 1 - tails.size)))[:top + 1]  # k >= max_k: 0
  if max_k is not None:
    tails[max_k:] = 0.0
  return tails


def _tail(dist, k: int) -> float:
  """An upper bound on P[K > k]; the distribution's own `sf` (also an upper
  bound, but one scalar sum per k) where it is smaller."""
  bound = float(_tails(dist, k)[k])
  sf = getattr(dist, "sf", None)
  return min(bound, float(sf(k))) if callable(sf) else bound


def _terms_needed(dist, tail_tolerance: float, limit: int) -> Optional[int]:
  """Smallest k_max <= limit with P[K > k_max] <= tail_tolerance (bounded K: at most max_k)."""
  max_k = getattr(dist, "max_k", None)
  top = limit if max_k is None else min(limit, max_k)
  ok = np.flatnonzero(_tails(dist, top) <= tail_tolerance)
  return int(ok[0]) if ok.size else None


class _Curve:
  """delta(eps) = scale * pld(eps) + offset (1 where non-private), with its inverse."""

  def __init__(self, pld, scale: float = 1.0, offset: float = 0.0, non_private: bool = False):
    self.pld, self.scale, self.offset, self.non_private = pld, scale, offset, non_private
    self._epsilons: dict = {}  # delta -> epsilon(delta): dp-accounting's inverse loops over every atom

  def delta(self, epsilon: float) -> float:
    if self.non_private:
      return 1.0
    value = float(self.pld.get_delta_for_epsilon(epsilon))
    if math.isnan(value):  # never let a NaN through as a small delta: no claim
      return 1.0
    # scale = 1, offset = 0 (no random K) leaves dp-accounting's value bit for bit.
    return min(1.0, self.scale * value + self.offset)

  def epsilon(self, delta: float) -> float:
    if delta not in self._epsilons:
      self._epsilons[delta] = self._epsilon(delta)
    return self._epsilons[delta]

  def _epsilon(self, delta: float) -> float:
    if self.non_private:
      return math.inf
    if self.scale == 0.0:
      return 0.0 if self.offset <= delta else math.inf
    inner = (delta - self.offset) / self.scale
    if inner < 0.0:
      return math.inf
    # Losses past exp's range overflow dp-accounting's inverse to inf (no claim): not worth a warning.
    with np.errstate(over="ignore", divide="ignore"):
      eps = float(self.pld.get_epsilon_for_delta(min(inner, 1.0)))
    if math.isnan(eps):
      return math.inf
    eps = max(0.0, eps)
    # The inverse and the forward curve may disagree in the last bits (and the
    # scaling rounds): move eps up until the forward value confirms it, so the
    # returned eps is always on the feasible side and get_delta(eps) <= delta.
    step = max(eps, 1e-12) * 4e-16
    for _ in range(128):
      if not math.isfinite(eps) or self.delta(eps) <= delta:
        return eps
      eps, step = eps + step, 2.0 * step
    return math.inf


class PldAccountant(base.Accountant):
  """PLD composition, with repeat-and-select mixed over a light-tailed K.

  Args:
    value_discretization_interval: dp-accounting's PLD grid (losses rounded up:
      pessimistic). Smaller is tighter and slower. None (default): 1e-4, coarser
      only when the composed privacy loss is large (see `_resolve_interval`).
    tail_tolerance: bound on the dropped mass P(K > k_max), added to every
      delta; default 1e-3 * PLD_DELTA_FLOOR (an absolute bound, hence
      at most 0.1% of any delta reported).
    max_terms: largest k_max (compositions of the base) accepted; a selection
      needing more is unsupported (its reason says so).
    neighboring_relation: only ADD_OR_REMOVE_ONE is supported; others make
      every event unsupported (with the reason).

  Attributes:
    theorem: what was used, e.g. "PLD composition, mixture over K ~
      Poisson(mean=10.0) (joint convexity), k <= 39, tail 7e-13".

  Guarantees:
    * get_epsilon(d) is inf for d < PLD_DELTA_FLOOR (no trusted PLD value
      there); otherwise get_delta(get_epsilon(d)) <= d.
    * get_delta never returns less than PLD_DELTA_FLOOR (see get_delta).
    * With no random-K selection the numbers are dp-accounting's PLDAccountant's
      (`Fixed(k)` selections are k-fold composition).

  Example:
    >>> from jaxdp.accounting import events as ev, distributions as dists
    >>> run = ev.dpsgd_event(0.01, 1.0, 1000)
    >>> acct = PldAccountant().compose(ev.RepeatAndSelect(run, dists.Fixed(20)))
    >>> round(acct.get_epsilon(1e-5), 4)
    9.2675
  """

  method = "pld"

  def __init__(self, value_discretization_interval: Optional[float] = None, *,
               tail_tolerance: float = DEFAULT_TAIL_TOLERANCE,
               max_terms: int = DEFAULT_MAX_TERMS,
               neighboring_relation: dpa.NeighboringRelation = _ADD_REMOVE):
    # base.Accountant fixes add/remove-one; another relation is kept only so that
    # every event can be refused with the reason (see _maybe_compose).
    dpa.PrivacyAccountant.__init__(self, neighboring_relation)  # pylint: disable=non-parent-init-called
    self._interval = (None if value_discretization_interval is None else _validate.real(
        "value_discretization_interval", value_discretization_interval, low=0.0, low_open=True))
    self._tail_tolerance = _validate.real("tail_tolerance", tail_tolerance, low=0.0, low_open=True,
                                          high=1.0, high_open=True)
    self._max_terms = _validate.integer("max_terms", max_terms, low=0)
    self._dpa_parts: list = []  # dp-accounting's own events (counts folded in)
    self._dp_parts: list = []   # (PureDp | ApproxDp, count)
    self._selection: Optional[tuple] = None  # (RepeatAndSelect with random K, k_max)
    self._curve_cache: Optional[_Curve] = None

  # ------------------------------------------------------------------ results

  @property
  def theorem(self) -> str:
    if not (self._dpa_parts or self._dp_parts or self._selection):
      return "nothing composed"
    text = f"PLD composition (dp-accounting, pessimistic, interval {self._interval or _dpa_pld.PLD_FINEST_INTERVAL:g})"
    if self._selection is not None:
      sel, k_max = self._selection
      text = (f"PLD composition, mixture over K ~ {sel.distribution!r} (joint convexity), "
              f"k <= {k_max}, tail {_tail(sel.distribution, k_max):.1g}")
    return text

  def get_epsilon(self, target_delta: float) -> float:
    """Smallest eps (rounded up) with delta(eps) <= target_delta; inf if none is trusted.

    Below `_dpa_pld.PLD_DELTA_FLOOR` no PLD value is trusted (FFT round-off), so
    the answer is inf: "no valid bound here" (callers take the min over
    accountants).
    """
    target_delta = _validate.probability("target_delta", target_delta)
    if target_delta < _dpa_pld.PLD_DELTA_FLOOR:
      return math.inf
    eps = self._curve().epsilon(target_delta)
    pure = self._pure_epsilon()
    # Rounding losses up to the grid can put a pure part's loss up to one
    # interval above its epsilon; pure parts compose to a pure guarantee.
    return eps if pure is None else min(eps, pure)

  def epsilon_exceeds(self, target_delta: float, target_epsilon: float) -> bool:
    """Whether get_epsilon(target_delta) > target_epsilon, deciding early where it can.

    A random-K selection's curve is the mixture sum_k P(K=k) delta_k(eps) +
    tail (module docstring), every term non-negative: once the terms built so
    far exceed target_delta at target_epsilon, so does the whole curve, and
    its epsilon (where the non-increasing curve falls to target_delta) lies
    beyond target_epsilon. The remaining compositions, the largest PLDs and
    most of the cost, are then skipped. Otherwise the curve is built whole
    and kept (get_epsilon then costs nothing more), and the answer is
    get_epsilon(target_delta) > target_epsilon. So the answer is always that
    comparison's: searches ("best", `inverse`) ask this where only the side
    of a target matters. (Were float rounding ever to make an early True
    wrong, the search would only leave this method out: more noise, never
    less.)
    """
    target_delta = _validate.probability("target_delta", target_delta)
    target_epsilon = _validate.real("target_epsilon", target_epsilon, low=0.0, allow_inf=True)
    if (self._curve_cache is None and self._selection is not None and math.isfinite(target_epsilon)
        and target_delta >= _dpa_pld.PLD_DELTA_FLOOR):
      curve = self._build_curve(stop=(target_epsilon, target_delta))
      if curve is None:
        return True
      self._curve_cache = curve
    return self.get_epsilon(target_delta) > target_epsilon

  def get_delta(self, target_epsilon: float) -> float:
    """delta(target_epsilon), never below `_dpa_pld.PLD_DELTA_FLOOR`."""
    target_epsilon = _validate.real("target_epsilon", target_epsilon, low=0.0, allow_inf=True)
    pure = self._pure_epsilon()
    # At or beyond a pure epsilon of everything composed the true delta is 0
    # (reported as the floor below, as get_epsilon's min(eps, pure) needs).
    raw = 0.0 if pure is not None and target_epsilon >= pure else self._curve().delta(target_epsilon)
    # A computed value below the floor is not trusted, but the floor itself is a
    # valid bound, not an optimistic guess: the computed curve is continuous in
    # eps (each loss L enters as p (1 - e^{eps-L})_+) and tends to 1 as
    # eps -> -inf, so it equals the floor at some eps_f <= target_epsilon; a
    # value at the floor is trusted (it is the claim get_epsilon(PLD_DELTA_FLOOR)
    # makes), so the true delta(eps_f) <= floor, and the true curve is
    # non-increasing, so delta(target_epsilon) <= delta(eps_f) <= floor.
    # Returning `raw` would be the optimistic choice; 1.0 ("no claim") is only
    # needed where the curve is non-private, and `raw` is then already 1.
    return raw if raw >= _dpa_pld.PLD_DELTA_FLOOR else _dpa_pld.PLD_DELTA_FLOOR

  def _pure_epsilon(self) -> Optional[float]:
    """A pure epsilon of everything composed (the parts' add up), or None if a part has none."""
    if self._selection is not None:
      return None
    total = 0.0
    for event, count in self._dp_parts:
      if isinstance(event, ev.ApproxDp) and event.delta > 0.0:
        return None
      total += count * event.epsilon
    for event in self._dpa_parts:
      pure = rdp_accountant.dp_accounting_pure_epsilon(event)
      if pure is None:
        return None
      total += pure
    return total

  # ------------------------------------------------------------------ composition

  def _fresh(self) -> "PldAccountant":
    return type(self)(self._interval, tail_tolerance=self._tail_tolerance,
                      max_terms=self._max_terms, neighboring_relation=self.neighboring_relation)

  def _maybe_compose(self, event, count, do_compose) -> Optional[_Details]:
    # One law of K: checked on every composition here, before base.Accountant walks into it.
    if isinstance(event, dpa.NoOpDpEvent):
      return None
    if self.neighboring_relation != _ADD_REMOVE:
      return _Details(event, "PldAccountant accounts the add/remove-one relation only (the "
                             "dominating pairs and dp-accounting PLDs it composes are built for it); "
                             f"got {self.neighboring_relation}")
    if isinstance(event, dpa.ComposedDpEvent):
      n_random = _random_selections(event)
      if n_random > 1:
        return _Details(event, f"the composition releases {n_random} random-K selections; the mixture "
                               "bound needs one law of K, so at most one random-K selection per "
                               "composition (Fixed(k) selections may repeat)")
    if isinstance(event, dpa.SelfComposedDpEvent) and event.count > 1 and _random_selections(event.event):
      return _Details(event, f"a random-K selection composed {event.count} times has independent "
                             "K_1, K_2, ...; the mixture bound here takes one K: compose it once")
    return super()._maybe_compose(event, count, do_compose)

  def _rules(self):
    refusals = {cls: functools.partial(self._refuse, why) for cls, why in _UNSUPPORTED_REASONS.items()}
    return {**refusals, ev.RepeatAndSelect: self._select, ev.RandomStopping: self._select,
            # Its theorem bounds the mixture of k-fold compositions, which holds K: the pair too.
            ev.SelectionWithCount: lambda e, count, do: self._select(e.selection, count, do),
            ev.PureDp: self._dominating_pair, ev.ApproxDp: self._dominating_pair}

  def _dominating_pair(self, event, count, do_compose) -> Optional[_Details]:
    """PureDp / ApproxDp: the exact dominating pair of their (eps, delta) guarantee."""
    if do_compose and count > 0:
      self._dp_parts.append((event, count))
      self._curve_cache = None
    return None

  def _select(self, event, count, do_compose) -> Optional[_Details]:
    sel = rdp_accountant.as_repeat_and_select(event)
    return self._maybe_compose_selection(sel, event, count, do_compose)

  def _dp_accounting_part(self, event, count, do_compose) -> Optional[_Details]:
    if not _dpa_pld.pld_supports(event):
      return _Details(event, f"dp-accounting's PLDAccountant does not support {type(event).__name__} "
                             "and it is not a jaxdp event with a PLD")
    if do_compose and count > 0:
      self._dpa_parts.append(event if count == 1 else dpa.SelfComposedDpEvent(event, count))
      self._curve_cache = None
    return None

  def _maybe_compose_selection(self, sel, event, count, do_compose) -> Optional[_Details]:
    dist = sel.distribution
    if _random_selections(sel.base):
      return _Details(event, "the base is itself a random-K selection: its privacy is a mixture over "
                             "its own K, not one PLD, so base^k has no PLD to compose (the best of "
                             "best-of-K runs would need the compound law of the total number of runs)")
    if isinstance(dist, dist_lib.Fixed):
      # Best of k runs is a post-processing of exactly k runs: k-fold composition.
      return self._maybe_compose(sel.base, count * dist.k, do_compose)
    if count > 1:
      return _Details(event, f"a random-K selection composed {count} times has independent K_1, "
                             "K_2, ...; the mixture bound here takes one K: compose it once")
    if self._selection is not None:
      return _Details(event, "this accountant already holds a random-K selection; the mixture bound "
                             "takes one K, so at most one random-K selection per accountant")
    err = self._fresh().unsupported(sel.base)
    if err is not None:
      return err
    k_max = _terms_needed(dist, self._tail_tolerance, self._max_terms)
    if k_max is None:
      # (Not computing how many terms it would need: that costs a long pmf per call.)
      return _Details(event, f"K ~ {dist!r} needs more than max_terms={self._max_terms} terms "
                             f"(k_max with P(K > k_max) <= {self._tail_tolerance:g}); its tail is too "
                             "heavy for a PLD mixture: use method 'rdp' or 'profile'")
    if do_compose and count > 0:
      self._selection = (sel, k_max)
      self._curve_cache = None
    return None

  # ------------------------------------------------------------------ PLDs

  def _deterministic_pld(self):
    """(PLD, contains_non_private) of everything composed except a random-K selection."""
    self._resolve_interval()
    if self._dpa_parts:
      parts = self._dpa_parts
      # One dp-accounting accountant on the same tree: bit-identical to its numbers.
      event = parts[0] if len(parts) == 1 else dpa.ComposedDpEvent(list(parts))
      pld, non_private = _dpa_pld.pld_of_event(event, self._interval)
    else:
      pld, non_private = _dpa_pld.pld_identity(self._interval), False
    for event, count in self._dp_parts:
      delta = event.delta if isinstance(event, ev.ApproxDp) else 0.0
      # The exact dominating pair of (eps, delta)-DP (Kairouz et al. 2015;
      # dp-accounting's pessimistic rounding of its two losses).
      part = _dpa_pld.pld_from_privacy_parameters(event.epsilon, delta, self._interval)
      with _dpa_pld.building_pld():
        pld = _dpa_pld.compose_plds(pld, part if count == 1 else part.self_compose(count))
    return pld, non_private

  def _curve(self) -> _Curve:
    if self._curve_cache is None:
      self._curve_cache = self._build_curve()
    return self._curve_cache

  def _resolve_interval(self) -> None:
    """Fix the discretisation before the first PLD: 1e-4 unless the composed privacy
    loss is large. The loss range grows with epsilon, so an RDP-composition epsilon
    at delta = 1e-10 (an upper bound of every part, selections included) over 5e5
    keeps PLDs near the size of DP-SGD on MNIST; coarser is still pessimistic."""
    if self._interval is not None:
      return
    acct = rdp_accountant.CompositionAccountant()
    eps = acct.compose(self.ledger).get_epsilon(1e-10) if acct.supports(self.ledger) else math.inf
    if not math.isfinite(eps):
      # No RDP composition (an (eps, delta)-DP part), or it diverges over all
      # of K (a pure 1e6-DP base, Poisson K): on the finest grid a loss of 1e6
      # spans 1e10 atoms (MemoryError). Bound the losses the PLDs hold instead.
      eps = self._loss_span()
    self._interval = max(_dpa_pld.PLD_FINEST_INTERVAL,
                         eps / 5e5) if math.isfinite(eps) else _dpa_pld.PLD_FINEST_INTERVAL

  def _loss_span(self) -> float:
    """The largest finite privacy loss the PLDs built here reach, roughly (for
    `_resolve_interval`): an (eps, delta)-DP part's is eps, a dp-accounting
    part's its RDP epsilon at 1e-10 (as above), a selection's k_max times its base's."""
    acct = rdp_accountant.CompositionAccountant()
    for event in self._dpa_parts:
      if not acct.supports(event):
        return math.inf
      acct.compose(event)
    span = (acct.get_epsilon(1e-10) if self._dpa_parts else 0.0) + math.fsum(
        count * event.epsilon for event, count in self._dp_parts)
    if self._selection is not None:
      sel, k_max = self._selection
      span += k_max * self._fresh().compose(sel.base)._loss_span()  # pylint: disable=protected-access
    return span

  def _build_curve(self, stop: Optional[tuple] = None) -> Optional[_Curve]:
    """The curve; with stop = (eps, delta), None as soon as the terms so far exceed delta at eps.

    The test is on the weighted sum of the terms' own hockey-stick values
    (per neighbour direction, `_dpa_pld.pmf_delta_lower`: the mixed PMF's curve
    is their weighted sum, as a curve is linear in the masses), with a
    relative margin `_EXCEEDS_MARGIN` far above the rounding of those sums
    (~1e-13), so a stop always means that the whole curve exceeds delta at eps.
    """
    self._resolve_interval()
    pld_e, non_private_e = self._deterministic_pld()
    if self._selection is None or non_private_e:
      return _Curve(pld_e, non_private=non_private_e)
    sel, k_max = self._selection
    dist = sel.distribution
    base_pld, non_private_base = self._fresh().compose(sel.base)._deterministic_pld()  # pylint: disable=protected-access
    if non_private_base:
      k_max = 0  # every run with k >= 1 has delta_k = 1: all of P(K >= 1) goes to the tail
    weights = np.asarray(dist.pmf(np.arange(k_max + 1, dtype=np.float64)), dtype=np.float64)
    mix, head = pld_e, 0.0
    pld_k = pld_e
    lower = [0.0, 0.0]  # sum_{j<=k} P(j) delta_{pld_j}(stop eps), per direction (remove, add)
    for k in range(k_max + 1):
      if k > 0:
        with _dpa_pld.building_pld():
          pld_k = _dpa_pld.compose_plds(pld_k,
                                        base_pld)  # iterative: one FFT per term, no self_compose per k
      w = float(weights[k])
      if w <= 0.0:
        continue
      # Running normalised mixture sum_{j<=k} P(j) pld_j / sum_{j<=k} P(j), per direction.
      with _dpa_pld.building_pld():
        mix = pld_k if head == 0.0 else mix.compute_mixture(pld_k, head / (head + w))
      head += w
      if stop is not None:
        for d, pmf in enumerate(_dpa_pld.pld_pmf_pair(pld_k)):
          lower[d] += w * _dpa_pld.pmf_delta_lower(pmf, stop[0])
        if max(lower) > stop[1] * (1.0 + _EXCEEDS_MARGIN):
          return None
    head = math.fsum(weights.tolist()) * (1.0 + _WEIGHT_SLACK)
    return _Curve(mix, scale=head, offset=_tail(dist, k_max))


_UNSUPPORTED_REASONS = {
    ev.Zcdp: "a zCDP guarantee bounds Renyi divergences only; it fixes no privacy loss "
             "distribution to compose (use method 'rdp')",
    ev.RdpCurve: "an RDP curve bounds Renyi divergences only; it fixes no privacy loss "
                 "distribution to compose (use method 'rdp')",
    ev.ReportNoisyMax: "report-noisy-max has an RDP bound (KRW Thm 3.1) but no PLD here "
                       "(use method 'rdp')",
    ev.ThresholdSelect: "the threshold algorithm stops on a data-dependent score, so its number "
                        "of calls is not independent of the data and the mixture over K does not "
                        "apply (use method 'liu-talwar')",
    ev.UniformCandidates: "candidates with different guarantees: their worst case is a pointwise "
                          "max of hockey-stick curves, which is no PLD to compose k times (use "
                          "method 'rdp' or 'profile')",
    ev.SubsampledTuning: "tuning on a subset needs Koskela-Kulkarni Thm 1, an RDP result (use "
                         "method 'rdp')",
}
