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

  def unsupported(self, event: dpa.DpEvent, count: int = 1) -> Optional[CompositionErrorDetails]:
    """None if `event` (composed `count` times) can be accounted, else the offending part and why."""
    if not isinstance(event, dpa.DpEvent):
      return CompositionErrorDetails(event, f"not a DpEvent: {event!r}")
    return self._maybe_compose(event, count, False)
