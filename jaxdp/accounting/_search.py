"""The search engine of inverse accounting (`jaxdp.accounting.inverse`): a parameter (a noise,
a mean number of candidates) whose epsilon is within a target, found method by method for "best".

See `jaxdp.accounting.inverse` for the guarantees: every answer's epsilon was computed and
found within the target (the answer errs on the private side); only its optimality is
approximate (relative `rtol`).
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Union

import dp_accounting as dpa

from jaxdp.accounting import api
from jaxdp.accounting import distributions as dist_lib
from jaxdp.accounting import events as ev
from jaxdp.accounting.display import format_epsilon

Family = Union[str, Callable[[float], dist_lib.KDistribution]]

#: family -> (constructor from the mean, smallest admissible mean (exclusive)).
FAMILIES = {
    "poisson": (lambda m: dist_lib.Poisson(mean=m), 0.0),
    "geometric": (lambda m: dist_lib.Geometric(mean=m), 1.0),
    "logarithmic": (lambda m: dist_lib.Logarithmic(mean=m), 1.0),
    "tnb-0.5": (lambda m: dist_lib.TruncatedNegativeBinomial(0.5, mean=m), 1.0),
}
_MAX_MEAN = 1e9


def _family(family: Family):
  if callable(family):
    return family, 1.0  # a callable's domain is unknown: start just above 1
  if isinstance(family, str) and family.lower() in FAMILIES:
    return FAMILIES[family.lower()]
  raise ValueError(f"family must be one of {tuple(FAMILIES)} or a callable mean -> distribution, "
                   f"got {family!r}")


class Search:
  """The epsilons one search needs, each distinct event accounted once.

  Searches ask for the same event more than once: `calibrate_dp_mechanism`
  re-evaluates the bracket's ends and checks its root, and `plan` asks for
  the epsilon at the mean it found. Accounting is deterministic (every cache
  below it returns exactly what it would recompute), so a remembered epsilon
  is the number a fresh accountant would give. Entries are floats, keyed by
  (event, delta); one `Search` lives for one call of `calibrate`, `max_mean`
  or `plan`, so nothing outlives it.
  """

  def __init__(self, method: str, orders, allow_refined: bool, member_of_best: bool = False):
    self.method, self.orders, self.allow_refined = method, orders, allow_refined
    # As one of "best"'s methods: its own accountant for the method, and an event
    # it cannot account (or a theorem whose condition fails) has epsilon inf.
    self.member_of_best = member_of_best
    self.method_searches: Optional[dict] = None  # "best": one Search per method, made when first needed
    self._epsilons: dict = {}
    self._above: dict = {}  # (event, delta) -> a value its epsilon is known to exceed (`meets`)

  def accountant(self) -> dpa.PrivacyAccountant:
    if self.member_of_best:
      return api.best_member(self.method, orders=self.orders)
    return api.make_accountant(self.method, orders=self.orders, allow_refined=self.allow_refined)

  def _account(self, event, delta: float) -> float:
    try:
      return self.accountant().compose(event).get_epsilon(delta)
    except (dpa.UnsupportedEventError, ev.NotApplicableError):
      if not self.member_of_best:
        raise
      return math.inf

  @staticmethod
  def _key(event, delta: float):
    key = ev.event_key(event)
    return None if key is None else (key, delta)

  def epsilon(self, event, delta: float) -> float:
    """make_accountant(...).compose(event).get_epsilon(delta), remembered."""
    key = self._key(event, delta)
    if key is not None and key in self._epsilons:
      return self._epsilons[key]
    eps = self._account(event, delta)
    if key is not None:
      self._epsilons[key] = eps
    return eps

  def meets(self, event, epsilon: float, delta: float) -> bool:
    """Whether self.epsilon(event, delta) <= epsilon.

    An accountant that can tell early that it does not (`epsilon_exceeds`:
    the PLD mixture, from its first terms) is asked that first; its epsilon
    is then not computed (nor remembered), only that it lies above `epsilon`.
    """
    key = self._key(event, delta)
    if key is not None and key in self._epsilons:
      return self._epsilons[key] <= epsilon
    if key is not None and epsilon < self._above.get(key, -math.inf):
      return False
    try:
      acct = self.accountant().compose(event)
      exceeds = getattr(acct, "epsilon_exceeds", None)
      if exceeds is not None and exceeds(delta, epsilon):
        if key is not None:
          self._above[key] = max(epsilon, self._above.get(key, -math.inf))
        return False
      eps = acct.get_epsilon(delta)
    except (dpa.UnsupportedEventError, ev.NotApplicableError):
      if not self.member_of_best:
        raise
      eps = math.inf
    if key is not None:
      self._epsilons[key] = eps
    return eps <= epsilon

  def fresh_accountant(self) -> "_RememberingAccountant":
    return _RememberingAccountant(self)


class _RememberingAccountant(dpa.PrivacyAccountant):
  """What `calibrate_dp_mechanism` gets as a fresh accountant: `compose` records
  the event and `get_epsilon` asks the search, which accounts it with a real
  accountant (raising what that one raises) unless it already has."""

  def __init__(self, search: Search):
    super().__init__(dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
    self._search = search
    self._event = None

  def _maybe_compose(self, event, count, do_compose):
    if do_compose:
      event = event if count == 1 else dpa.SelfComposedDpEvent(event, count)
      self._event = event if self._event is None else dpa.ComposedDpEvent([self._event, event])
    return None

  def get_epsilon(self, target_delta: float) -> float:
    return self._search.epsilon(self._event, target_delta)

  def get_delta(self, target_epsilon: float) -> float:
    raise NotImplementedError("only get_epsilon is used by calibrate_dp_mechanism")


def calibrate_search(make_event, target_epsilon: float, target_delta: float, search: Search,
                     **kw) -> Optional[float]:
  """`calibrate` with the search's accountant and memory ("best": method by method)."""
  if search.method != "best":
    return _calibrate_one(make_event, target_epsilon, target_delta, search, **kw)
  # The errors "best" raises for an event no method can account, before any search.
  event = make_event(min(max(kw["start"], kw["low"]), kw["high"]))
  api.make_accountant("best", orders=search.orders, allow_refined=search.allow_refined).compose(event)
  if search.method_searches is None:
    search.method_searches = {m: Search(m, search.orders, search.allow_refined, member_of_best=True)
                              for m in api.best_methods(search.allow_refined)}
  # A method that cannot account this kind of event is left out rather than searched for nothing.
  able = {m: s for m, s in search.method_searches.items() if s.accountant().supports(event)}
  return _calibrate_best(make_event, target_epsilon, target_delta, able, **kw)


def _calibrate_best(make_event, target_epsilon: float, target_delta: float, searches: dict, *,
                    low: float,
                    high: float, start: float, increasing: bool, rtol: float,
                    discrete: bool) -> Optional[float]:
  """The most permissive of the methods' answers (see the module docstring).

  With epsilon increasing in x the answer is the largest feasible x, else the
  smallest. Until one method has an answer, each is first asked at the end
  of the range where it is most permissive, and skipped if it fails there.
  A method improves on the answer so far only if it meets the target one
  step (a factor 1 + rtol, or 1 if `discrete`) beyond it; then it is searched
  between that step and the far end of the range, where every earlier method
  failed: from that step by secants (`_calibrate_near`) on a continuous x.
  """
  found, winner = None, None
  edge = low if increasing else high  # where a method's epsilon is smallest: its most permissive x
  params: dict = {}  # event key -> the x it was made from (`_slope` reads the winner's points)

  def event_of(x):
    event = make_event(x)
    key = ev.event_key(event)
    if key is not None:
      params[key] = x
    return event

  for search in searches.values():
    if found is None:
      if not search.meets(event_of(edge), target_epsilon, target_delta):
        continue  # monotone: it meets the target nowhere, and one evaluation said so
      x = _calibrate_one(event_of, target_epsilon, target_delta, search, low=low, high=high, start=start,
                         increasing=increasing, rtol=rtol, discrete=discrete)
    elif discrete:
      step = found + 1 if increasing else found - 1
      if not low <= step <= high or not search.meets(event_of(step), target_epsilon, target_delta):
        continue
      lo, hi = (step, high) if increasing else (low, step)
      x = _calibrate_one(event_of, target_epsilon, target_delta, search, low=lo, high=hi, start=step,
                         increasing=increasing, rtol=rtol, discrete=discrete)
    else:
      x = _calibrate_near(event_of, target_epsilon, target_delta, search, found=found, low=low,
                          high=high,
                          increasing=increasing, rtol=rtol,
                          slope=_slope(winner, params, found, target_delta, increasing))
    if x is not None and (found is None or (x > found if increasing else x < found)):
      found, winner = x, search
  return found


def _slope(search: Optional[Search], params: dict, found: float, target_delta: float,
           increasing: bool) -> Optional[float]:
  """d log(epsilon) / d log(x) of `search`'s method near its answer `found`, from the
  epsilons it computed (no new evaluation), or None if it has no two usable points."""
  if search is None:
    return None
  points = sorted((abs(math.log(params[key] / found)), math.log(params[key]), math.log(eps))
                  for (key, delta), eps in search._epsilons.items()  # pylint: disable=protected-access
                  if delta == target_delta and key in params and params[key] > 0 and 0 < eps < math.inf)
  for (_, t0, g0), (_, t1, g1) in zip(points, points[1:]):
    if t1 != t0:
      slope = (g1 - g0) / (t1 - t0)
      return slope if (slope > 0) == increasing and slope != 0 else None
  return None


#: Secant probes `_calibrate_near` makes before the bracketing walk and Brent's method take over.
_NEAR_PROBES = 6
#: How close (in tolerances, on log x) `_calibrate_near` brings the answer to the predicted root
#: before certifying it: its answers lie at most this much plus the prediction's error above
#: the root (Brent's method promises one tolerance).
_NEAR = 0.2


def _calibrate_near(make_event, target_epsilon: float, target_delta: float, search: Search, *,
                    found: float,
                    low: float, high: float, increasing: bool, rtol: float,
                    slope: Optional[float]) -> Optional[float]:
  """A later method of "best" from one step beyond the answer so far, `found`: its answer if it
  improves on `found`, else None.

  On t = log x, the method is first asked one step (log(1 + rtol)) beyond
  `found` (with `meets`: the PLD mixture can say no from its first terms);
  if it meets the target there, its answer lies between that step and the far
  end of the range. Epsilon is smooth and nearly linear in log x on log scale,
  so a secant on log(epsilon) (from `slope`, the previous winner's, until
  this method has two points of its own) predicts where it crosses the
  target. A probe goes a tenth of a tolerance short of that root (feasible,
  if the prediction holds), and once the feasible end is within `_NEAR`
  tolerances of it, one probe just within the tolerance past it (infeasible)
  certifies it. As soon as
  a feasible and an infeasible point lie within the tolerance of each other,
  the feasible one is the answer: evaluated, on the private side, and optimal
  to rtol, as `calibrate_dp_mechanism` guarantees. After `_NEAR_PROBES`
  probes without that, the bracketing walk and Brent's method finish
  (`_calibrate_one`).
  """
  tol = math.log1p(rtol)
  lo_t, hi_t = math.log(low), math.log(high)
  toward_infeasible = 1.0 if increasing else -1.0
  target = math.log(target_epsilon)
  gaps: dict = {}  # t -> log(epsilon / target) of each point evaluated here

  def evaluate(t):
    event = make_event(math.exp(t))
    if not gaps and not search.meets(event, target_epsilon, target_delta):
      return False
    eps = search.epsilon(event, target_delta)  # remembered by `meets`
    gaps[t] = (math.log(eps) if eps > 0 else -math.inf) - target
    return gaps[t] <= 0

  feasible = math.log(found) + toward_infeasible * tol  # one step beyond the answer so far
  if not lo_t <= feasible <= hi_t or not evaluate(feasible):
    return None
  infeasible = None
  for _ in range(_NEAR_PROBES):
    if infeasible is not None and abs(feasible - infeasible) <= tol:
      return math.exp(feasible)
    if infeasible is None and feasible == (hi_t if increasing else lo_t):
      return math.exp(feasible)  # feasible at the far end of the range
    root = _secant_root(gaps, feasible, infeasible, slope, increasing)
    if root is None:
      break
    if abs(root - feasible) <= _NEAR * tol:
      # The answer is (predicted) within _NEAR tolerances of the root: the point just
      # within the tolerance past it is infeasible and certifies it.
      t = feasible + toward_infeasible * tol * (1.0 - 1e-6)
    else:
      # A feasible point a tenth of a tolerance short of the root: the answer, once an
      # infeasible point within the tolerance (an earlier one, or the next) certifies it.
      t = root - toward_infeasible * tol / 10
    t = min(max(t, lo_t), hi_t)
    if infeasible is not None:
      lo, hi = sorted((feasible, infeasible))
      if not lo < t < hi:
        t = (lo + hi) / 2
    if t in gaps:
      break
    if evaluate(t):
      feasible = t
    else:
      infeasible = t
  if infeasible is not None and abs(feasible - infeasible) <= tol:
    return math.exp(feasible)
  lo_x, hi_x = (math.exp(feasible), high) if increasing else (low, math.exp(feasible))
  if infeasible is not None:
    lo_x, hi_x = sorted((math.exp(feasible), math.exp(infeasible)))
  return _calibrate_one(make_event, target_epsilon, target_delta, search, low=lo_x, high=hi_x,
                        start=math.exp(feasible), increasing=increasing, rtol=rtol, discrete=False)


def _secant_root(gaps: dict, feasible: float, infeasible: Optional[float], slope: Optional[float],
                 increasing: bool) -> Optional[float]:
  """Where log(epsilon / target) is predicted to reach 0 (t = log x), or None.

  Along the secant through the two points nearest the target (in epsilon),
  else through the bracket's ends, else from the feasible end along `slope`;
  a secant or slope whose sign says epsilon is not monotone that way is not used.
  """
  usable = lambda s: s != 0 and math.isfinite(s) and (s > 0) == increasing
  near = sorted((abs(g), t) for t, g in gaps.items() if math.isfinite(g))
  if len(near) >= 2:
    (_, t0), (_, t1) = near[:2]
    own = (gaps[t1] - gaps[t0]) / (t1 - t0)
    if usable(own):
      return t0 - gaps[t0] / own
  g_f = gaps[feasible]
  if not math.isfinite(g_f):
    return None
  if infeasible is not None and math.isfinite(gaps[infeasible]):
    ends = (gaps[infeasible] - g_f) / (infeasible - feasible)
    if usable(ends):
      return feasible - g_f / ends
  if slope is None or not usable(slope):
    return None
  return feasible - g_f / slope


def _calibrate_one(make_event, target_epsilon: float, target_delta: float, search: Search, *,
                   low: float, high: float, start: float, increasing: bool, rtol: float,
                   discrete: bool) -> Optional[float]:
  """`calibrate` with one method's accountant and memory."""
  if discrete:
    to_x, from_x, tol = (lambda t: int(round(t))), (lambda x: float(x)), None
  else:
    to_x, from_x, tol = math.exp, math.log, math.log1p(rtol)
  event_at = lambda t: make_event(to_x(t))
  # The bracketing walk needs only which side of the budget a point is on.
  feasible = lambda t: search.meets(event_at(t), target_epsilon, target_delta)
  lo_t, hi_t = from_x(low), from_x(high)
  t = min(max(from_x(start), lo_t), hi_t)
  ok = feasible(t)
  # Walk away from the feasible side if feasible, towards it otherwise.
  toward_infeasible = 1.0 if increasing else -1.0
  direction = toward_infeasible if ok else -toward_infeasible
  step = math.log(2.0) if not discrete else max(1.0, abs(t))
  for _ in range(200):
    t2 = min(max(t + direction * step, lo_t), hi_t)
    if t2 == t:
      break
    ok2 = feasible(t2)
    if ok2 != ok:
      lo, hi = sorted((t, t2))
      root = dpa.mechanism_calibration.calibrate_dp_mechanism(
          search.fresh_accountant, event_at, target_epsilon, target_delta,
          dpa.mechanism_calibration.ExplicitBracketInterval(lo, hi), discrete=discrete, tol=tol)
      return to_x(root)
    t, ok = t2, ok2
    if discrete:
      step *= 2.0
  return to_x(t) if ok else None


def max_mean_search(base, family: Family, epsilon: float, delta: float, search: Search,
                    rtol: float) -> float:
  """`max_mean` (arguments validated) with the search's accountant and memory."""
  make, floor = _family(family)
  low = floor * (1.0 + 1e-6) if floor > 0 else 1e-6
  found = calibrate_search(lambda m: ev.RepeatAndSelect(base, make(m)), epsilon, delta, search, low=low,
                     high=_MAX_MEAN, start=max(2.0, 2.0 * low), increasing=True, rtol=rtol,
                     discrete=False)
  if found is None:
    event = ev.RepeatAndSelect(base, make(low))
    # As api.epsilon: the arguments were validated, so only the support check differs (it raises).
    eps_lo = api.epsilon(event, delta, search.method, search.orders, allow_refined=search.allow_refined)
    raise ValueError(f"epsilon={epsilon!r} is too small: even mean={low:.6g} needs "
                     f"epsilon={format_epsilon(eps_lo, '.6g')} at delta={delta!r} by method {search.method!r}")
  return found
