"""Cross-checking one event's epsilon: every jaxdp method beside dp_accounting's own accountants.

Two numbers for one search can both be right: each method proves an upper
bound on the same event's privacy loss, by a different theorem, and the
smallest is the tightest. `cross_check` puts them side by side with the
theorem each one is and the tests that hold it to exact computations, and
adds what dp_accounting computes on its own (its `RdpAccountant` and
`PLDAccountant`) where the event has a dp_accounting equivalent.

  >>> import dp_accounting as dpa
  >>> from jaxdp import accounting as acc
  >>> check = acc.cross_check(acc.RepeatAndSelect(dpa.GaussianDpEvent(4.0), acc.Geometric(mean=10)), 1e-5)
  >>> [(r.method, round(r.epsilon, 4)) for r in check.rows if r.method in ("rdp", "dp_accounting rdp")]
  [('rdp', 2.1537), ('dp_accounting rdp', 2.1537)]
"""

from __future__ import annotations

import dataclasses
import json
from typing import Optional, Sequence

import dp_accounting as dpa

from jaxdp import _validate
from jaxdp.accounting import api
from jaxdp.accounting import events as ev
from jaxdp.accounting.display import format_delta, format_epsilon

DPA_RDP, DPA_PLD = "dp_accounting rdp", "dp_accounting pld"

#: Where each bound is held to exact computations (test files of this repository).
CHECKED_BY = {
    "rdp": "tests/accounting/test_rdp_selection.py (= dp_accounting's RDP), "
           "tests/accounting/test_soundness_profiles.py (>= exact)",
    "composition": "tests/accounting/test_accountants.py (= dp_accounting's RDP composition), "
                   "tests/accounting/test_soundness_profiles.py (>= exact)",
    "profile": "tests/accounting/test_profile_selection.py (KRW's values), "
               "tests/accounting/test_soundness_profiles.py (>= exact)",
    "profile-refined": "tests/accounting/test_profile_selection.py, "
                       "tests/accounting/test_soundness_profiles.py (>= exact)",
    "liu-talwar": "tests/accounting/test_liu_talwar.py, "
                  "tests/accounting/test_soundness_profiles.py (>= exact)",
    "pld": "tests/accounting/test_pld_accountant.py (>= exact; = dp_accounting's PLD for fixed K), "
           "tests/accounting/test_soundness_profiles.py (>= exact)",
    DPA_RDP: "dp_accounting's own tests; = jaxdp's rdp where both apply "
             "(tests/accounting/test_rdp_selection.py)",
    DPA_PLD: "dp_accounting's own tests; = jaxdp's pld without random K "
             "(tests/accounting/test_pld_accountant.py)",
}

LEGEND = ("legend: each epsilon is an upper bound, proved by the theorem beside it, for the same "
          "event at this delta: all are valid, the smallest is the tightest (*: what "
          "method='best' returns); n/a: the method does not apply, and why.")


@dataclasses.dataclass(frozen=True)
class CrossCheckRow:
  """One method's epsilon for the event.

  Attributes:
    method: a jaxdp method (`METHODS`), "dp_accounting rdp" or "dp_accounting pld".
    epsilon: the upper bound at the delta, or None where the method does not apply.
    bound: the theorem the epsilon is, or "does not apply: why".
    checked_by: the tests that hold this bound to exact computations.
  """

  method: str
  epsilon: Optional[float]
  bound: str
  checked_by: str

  @property
  def applies(self) -> bool:
    return self.epsilon is not None


@dataclasses.dataclass(frozen=True)
class CrossCheck:
  """Every method's epsilon for one event at one delta (`cross_check`).

  Attributes:
    event: the event's description.
    delta: the target delta.
    rows: a `CrossCheckRow` per jaxdp method, then dp_accounting's RDP and PLD.
    best_method: the method `acc.epsilon(event, delta)` ("best") uses, or None if none applies.
  """

  event: str
  delta: float
  rows: tuple
  best_method: Optional[str]

  def to_dict(self) -> dict:
    return {"event": self.event, "delta": self.delta, "best_method": self.best_method,
            "rows": [dict(dataclasses.asdict(r), applies=r.applies) for r in self.rows]}

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2)

  def __str__(self) -> str:
    width = max(len(r.method) for r in self.rows) + 2
    lines = [f"Cross-check of: {self.event}", f"at delta = {format_delta(self.delta)}", "",
             f"{'method':<{width}} {'epsilon':>10}  bound (theorem)"]
    for r in self.rows:
      name = r.method + (" *" if r.method == self.best_method else "")
      eps = format_epsilon(r.epsilon, "10.4f") if r.applies else f"{'n/a':>10}"
      lines.append(f"{name:<{width}} {eps}  {r.bound}")
    lines += ["", "held to exact computations by:"]
    lines += [f"  {r.method:<{width}}{r.checked_by}" for r in self.rows]
    return "\n".join(lines + ["", LEGEND])


def dp_accounting_event(event: dpa.DpEvent) -> dpa.DpEvent:
  """`event` in dp_accounting's own event types: jaxdp's `RepeatAndSelect` becomes its
  `RepeatAndSelectDpEvent` (Poisson K with mean >= 1, truncated negative binomial K with
  eta >= 0), at any depth of a composition.

  Raises:
    NotApplicableError: a part has no dp_accounting equivalent (naming it and why).
  """
  if isinstance(event, ev.RepeatAndSelect):
    shape = event.distribution.dp_accounting_shape()
    if shape is None:
      raise ev.NotApplicableError(
          f"dp_accounting's RepeatAndSelectDpEvent cannot express K ~ {event.distribution!r} "
          "(it covers Poisson with mean >= 1 and truncated negative binomial with eta >= 0)")
    return dpa.dp_event.RepeatAndSelectDpEvent(dp_accounting_event(event.base),
                                               float(event.distribution.mean), shape)
  if isinstance(event, dpa.ComposedDpEvent):
    return dpa.ComposedDpEvent([dp_accounting_event(e) for e in event.events])
  if isinstance(event, dpa.SelfComposedDpEvent):
    return dpa.SelfComposedDpEvent(dp_accounting_event(event.event), event.count)
  if ev.is_dp_accounting_only(event):
    return event
  raise ev.NotApplicableError(f"{ev.describe(event)} is jaxdp's {type(event).__name__}, which has "
                              "no dp_accounting equivalent")


def _dp_accounting_row(name: str, acct: dpa.PrivacyAccountant, bound: str, event, delta) -> CrossCheckRow:
  try:
    native = dp_accounting_event(event)
    if not acct.supports(native):
      what = ("RepeatAndSelectDpEvent (a random number of runs)"
              if ev.contains(native, dpa.dp_event.RepeatAndSelectDpEvent) else ev.describe(native))
      raise ev.NotApplicableError(f"dp_accounting's {type(acct).__name__} does not support {what}")
    # dp_accounting's own refusals (a theorem's condition, e.g. K's mean below 1) are ValueErrors.
    eps = float(acct.compose(native).get_epsilon(delta))
  except (ValueError, NotImplementedError) as err:
    return CrossCheckRow(name, None, f"does not apply: {err}", CHECKED_BY[name])
  return CrossCheckRow(name, eps, bound, CHECKED_BY[name])


def cross_check(event: dpa.DpEvent, delta: float, orders: Optional[Sequence[float]] = None, *,
                allow_refined: bool = False) -> CrossCheck:
  """Epsilon at `delta` by every jaxdp method and by dp_accounting's RDP and PLD accountants.

  Args:
    event: any DpEvent (as `acc.epsilon`).
    delta: target delta, in (0, 1).
    orders: RDP orders for the RDP-based methods, jaxdp's and dp_accounting's (default: each
      one's default grid).
    allow_refined: whether "best" (the row marked `*`) may be "profile-refined".

  Returns:
    A `CrossCheck`; a method that refuses the event is a row that does not apply, not an error.

  Raises:
    ValueError: invalid delta or orders.
  """
  delta = _validate.probability("delta", delta)
  results = api.method_results(event, delta, api.orders_for(event, orders))
  rows = [CrossCheckRow(r.method, r.epsilon,
                        r.theorem if r.epsilon is not None else
                        "does not apply: " + r.theorem.removeprefix("not applicable: "),
                        CHECKED_BY[r.method]) for r in results]
  selection = ev.contains(event, ev.RepeatAndSelect)
  rdp_bound = ("RDP: PS Thm 2 (TNB K) / Thm 6 (Poisson K) on the base's RDP, then PS Lemma 14"
               if selection else "RDP composition (Mironov 2017), then PS Lemma 14")
  # PS Lemma 14 is Canonne-Kamath-Steinke's RDP-to-DP conversion, which dp_accounting uses.
  rows.append(_dp_accounting_row(DPA_RDP, dpa.rdp.RdpAccountant(None if orders is None else list(orders)),
                                 rdp_bound, event, delta))
  rows.append(_dp_accounting_row(DPA_PLD, dpa.pld.PLDAccountant(),
                                 "PLD composition, pessimistic discretisation (interval 1e-4)",
                                 event, delta))
  usable = [r for r in rows[:len(results)]
            if r.applies and (allow_refined or r.method not in api.OPT_IN_METHODS)]
  best = min(usable, key=lambda r: r.epsilon).method if usable else None
  return CrossCheck(ev.describe(event), delta, tuple(rows), best)
