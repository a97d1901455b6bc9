"""`epsilon`, `delta`, `report` and `method="best"`: thin functions over the accountants.

Each method is one `dp_accounting.PrivacyAccountant`:

  ==================  ==========================================================
  ``"rdp"``           `RdpSelectionAccountant`: Papernot-Steinke (Koskela-Kulkarni
                      for subset tuning), composing by adding RDP curves
  ``"composition"``   `CompositionAccountant`: every run paid for, by RDP
  ``"profile"``       `ProfileAccountant`: Koskela-Redberg-Wang privacy profiles,
                      composing through dominating PLDs
  ``"profile-refined"`` the same with a derived, tighter c(eps1); opt-in for "best"
  ``"liu-talwar"``    `LiuTalwarAccountant`: pure-DP threshold / random stopping
  ``"pld"``           `PldAccountant`: PLD composition mixed over light-tailed K
  ``"best"``          `BestAccountant`: the minimum over those that support the event
  ==================  ==========================================================
"""

from __future__ import annotations

import dataclasses
import json
from typing import Optional, Sequence

import dp_accounting as dpa

from jaxdp import _validate
from jaxdp.accounting import base
from jaxdp.accounting.display import format_delta, format_epsilon
from jaxdp.accounting import events as ev
from jaxdp.accounting import liu_talwar
from jaxdp.accounting import pld_accountant
from jaxdp.accounting import profile_accountant
from jaxdp.accounting import rdp_accountant
from jaxdp.accounting import subsampled

#: Largest number of mixture terms "best" lets the PLD method use.
BEST_PLD_MAX_TERMS = 24
METHODS = ("rdp", "composition", "profile", "profile-refined", "liu-talwar", "pld")
ALL_METHODS = METHODS + ("best",)
#: Derived, not in the paper: "best" uses it only when the caller opts in
#: (`allow_refined=True`, `jaxdp account --allow-refined`).
OPT_IN_METHODS = ("profile-refined",)
_OPT_IN_WHY = ("profile-refined is opt-in: its c(eps1) is derived in jaxdp, not taken from "
               "the paper (see jaxdp/accounting/profile_selection.py)")


def orders_for(event, orders):
  """The orders `epsilon(event, ..., orders)` uses: integers 2..128 by default
  when the event tunes on a subset (Koskela-Kulkarni), else `orders` as given."""
  if not isinstance(event, dpa.DpEvent):
    raise ev.UnsupportedBaseError(f"event: a base must be a dp_accounting.DpEvent, got {event!r}")
  if ev.contains(event, ev.SubsampledTuning):
    return subsampled.check_integer_orders(orders)
  return orders


def make_accountant(method: str = "best", *, orders: Optional[Sequence[float]] = None,
                    allow_refined: bool = False) -> dpa.PrivacyAccountant:
  """A fresh accountant for `method` (one of `ALL_METHODS`)."""
  if method == "rdp":
    return rdp_accountant.RdpSelectionAccountant(orders)
  if method == "composition":
    return rdp_accountant.CompositionAccountant(orders)
  if method in ("profile", "profile-refined"):
    return profile_accountant.ProfileAccountant(refined=method == "profile-refined", orders=orders)
  if method == "liu-talwar":
    return liu_talwar.LiuTalwarAccountant()
  if method == "pld":
    return pld_accountant.PldAccountant()
  if method == "best":
    return BestAccountant(orders=orders, allow_refined=allow_refined)
  raise ValueError(f"method must be one of {ALL_METHODS}, got {method!r}")


#: The methods "best" takes the minimum over, cheapest first (milliseconds for
#: the RDP and pure-DP methods, up to seconds for the profile and PLD ones).
BEST_BY_COST = ("liu-talwar", "rdp", "composition", "profile", "profile-refined", "pld")


def best_methods(allow_refined: bool = False) -> tuple:
  """The methods "best" uses, cheapest first (`BEST_BY_COST`)."""
  return tuple(m for m in BEST_BY_COST if allow_refined or m not in OPT_IN_METHODS)


def best_member(method: str, *, orders: Optional[Sequence[float]] = None) -> dpa.PrivacyAccountant:
  """A fresh accountant for `method` as "best" uses it (one of `best_methods(True)`).

  PLD mixtures pay one FFT composition per term: "best" takes them only for
  light tails (bounded K, or few terms), where they can beat the selection
  theorems; method "pld" itself goes up to its default.
  """
  if method == "pld":
    return pld_accountant.PldAccountant(max_terms=BEST_PLD_MAX_TERMS)
  return make_accountant(method, orders=orders)


class BestAccountant(base.Accountant):
  """The smallest epsilon (delta) over every method that supports all composed events.

  Each event is composed into the methods that support it; a method that
  cannot account an event drops out (it could no longer account the ledger).

  Args:
    orders: RDP orders for the RDP-based methods.
    allow_refined: also use "profile-refined".
  """

  method = "best"

  def __init__(self, orders: Optional[Sequence[float]] = None, allow_refined: bool = False):
    super().__init__()
    used = best_methods(allow_refined)
    # In METHODS' order, which the messages naming every method follow.
    self.accountants = {m: best_member(m, orders=orders) for m in METHODS if m in used}
    self.dropped: dict = {}

  def _maybe_compose(self, event, count, do_compose):
    reasons = {name: acct.unsupported(event, count) for name, acct in self.accountants.items()}
    able = [name for name, err in reasons.items() if err is None]
    if not able:
      errors = [err for err in reasons.values() if err is not None]
      return base.CompositionErrorDetails(
          errors[0].invalid_event if errors else event,
          "no method supports it: " + "; ".join(f"{m}: {e.error_message}" for m, e in reasons.items()))
    if do_compose:
      for name, err in reasons.items():
        if err is None:
          self.accountants[name].compose(event, count)
        else:
          self.dropped[name] = err.error_message
          del self.accountants[name]
    return None

  def _results(self, fn):
    out = {}
    for name, acct in self.accountants.items():
      try:
        out[name] = fn(acct)
      except ev.NotApplicableError as err:  # a theorem's condition failed at this point
        self.dropped[name] = str(err)
    if not out:
      raise ev.NotApplicableError("no method applies: " + "; ".join(
          f"{m}: {why}" for m, why in self.dropped.items()))
    return out

  def get_epsilon(self, target_delta: float) -> float:
    """The smallest of the methods' epsilons.

    The methods are asked cheapest first, and one that can tell early that
    its epsilon exceeds the smallest so far (`epsilon_exceeds`: the PLD
    mixture, from its first terms) is not computed whole: it cannot be the
    minimum. The number is the minimum over every method, as `_results` gives.
    """
    out = {}
    for name in [m for m in BEST_BY_COST if m in self.accountants]:
      acct = self.accountants[name]
      try:
        exceeds = getattr(acct, "epsilon_exceeds", None)
        if out and exceeds is not None and exceeds(target_delta, min(out.values())):
          continue
        out[name] = acct.get_epsilon(target_delta)
      except ev.NotApplicableError as err:  # as in _results
        self.dropped[name] = str(err)
    if not out:
      raise ev.NotApplicableError("no method applies: " + "; ".join(
          f"{m}: {why}" for m, why in self.dropped.items()))
    return min(out[name] for name in self.accountants if name in out)

  def get_delta(self, target_epsilon: float) -> float:
    return min(self._results(lambda a: a.get_delta(target_epsilon)).values())

  def epsilon_at_most(self, target_delta: float, target_epsilon: float) -> tuple[bool, Optional[float]]:
    """Whether get_epsilon(target_delta) <= target_epsilon, asking the cheapest methods first.

    The minimum over the methods meets the target iff one of them does, so
    the methods are asked cheapest first and the first one that meets it
    ends the search. (Searches over a parameter go further: `inverse.calibrate`
    searches each method on its own, by the same argument.)

    Returns:
      (meets, epsilon): epsilon is get_epsilon(target_delta) exactly when
      every method was asked (always when it does not meet the target), else
      None.

    Raises:
      NotApplicableError: as `get_epsilon`, when no method applies.
    """
    names = [m for m in BEST_BY_COST if m in self.accountants]
    out = {}
    for i, name in enumerate(names):
      try:
        out[name] = self.accountants[name].get_epsilon(target_delta)
      except ev.NotApplicableError as err:  # as in _results
        self.dropped[name] = str(err)
        continue
      if out[name] <= target_epsilon and i + 1 < len(names):
        return True, None
    if not out:
      raise ev.NotApplicableError("no method applies: " + "; ".join(
          f"{m}: {why}" for m, why in self.dropped.items()))
    # Every method was asked: the minimum get_epsilon takes (same methods, same order).
    best = min(out[name] for name in self.accountants if name in out)
    return best <= target_epsilon, best


def _composed(event, method, orders, allow_refined) -> dpa.PrivacyAccountant:
  orders = orders_for(event, orders)
  acct = make_accountant(method, orders=orders, allow_refined=allow_refined)
  err = acct.unsupported(event)
  if err is not None:
    able = [m for m in METHODS if m != method and
            make_accountant(m, orders=orders).supports(event)]
    cls = ev.NotApplicableError if able else ev.UnsupportedBaseError
    raise cls(f"method {method!r} cannot account {ev.describe(err.invalid_event)}: "
              f"{err.error_message}. Methods that can: {', '.join(able) if able else 'none'}")
  return acct.compose(event)


def epsilon(event, delta: float, method: str = "best",
            orders: Optional[Sequence[float]] = None, *, allow_refined: bool = False) -> float:
  """Smallest epsilon such that `event` is (epsilon, delta)-DP by `method`.

  Args:
    event: any DpEvent: jaxdp's selections and guarantees, dp-accounting's
      events, and compositions of both.
    delta: target delta, in (0, 1).
    method: one of `METHODS` or "best" (minimum over the methods that apply).
    orders: RDP orders (all > 1); default dp-accounting's grid (integers
      2..128 with subset tuning).
    allow_refined: let "best" also use "profile-refined".

  Returns:
    epsilon >= 0 (natural-log units); inf if no finite bound exists.

  Raises:
    ValueError: invalid delta, method or orders. `NotApplicableError` naming
      the unsupported part and the methods that could account it;
      `UnsupportedBaseError` if none can.

  Example:
    >>> from jaxdp import accounting as acc
    >>> base = acc.dpsgd_event(256 / 60000, 1.1, 14063)
    >>> acc.format_epsilon(acc.epsilon(acc.RepeatAndSelect(base, acc.Poisson(mean=10)), 1e-5, "rdp"))
    '5.7490'
  """
  delta = _validate.probability("delta", delta)
  return float(_composed(event, method, orders, allow_refined).get_epsilon(delta))


def delta(event, epsilon: float, method: str = "best",  # pylint: disable=redefined-outer-name
          orders: Optional[Sequence[float]] = None, *, allow_refined: bool = False) -> float:
  """Smallest delta such that `event` is (epsilon, delta)-DP by `method` (see `epsilon`)."""
  epsilon = _validate.real("epsilon", epsilon, low=0.0)
  return float(_composed(event, method, orders, allow_refined).get_delta(epsilon))


def rdp_curve(event, orders: Optional[Sequence[float]] = None, method: str = "rdp") -> ev.RdpCurve:
  """The event's RDP curve as an `RdpCurve` ("rdp" or "composition"), e.g. to reuse as a base."""
  if method not in ("rdp", "composition"):
    raise ValueError(f"method must be 'rdp' or 'composition', got {method!r}")
  acct = _composed(event, method, orders, False)
  return ev.RdpCurve(acct.orders, acct.rdp)


@dataclasses.dataclass(frozen=True)
class MethodResult:
  method: str
  epsilon: Optional[float]
  theorem: str


@dataclasses.dataclass(frozen=True)
class Report:
  """Every method's epsilon at one delta, and the tightest (what "best" returns)."""

  event: str
  delta: float
  results: tuple
  best_method: str
  best_epsilon: float
  allow_refined: bool = False

  def to_dict(self) -> dict:
    return {
        "event": self.event,
        "delta": self.delta,
        "methods": [dataclasses.asdict(r) for r in self.results],
        "best": {"method": self.best_method, "epsilon": self.best_epsilon},
        "allow_refined": self.allow_refined,
    }

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2, default=str)

  def __str__(self) -> str:
    width = max(len("method"), *(len(r.method) for r in self.results))
    lines = [f"Privacy of: {self.event}", f"at delta = {format_delta(self.delta)}", "",
             f"{'method':<{width}} {'epsilon':>10}  theorem"]
    for r in self.results:
      eps = "n/a" if r.epsilon is None else format_epsilon(r.epsilon, "10.4f")
      mark = "  <- tightest (used by best)" if r.method == self.best_method else ""
      lines.append(f"{r.method:<{width}} {eps:>10}  {r.theorem}{mark}")
    if not self.allow_refined:
      lines += ["", f"note: {_OPT_IN_WHY}; pass allow_refined=True (CLI: --allow-refined) to use it."]
    return "\n".join(lines)


def method_results(event, delta: float, orders: Optional[Sequence[float]]) -> list:
  """A `MethodResult` per method of `METHODS`: its epsilon and theorem, or epsilon None and
  "not applicable: why" where it refuses the event or its theorem's condition fails."""
  results = []
  for m in METHODS:
    acct = make_accountant(m, orders=orders)
    err = acct.unsupported(event)
    if err is not None:
      results.append(MethodResult(m, None, f"not applicable: {err.error_message}"))
      continue
    try:
      eps = float(acct.compose(event).get_epsilon(delta))
    except ev.NotApplicableError as e:
      results.append(MethodResult(m, None, f"not applicable: {e}"))
      continue
    results.append(MethodResult(m, eps, acct.theorem))
  return results


def report(event, delta: float, orders: Optional[Sequence[float]] = None,  # pylint: disable=redefined-outer-name
           *, allow_refined: bool = False) -> Report:
  """Epsilon at `delta` by every method, marking the one "best" returns.

  Opt-in methods ("profile-refined") are always shown, but count as tightest
  only with `allow_refined=True`.
  """
  delta = _validate.probability("delta", delta)
  results = method_results(event, delta, orders_for(event, orders))
  valid = [r for r in results if r.epsilon is not None
           and (allow_refined or r.method not in OPT_IN_METHODS)]
  if not valid:
    raise ev.UnsupportedBaseError("no method applies: " + "; ".join(
        f"{r.method}: {r.theorem}" for r in results))
  best = min(valid, key=lambda r: r.epsilon)
  return Report(ev.describe(event), delta, tuple(results), best.method, best.epsilon, allow_refined)

