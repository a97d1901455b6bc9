"""The accountant interface every jaxdp method implements.

dp-accounting's `PrivacyAccountant` (`supports`, `compose`, `get_epsilon`,
`get_delta`, one `_maybe_compose` traversal) plus `unsupported(event)`, which
returns *why* an event cannot be accounted, so `best`, `report` and error
messages can say so without reaching into another object's private method.
"""

from __future__ import annotations

from typing import Optional

import dp_accounting as dpa

CompositionErrorDetails = dpa.PrivacyAccountant.CompositionErrorDetails


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
    raise NotImplementedError

  def unsupported(self, event: dpa.DpEvent, count: int = 1) -> Optional[CompositionErrorDetails]:
    """None if `event` (composed `count` times) can be accounted, else the offending part and why."""
    if not isinstance(event, dpa.DpEvent):
      return CompositionErrorDetails(event, f"not a DpEvent: {event!r}")
    return self._maybe_compose(event, count, False)
