"""jaxdp's privacy events: what ran, as `dp_accounting.DpEvent`s.

Every event here is a frozen `dp_accounting.DpEvent` subclass, so it nests in
dp-accounting's `ComposedDpEvent` / `SelfComposedDpEvent` and composes with
everything else a user releases ("tune, train the final model, release a few
statistics"). Events are plain data: the accountants (`rdp_accountant`,
`profile_accountant`, `liu_talwar`, `pld_accountant`) turn them into numbers,
and each says through `supports(event)` whether (and why not) it can.

The event layer is also the one place that knows every event type's shape:
`KINDS` says, for each of dp-accounting's event types and jaxdp's, which
fields hold nested events and how it is described. `children`, `describe`,
`event_key`, `contains` and `is_dp_accounting_only` read it, and the
accountants walk nested events through them; `tests/accounting/test_events.py`
fails for an event type missing there or in any accountant.

This module is the bottom of `jaxdp.accounting`: it imports nothing from jaxdp
but the dependency-free validators and the laws of K that selections hold
(`distributions`, which import only the validators themselves), so every
other module may import it.

Compatibility contract (dp-accounting's, adopted): an event class and its
fields are never removed or re-purposed; new fields are optional.

Example:
  >>> import dp_accounting as dpa
  >>> from jaxdp import accounting as acc
  >>> run = acc.dpsgd_event(256 / 60000, 1.1, acc.dpsgd_steps(60, 256 / 60000))
  >>> tune = acc.RepeatAndSelect(run, acc.Poisson(mean=10))
  >>> release = dpa.ComposedDpEvent([tune, run])   # tune, then train the final model
  >>> acc.format_epsilon(acc.epsilon(release, 1e-5, method="rdp"))  # printed rounded up
  '6.8882'
"""

from __future__ import annotations

import collections.abc
import dataclasses
from typing import Any, Callable, Hashable, Mapping, Optional, Sequence

import numbers

import attr
import dp_accounting as dpa
import numpy as np

from jaxdp import _validate
from jaxdp.accounting import distributions
# The events of one run, re-exported: every event type is reachable from here.
from jaxdp.accounting.run_events import (ApproxDp, PureDp, RdpCurve, ReportNoisyMax, Zcdp,  # noqa: F401
                                         _set, dpsgd_event, dpsgd_steps)


class NotApplicableError(ValueError):
  """An accountant (method) has no theorem covering this event."""


class UnsupportedBaseError(NotApplicableError):
  """No jaxdp accountant can account this event (e.g. an unknown DpEvent)."""


# --------------------------------------------------------------------------- selection


def check_numbers(event) -> None:
  """Raises ValueError if a parameter of `event`, at any depth, is NaN or a one-shot iterator.

  dp-accounting takes its events' fields as given: a NaN noise multiplier or rate accounts to
  about 4e-9 (`GaussianDpEvent(nan)`) and, inside a composition, takes the whole composition
  down with it; an iterator of events (`ComposedDpEvent(map(...))`) is consumed by the first
  accountant that checks it and then composes to nothing (epsilon 0). Every accountant refuses
  both before it checks or composes anything (`base.Accountant`).
  """
  def walk(node, where):
    if isinstance(node, (str, bytes)) or node is None:
      return
    if attr.has(type(node)):
      for field in attr.fields(type(node)):
        walk(getattr(node, field.name), f"{where}.{field.name}")
    elif isinstance(node, collections.abc.Iterator):
      raise ValueError(f"event parameter {where} is a {type(node).__name__}, which the first "
                       "accountant to read it would consume (the next would compose nothing): "
                       "give a list or tuple")
    elif isinstance(node, collections.abc.Mapping):
      for key, value in node.items():
        walk(key, f"{where}[key]")
        walk(value, f"{where}[{key!r}]")
    elif isinstance(node, (collections.abc.Sequence, collections.abc.Set)):
      for i, item in enumerate(node):
        walk(item, f"{where}[{i}]")
    elif isinstance(node, (numbers.Number, np.ndarray, np.generic)) or hasattr(node, "__array__"):
      try:
        array = np.asarray(node)
      except Exception:  # pylint: disable=broad-except  # not numbers: the accountants judge it
        return
      if array.dtype.kind == "O":
        for i, item in enumerate(array.reshape(-1)):
          walk(item, f"{where}[{i}]")
      elif array.dtype.kind in "fc" and np.isnan(array).any():
        raise ValueError(f"event parameter {where} is NaN in {describe(event)}: an event's "
                         "parameters must be numbers (a NaN noise or rate would account to nothing)")
  walk(event, type(event).__name__)


def _check_part(name: str, value) -> None:
  if not isinstance(value, dpa.DpEvent):
    raise UnsupportedBaseError(
        f"{name}: a base must be a dp_accounting.DpEvent (jaxdp's PureDp, Zcdp, RdpCurve, "
        f"ApproxDp, ReportNoisyMax, RepeatAndSelect, ... are DpEvents), got {value!r}")


@attr.s(frozen=True, slots=True, auto_attribs=True)
class RepeatAndSelect(dpa.DpEvent):
  """Run `base` independently K ~ `distribution` times and release only the best run.

  "Best" is by any data-dependent score with a fixed tie-breaking rule; when
  K = 0 the tuner must release a fixed, data-independent default (e.g. "no
  model"), never condition on K >= 1. The base's guarantee must hold for every
  hyperparameter setting the run may draw (Koskela & Kulkarni, Lemma 1; see
  `UniformCandidates` when candidates differ).

  Args:
    base: one run's event: any DpEvent (dp-accounting's or jaxdp's, including
      another selection).
    distribution: the law of K, e.g. `Poisson(mean=10)`.

  Example:
    >>> import dp_accounting as dpa
    >>> from jaxdp import accounting as acc
    >>> ev = acc.RepeatAndSelect(dpa.GaussianDpEvent(4.0), acc.Geometric(mean=10))
    >>> round(acc.epsilon(ev, delta=1e-5, method="rdp"), 4)
    2.1537
  """

  base: dpa.DpEvent
  distribution: distributions.KDistribution

  def __attrs_post_init__(self):
    _check_part("base", self.base)
    distributions.check_distribution(self.distribution)

  def to_dp_event(self) -> dpa.DpEvent:
    """dp-accounting's own `RepeatAndSelectDpEvent`, where it has one.

    Raises:
      ValueError: K is not Poisson (mean >= 1) or truncated negative binomial
        with eta >= 0 (dp-accounting's coverage).
    """
    shape = self.distribution.dp_accounting_shape()
    if shape is None:
      raise ValueError(f"dp-accounting's RepeatAndSelectDpEvent cannot express {self.distribution!r} "
                       "(it covers Poisson with mean >= 1 and truncated negative binomial with eta >= 0)")
    base = self.base.to_dp_event() if isinstance(self.base, RepeatAndSelect) else self.base
    if not is_dp_accounting_only(base):
      raise ValueError(f"base {self.base!r} has no dp-accounting equivalent (it contains a jaxdp event)")
    return dpa.dp_event.RepeatAndSelectDpEvent(base, float(self.distribution.mean), shape)


@attr.s(frozen=True, slots=True, auto_attribs=True)
class SelectionWithCount(dpa.DpEvent):
  """A `RepeatAndSelect` whose number of runs K is released beside the best run.

  K is the selection's internal randomness: the repeat-and-select theorems
  (Papernot-Steinke, Koskela-Redberg-Wang, Liu-Talwar) bound the mixture over
  K of best-of-K and hold only while K stays hidden. Published, K makes the
  release best-of-k for that k, which can cost k runs composed. The pair (K,
  best) is a post-processing of the K-run transcript, a mixture over k of
  k-fold compositions with data-independent weights, so the methods that bound
  that transcript cover it: "composition" (RDP, E[e^{(l-1) K eps(l)}]) and
  "pld" (sum_k P(K=k) delta_{base^k}(eps)); the others refuse it
  (REFERENCE.md §7c).

  Example:
    >>> import dp_accounting as dpa
    >>> from jaxdp import accounting as acc
    >>> hidden = acc.RepeatAndSelect(dpa.GaussianDpEvent(4.0), acc.Poisson(mean=10))
    >>> round(acc.epsilon(acc.SelectionWithCount(hidden), 1e-5), 2) > round(acc.epsilon(hidden, 1e-5), 2)
    True
  """

  selection: RepeatAndSelect

  def __attrs_post_init__(self):
    if not isinstance(self.selection, RepeatAndSelect):
      raise ValueError(f"selection must be a RepeatAndSelect, got {self.selection!r}")


@attr.s(frozen=True, slots=True, auto_attribs=True)
class RandomStopping(dpa.DpEvent):
  """Liu-Talwar Algorithm 2: run `base`, stop w.p. `stop_prob` after each run,
  release the best run; `max_iterations` = hard stop T (None: no cap).

  Repeat-and-select with K ~ Geometric(stop_prob) (min(Geometric, T) with a
  cap), so every selection accountant applies; "liu-talwar" adds Thm 3.2 / 3.5
  for pure bases.

  Example:
    >>> from jaxdp import accounting as acc
    >>> ev = acc.RandomStopping(acc.PureDp(1.0), stop_prob=0.1)
    >>> acc.epsilon(ev, 1e-6, method="liu-talwar") <= 3.0
    True
  """

  base: dpa.DpEvent
  stop_prob: float
  max_iterations: Optional[int] = None

  def __attrs_post_init__(self):
    _check_part("base", self.base)
    _set(self, "stop_prob", _validate.probability("stop_prob", self.stop_prob))
    if self.max_iterations is not None:
      _set(self, "max_iterations", _validate.integer("max_iterations", self.max_iterations, low=1))


@attr.s(frozen=True, slots=True, auto_attribs=True)
class ThresholdSelect(dpa.DpEvent):
  """Liu-Talwar Algorithm 1: call `base` until its score reaches a known
  threshold; after each miss stop with probability `stop_prob` (output BOT);
  at most `max_iterations` calls (None: unbounded).

  Args:
    base: one call's event; the Liu-Talwar theorems need it to be pure DP.
    stop_prob: gamma in (0, 1].
    max_iterations: T >= 1 or None.

  Example:
    >>> from jaxdp import accounting as acc
    >>> round(acc.epsilon(acc.ThresholdSelect(acc.PureDp(0.5), 0.1), 1e-6), 4)
    1.0
  """

  base: dpa.DpEvent
  stop_prob: float
  max_iterations: Optional[int] = None

  def __attrs_post_init__(self):
    _check_part("base", self.base)
    _set(self, "stop_prob", _validate.probability("stop_prob", self.stop_prob, one_ok=True))
    if self.max_iterations is not None:
      _set(self, "max_iterations", _validate.integer("max_iterations", self.max_iterations, low=1))


@attr.s(frozen=True, slots=True, auto_attribs=True)
class UniformCandidates(dpa.DpEvent):
  """One run of a candidate drawn at random from candidates with different guarantees.

  Its RDP (and privacy profile) is at most the pointwise worst candidate's
  (joint convexity; Koskela & Kulkarni Lemma 1, KRW Cor 6.2), so it is the
  base of `RepeatAndSelect` when hyperparameters change a run's privacy
  (sampling rate, epochs, sigma).

  Args:
    candidates: non-empty sequence of DpEvents.
  """

  candidates: Sequence[dpa.DpEvent]

  def __attrs_post_init__(self):
    cands = () if isinstance(self.candidates, (str, bytes)) else tuple(self.candidates)
    if not cands:
      raise ValueError(f"candidates must be a non-empty sequence of DpEvents, got {self.candidates!r}")
    for i, c in enumerate(cands):
      _check_part(f"candidates[{i}]", c)
    _set(self, "candidates", cands)


@attr.s(frozen=True, slots=True, auto_attribs=True)
class SubsampledTuning(dpa.DpEvent):
  """Koskela-Kulkarni tuning on a Poisson subset, then one final training run.

  Args:
    tune: the private search run on the subset, a `RepeatAndSelect` (the paper
      uses K ~ Poisson). Its base is one candidate's event *on the subset*.
    final: the final training run's event.
    q: subset sampling rate in (0, 1).
    variant: 1 (final run on X \\ X1, KK Thm 1) or 2 (final run on X; Zhu-Wang
      + composition).
  """

  tune: RepeatAndSelect
  final: dpa.DpEvent
  q: float
  variant: int = 1

  def __attrs_post_init__(self):
    if not isinstance(self.tune, RepeatAndSelect):
      raise ValueError(f"tune must be a RepeatAndSelect event, got {self.tune!r}")
    _check_part("final", self.final)
    _set(self, "q", _validate.probability("q", self.q))
    if self.variant not in (1, 2) or isinstance(self.variant, bool):
      raise ValueError(f"variant must be 1 or 2, got {self.variant!r}")


# --------------------------------------------------------------------------- structure


@dataclasses.dataclass(frozen=True)
class EventKind:
  """What the event layer knows about one event type.

  Attributes:
    nested: the names of the fields that hold nested events (one event, or a
      sequence of them), in the order `children` lists them.
    describe: a readable one-line description of an event of this type;
      nested events are described through `describe`.
  """

  nested: tuple
  describe: Callable[[Any], str]


def _describe_self_composed(event) -> str:
  inner = event.event
  if isinstance(inner, dpa.PoissonSampledDpEvent) and isinstance(inner.event, dpa.GaussianDpEvent):
    return (f"DP-SGD(q={inner.sampling_probability:.6g}, sigma={inner.event.noise_multiplier:.6g}, "
            f"steps={event.count})")
  return f"{event.count} x [{describe(inner)}]"


def _describe_composed(event) -> str:
  return " + ".join(f"[{describe(e)}]" if isinstance(e, dpa.ComposedDpEvent) else describe(e)
                    for e in event.events) or "nothing"


def _describe_stopping(name: str, unit: str) -> Callable[[Any], str]:
  def describe_one(event) -> str:
    cap = "" if event.max_iterations is None else f", at most {event.max_iterations} {unit}"
    return f"{name} (stop_prob={event.stop_prob:g}{cap}) over {describe(event.base)}"
  return describe_one


_LEAF = ()
_EVENT = ("event",)
_BASE = ("base",)

#: Every event type jaxdp knows: dp-accounting's and its own. A type missing
#: here has no children, no key (unless hashable) and its repr as description,
#: and no accountant claims it; test_events.py fails until it is added.
KINDS: Mapping[type, EventKind] = {
    # dp-accounting's events.
    dpa.NoOpDpEvent: EventKind(_LEAF, repr),
    dpa.NonPrivateDpEvent: EventKind(_LEAF, repr),
    dpa.UnsupportedDpEvent: EventKind(_LEAF, repr),
    dpa.GaussianDpEvent: EventKind(_LEAF, lambda e: f"Gaussian(sigma={e.noise_multiplier:.6g})"),
    dpa.LaplaceDpEvent: EventKind(_LEAF, repr),
    dpa.dp_event.DiscreteLaplaceDpEvent: EventKind(_LEAF, repr),
    dpa.dp_event.MixtureOfGaussiansDpEvent: EventKind(_LEAF, repr),
    dpa.dp_event.RandomizedResponseDpEvent: EventKind(_LEAF, repr),
    dpa.dp_event.ZCDpEvent: EventKind(_LEAF, repr),
    dpa.SingleEpochTreeAggregationDpEvent: EventKind(_LEAF, repr),
    dpa.dp_event.TruncatedSubsampledGaussianDpEvent: EventKind(_LEAF, repr),
    dpa.PoissonSampledDpEvent: EventKind(
        _EVENT, lambda e: f"Poisson-sampled(q={e.sampling_probability:.6g}) {describe(e.event)}"),
    dpa.SampledWithReplacementDpEvent: EventKind(_EVENT, repr),
    dpa.SampledWithoutReplacementDpEvent: EventKind(_EVENT, repr),
    dpa.dp_event.RepeatAndSelectDpEvent: EventKind(_EVENT, repr),
    dpa.SelfComposedDpEvent: EventKind(_EVENT, _describe_self_composed),
    dpa.ComposedDpEvent: EventKind(("events",), _describe_composed),
    # jaxdp's events.
    PureDp: EventKind(_LEAF, lambda e: f"{e.epsilon:g}-DP"),
    Zcdp: EventKind(_LEAF, lambda e: f"{e.rho:g}-zCDP"),
    RdpCurve: EventKind(_LEAF, repr),
    ApproxDp: EventKind(_LEAF, lambda e: f"({e.epsilon:g}, {e.delta:g})-DP"),
    ReportNoisyMax: EventKind(_LEAF, repr),
    RepeatAndSelect: EventKind(
        _BASE, lambda e: f"best of K ~ {e.distribution!r} runs of {describe(e.base)}"),
    SelectionWithCount: EventKind(("selection",), lambda e: f"{describe(e.selection)}, and K"),
    RandomStopping: EventKind(_BASE, _describe_stopping("random stopping", "runs")),
    ThresholdSelect: EventKind(_BASE, _describe_stopping("threshold selection", "calls")),
    UniformCandidates: EventKind(
        ("candidates",), lambda e: "one of {" + ", ".join(describe(c) for c in e.candidates) + "} at random"),
    SubsampledTuning: EventKind(
        ("tune", "final"), lambda e: (f"tuning on a q={e.q:g} subset ({describe(e.tune)}), then final run "
                                      f"{describe(e.final)} (variant {e.variant})")),
}

#: jaxdp's own event types: every accountant has a rule for each (`base.Accountant`).
JAXDP_EVENTS: tuple = tuple(cls for cls in KINDS if cls.__module__.startswith("jaxdp."))


def lookup(table: Mapping[type, Any], event) -> Any:
  """`table`'s entry for the type of `event`, or for its nearest base class in `table`; else None.

  Subclasses of an event type are that type to the event layer and the
  accountants, as they were to the `isinstance` checks this replaces.
  """
  for cls in type(event).__mro__:
    if cls in table:
      return table[cls]
  return None


def children(event) -> tuple:
  """The events nested in `event` (the parts of a composition, a selection's base, ...), in order.

  () for a leaf and for a type `KINDS` does not know.
  """
  kind = lookup(KINDS, event)
  if kind is None:
    return ()
  out = []
  for name in kind.nested:
    value = getattr(event, name)
    out.extend(value if isinstance(value, (list, tuple)) else (value,))
  return tuple(out)


def describe(event) -> str:
  """A readable one-line description of an event (its repr if `KINDS` does not know its type)."""
  kind = lookup(KINDS, event)
  return repr(event) if kind is None else kind.describe(event)


def event_key(event) -> Optional[Hashable]:
  """A hashable stand-in for `event`, equal exactly for equal events; None if there is none.

  Events are frozen attrs classes, equal and hashable by value, so a hashable
  event is its own key. One that holds a list (dp-accounting's
  `ComposedDpEvent` accepts one) or nests such an event becomes a tuple of
  its type and its fields, nested events by their keys and lists tagged as
  lists: equal for equal events and for nothing else, so a cache keyed by it
  returns exactly what a miss computes.
  """
  try:
    hash(event)
    return event
  except TypeError:
    pass
  kind = lookup(KINDS, event)
  if kind is None or not attr.has(type(event)):
    return None
  try:
    key = (type(event),) + tuple(_field_key(getattr(event, a.name), a.name in kind.nested)
                                 for a in attr.fields(type(event)))
    hash(key)
  except (TypeError, _NoKey):
    return None
  return key


class _NoKey(Exception):
  """A nested event has no key (so neither has the event holding it)."""


def _field_key(value, nested: bool) -> Hashable:
  # A list and a tuple of the same items make unequal events: the tag keeps them apart.
  if isinstance(value, (list, tuple)):
    return (type(value), tuple(_field_key(v, nested) for v in value))
  if not nested:
    return value
  key = event_key(value)
  if key is None:
    raise _NoKey
  return key


def contains(event, cls) -> bool:
  """Whether `event` is, or nests at any depth, an event of type `cls`."""
  return isinstance(event, cls) or any(contains(c, cls) for c in children(event))


def is_dp_accounting_only(event) -> bool:
  """True if `event` is built from dp-accounting's own events alone (no jaxdp event inside)."""
  return (isinstance(event, dpa.DpEvent) and type(event).__module__.startswith("dp_accounting")
          and all(is_dp_accounting_only(c) for c in children(event)))
