"""The accountant interface every jaxdp method implements.

dp-accounting's `PrivacyAccountant` (`supports`, `compose`, `get_epsilon`,
`get_delta`, one `_maybe_compose` traversal) plus `unsupported(event)`, which
returns *why* an event cannot be accounted, so `best`, `report` and error
messages can say so without reaching into another object's private method.

Every part the traversal reaches goes to one rule of the accountant
(`_rules()`: one method per event kind), which either composes it or says
why not, depending only on `do_compose`: `supports()` and `compose()` run
the same code, so they cannot drift apart. Nested parts are checked through
`self` again. dp-accounting's own events without a rule go to
`_dp_accounting_part` (dp-accounting's accountant decides); a jaxdp event
without a rule is a bug, and raises.
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional

import dp_accounting as dpa

from jaxdp.accounting import events as ev

CompositionErrorDetails = dpa.PrivacyAccountant.CompositionErrorDetails
#: A rule: (event, count, do_compose) -> None (accounted, or accountable) or why not.
Rule = Callable[[dpa.DpEvent, int, bool], Optional[CompositionErrorDetails]]


class Accountant(dpa.PrivacyAccountant):
  """A jaxdp accounting method (add/remove-one neighbours, like dp-accounting's default).

  Attributes:
    method: the method's name in `jaxdp.accounting.METHODS`.
    theorem: (property) the results used for what was composed, for reports.
  """

  method: str = ""

  def __init__(self):
    super().__init__(dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)

  def _maybe_compose(self, event, count, do_compose) -> Optional[CompositionErrorDetails]:
    """dp-accounting's traversal: no-ops, compositions and self-compositions are
    walked here; every other part goes to `_compose_part`."""
    if isinstance(event, dpa.NoOpDpEvent):
      return None
    if isinstance(event, dpa.ComposedDpEvent):
      for e in event.events:
        err = self._maybe_compose(e, count, do_compose)
        if err is not None:
          return err
      return None
    if isinstance(event, dpa.SelfComposedDpEvent) and self._unrolls(event):
      return self._maybe_compose(event.event, count * event.count, do_compose)
    return self._compose_part(event, count, do_compose)

  def _unrolls(self, event: dpa.SelfComposedDpEvent) -> bool:
    """Whether a self-composition is walked into (True) or composed as one part."""
    del event
    return True

  def _compose_part(self, event, count: int, do_compose: bool) -> Optional[CompositionErrorDetails]:
    """Account (or, with do_compose=False, only check) one part composed `count` times."""
    rule = ev.lookup(self._rules(), event)
    if rule is not None:
      return rule(event, count, do_compose)
    if isinstance(event, ev.JAXDP_EVENTS):
      raise NotImplementedError(f"{type(self).__name__} has no rule for jaxdp's {type(event).__name__}: "
                                "every accountant needs one per jaxdp event kind (its _rules())")
    if not isinstance(event, dpa.DpEvent):
      return CompositionErrorDetails(event, f"not a DpEvent: {event!r}")
    return self._dp_accounting_part(event, count, do_compose)

  def _rules(self) -> Mapping[type, Rule]:
    """{event type: rule}: one rule for every jaxdp event kind (`events.JAXDP_EVENTS`)."""
    return {}

  def _dp_accounting_part(self, event, count: int, do_compose: bool) -> Optional[CompositionErrorDetails]:
    """A dp-accounting event with no rule of its own here."""
    raise NotImplementedError

  def _refuse(self, why: str, event, count: int, do_compose: bool) -> CompositionErrorDetails:
    """The rule of an event kind this method has no theorem for (bind `why` with functools.partial)."""
    del count, do_compose
    return CompositionErrorDetails(event, why)

  def unsupported(self, event: dpa.DpEvent, count: int = 1) -> Optional[CompositionErrorDetails]:
    """None if `event` (composed `count` times) can be accounted, else the offending part and why.

    Raises:
      ValueError: a parameter of `event` is NaN or a one-shot iterator (`events.check_numbers`).
    """
    if not isinstance(event, dpa.DpEvent):
      return CompositionErrorDetails(event, f"not a DpEvent: {event!r}")
    ev.check_numbers(event)
    return self._maybe_compose(event, count, False)

  def supports(self, event: dpa.DpEvent) -> bool:
    return self.unsupported(event) is None

  def compose(self, event: dpa.DpEvent, count: int = 1) -> "Accountant":
    """dp-accounting's `compose`, after `events.check_numbers`."""
    ev.check_numbers(event)
    return super().compose(event, count)
