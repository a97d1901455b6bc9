"""Privacy events that dp-accounting lacks: repeat-and-select over a random K.

Events are plain data (frozen dataclasses), like dp-accounting's `DpEvent`s:
they describe what ran; `jaxdp.accounting.epsilon` turns them into numbers.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Union

import dp_accounting as dpa

from jaxdp.accounting import distributions as dist_lib
from jaxdp.accounting import guarantees


@dataclasses.dataclass(frozen=True)
class RepeatAndSelect:
  """Run `base` independently K ~ `distribution` times and release only the best run.

  "Best" is by any data-dependent score with a fixed tie-breaking rule; when
  K = 0 the tuner must release a fixed, data-independent default (e.g. "no
  model"), never condition on K >= 1.

  Args:
    base: one run's guarantee: a `dp_accounting.DpEvent` that dp-accounting's
      RDP accountant supports, `PureDp`, `Zcdp`, `RdpCurve`, or another
      `RepeatAndSelect`. The guarantee must hold for every hyperparameter
      setting the run may draw (Koskela & Kulkarni, Lemma 1).
    distribution: the law of K, e.g. `Poisson(mean=10)`.

  Example:
    >>> import dp_accounting as dpa
    >>> from jaxdp import accounting as acc
    >>> ev = acc.RepeatAndSelect(dpa.GaussianDpEvent(4.0), acc.Geometric(mean=10))
    >>> round(acc.epsilon(ev, delta=1e-5, method="rdp"), 4)
    2.1537
  """

  base: Any
  distribution: dist_lib.KDistribution

  def __post_init__(self):
    check_base(self.base)
    dist_lib._check_dist(self.distribution)  # pylint: disable=protected-access

  def to_dp_event(self) -> dpa.DpEvent:
    """The equivalent `dp_accounting` event, where dp-accounting has one.

    Raises:
      ValueError: the base is not a DpEvent or K is not Poisson/truncated
        negative binomial with mean >= 1 (dp-accounting's coverage).
    """
    d = self.distribution
    base = self.base.to_dp_event() if isinstance(self.base, RepeatAndSelect) else self.base
    if not isinstance(base, dpa.DpEvent):
      raise ValueError(f"base {self.base!r} has no dp-accounting DpEvent equivalent")
    if isinstance(d, dist_lib.Poisson) and d.mean >= 1:
      shape = math.inf
    elif isinstance(d, dist_lib.TruncatedNegativeBinomial) and d.eta >= 0:
      shape = d.eta
    else:
      raise ValueError(f"dp-accounting's RepeatAndSelectDpEvent cannot express {d!r} "
                       "(it covers Poisson with mean >= 1 and eta >= 0)")
    return dpa.dp_event.RepeatAndSelectDpEvent(base, d.mean, shape)


Base = Union[dpa.DpEvent, guarantees.PureDp, guarantees.Zcdp, guarantees.RdpCurve, RepeatAndSelect]


def check_base(base) -> None:
  """Raises `UnsupportedBaseError` unless `base` can be accounted."""
  from jaxdp.accounting import subsampled  # pylint: disable=g-import-not-at-top
  if isinstance(base, (RepeatAndSelect, subsampled.UniformCandidates) + guarantees.PLAIN_GUARANTEES):
    return
  if isinstance(base, dpa.DpEvent):
    if not dpa.rdp.RdpAccountant().supports(base):
      raise guarantees.UnsupportedBaseError(
          f"base={base!r}: dp-accounting's RdpAccountant cannot account this DpEvent")
    return
  raise guarantees.UnsupportedBaseError(
      f"base must be a dp_accounting.DpEvent, PureDp, Zcdp, RdpCurve, UniformCandidates or "
      f"RepeatAndSelect, got {base!r}")
