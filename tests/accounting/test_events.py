"""The event layer: one traversal of nested events, one description and one key per event.

Every event type jaxdp knows (dp-accounting's and its own, enumerated from
the modules that define them) is built here, alone and nested in
`ComposedDpEvent` / `SelfComposedDpEvent`, and checked for its children, its
description, its key and every method's `supports` / `unsupported`. So a new
event type fails these tests until it is fully handled: a row in
`events.KINDS` (its nested fields and its description; its key follows), an
example below, and a rule in every accountant (`base.Accountant._rules`; a
jaxdp event without one raises).
"""

from __future__ import annotations

import copy
import importlib
import math
import pkgutil
import sys

import attr
import dp_accounting as dpa
import pytest

import jaxdp.accounting
from jaxdp import accounting as acc
from jaxdp.accounting import _dpa
from jaxdp.accounting import events as ev

G = dpa.GaussianDpEvent
_D = dpa.dp_event
#: A list makes a composition unhashable: its key is built from its parts'.
LISTED = dpa.ComposedDpEvent([G(2.0), dpa.LaplaceDpEvent(1.0)])

# Small parameters (milliseconds each); two examples where a type has two shapes worth keying.
EXAMPLES = {
    dpa.NoOpDpEvent: [dpa.NoOpDpEvent()],
    dpa.NonPrivateDpEvent: [dpa.NonPrivateDpEvent()],
    dpa.UnsupportedDpEvent: [dpa.UnsupportedDpEvent()],
    dpa.GaussianDpEvent: [G(2.0), G(3.0)],
    dpa.LaplaceDpEvent: [dpa.LaplaceDpEvent(1.0)],
    _D.DiscreteLaplaceDpEvent: [_D.DiscreteLaplaceDpEvent(0.5, 1)],
    _D.MixtureOfGaussiansDpEvent: [_D.MixtureOfGaussiansDpEvent(2.0, [1.0], [1.0])],
    _D.RandomizedResponseDpEvent: [_D.RandomizedResponseDpEvent(0.5, 4)],
    _D.ZCDpEvent: [_D.ZCDpEvent(0.1, 0.0)],
    dpa.SingleEpochTreeAggregationDpEvent: [dpa.SingleEpochTreeAggregationDpEvent(2.0, 4)],
    _D.TruncatedSubsampledGaussianDpEvent: [_D.TruncatedSubsampledGaussianDpEvent(1000, 0.01, 20, 1.0)],
    dpa.PoissonSampledDpEvent: [dpa.PoissonSampledDpEvent(0.2, G(1.5)),
                                dpa.PoissonSampledDpEvent(0.2, acc.PureDp(1.0))],
    dpa.SampledWithReplacementDpEvent: [dpa.SampledWithReplacementDpEvent(100, 10, G(2.0))],
    dpa.SampledWithoutReplacementDpEvent: [dpa.SampledWithoutReplacementDpEvent(100, 10, G(2.0))],
    _D.RepeatAndSelectDpEvent: [_D.RepeatAndSelectDpEvent(G(2.0), 3.0, math.inf)],
    dpa.SelfComposedDpEvent: [dpa.SelfComposedDpEvent(G(2.0), 3), acc.dpsgd_event(0.01, 1.0, 10)],
    dpa.ComposedDpEvent: [LISTED, dpa.ComposedDpEvent((G(2.0), dpa.LaplaceDpEvent(1.0))),
                          dpa.ComposedDpEvent([])],
    acc.PureDp: [acc.PureDp(0.5)],
    acc.Zcdp: [acc.Zcdp(0.05)],
    acc.RdpCurve: [acc.RdpCurve([2.0, 8.0, 32.0], [0.1, 0.3, 0.9])],
    acc.ApproxDp: [acc.ApproxDp(0.5, 1e-6), acc.ApproxDp(0.3, 0.0)],
    acc.ReportNoisyMax: [acc.ReportNoisyMax(3.0, 4)],
    acc.RepeatAndSelect: [acc.RepeatAndSelect(G(2.0), acc.Poisson(3)),
                          acc.RepeatAndSelect(LISTED, acc.Geometric(mean=3))],
    acc.RandomStopping: [acc.RandomStopping(acc.PureDp(0.5), 0.4), acc.RandomStopping(G(2.0), 0.4, 4)],
    acc.ThresholdSelect: [acc.ThresholdSelect(acc.PureDp(0.5), 0.4, 4)],
    acc.UniformCandidates: [acc.UniformCandidates([G(2.0), LISTED])],
    acc.SelectionWithCount: [acc.SelectionWithCount(acc.RepeatAndSelect(G(2.0), acc.Poisson(3)))],
    acc.SubsampledTuning: [acc.SubsampledTuning(acc.RepeatAndSelect(G(2.0), acc.Poisson(3)), G(2.0), 0.2)],
}
TYPES = sorted(EXAMPLES, key=lambda cls: (cls.__module__, cls.__name__))


def _defined_event_types() -> set:
  """Every DpEvent subclass that dp-accounting's `dp_event` or a jaxdp.accounting module defines."""
  for info in pkgutil.iter_modules(jaxdp.accounting.__path__):
    importlib.import_module(f"jaxdp.accounting.{info.name}")
  found, todo = set(), [dpa.DpEvent]
  while todo:
    for sub in todo.pop().__subclasses__():
      todo.append(sub)
      # attrs' slotted classes replace the class they decorate; the replaced one
      # lingers in __subclasses__ until collected, so only a module's own name counts.
      module = sys.modules.get(sub.__module__)
      if (sub.__module__ == _D.__name__ or sub.__module__.startswith("jaxdp.accounting.")) and (
          getattr(module, sub.__name__, None) is sub):
        found.add(sub)
  return found


def _nested(event):
  """`event` alone, composed, self-composed, and wrapped in both with no-ops."""
  yield event
  yield dpa.ComposedDpEvent([event, G(3.0)])
  yield dpa.SelfComposedDpEvent(event, 2)
  yield dpa.ComposedDpEvent([dpa.NoOpDpEvent(), dpa.SelfComposedDpEvent(dpa.ComposedDpEvent([event]), 1)])


def _nested_events_in_fields(event) -> list:
  """The DpEvents an event holds in its fields, read without the event layer."""
  out = []
  for a in attr.fields(type(event)):
    value = getattr(event, a.name)
    for item in value if isinstance(value, (list, tuple)) else (value,):
      if isinstance(item, dpa.DpEvent):
        out.append(item)
  return out


def test_every_event_type_is_registered_and_has_an_example_here():
  defined = _defined_event_types()
  assert defined - set(ev.KINDS) == set(), "event types missing from events.KINDS"
  assert set(ev.KINDS) - set(EXAMPLES) == set(), "event types without an example in EXAMPLES"
  assert set(ev.JAXDP_EVENTS) == {cls for cls in defined if cls.__module__.startswith("jaxdp.")}
  for cls, examples in EXAMPLES.items():
    assert examples and all(type(e) is cls for e in examples), cls


@pytest.mark.parametrize("cls", TYPES, ids=lambda cls: cls.__name__)
def test_children_are_exactly_the_nested_events(cls):
  for event in EXAMPLES[cls]:
    assert list(ev.children(event)) == _nested_events_in_fields(event)
    composed = dpa.ComposedDpEvent([event, G(3.0)])
    assert ev.children(composed) == (event, G(3.0))
    assert ev.contains(composed, cls) and ev.contains(dpa.SelfComposedDpEvent(composed, 2), cls)
    # dp-accounting's events alone, at every depth.
    descendants, todo = [], [event]
    while todo:
      descendants.append(todo.pop())
      todo.extend(ev.children(descendants[-1]))
    assert ev.is_dp_accounting_only(event) == (not any(isinstance(e, ev.JAXDP_EVENTS) for e in descendants))


@pytest.mark.parametrize("cls", TYPES, ids=lambda cls: cls.__name__)
def test_every_event_is_described_on_one_readable_line(cls):
  for event in EXAMPLES[cls]:
    text = acc.describe(event)
    for nested in _nested(event):
      line = acc.describe(nested)
      assert isinstance(line, str) and line and "\n" not in line and " object at 0x" not in line, line
    # A composition names each part by its own description.
    assert acc.describe(dpa.ComposedDpEvent([event, G(3.0)])) == (
        f"[{text}] + Gaussian(sigma=3)" if cls is dpa.ComposedDpEvent else f"{text} + Gaussian(sigma=3)")


def test_keys_are_equal_exactly_for_equal_events():
  events = [nested for examples in EXAMPLES.values() for event in examples for nested in _nested(event)]
  keys = [_dpa.event_key(e) for e in events]
  for event, key in zip(events, keys):
    assert key is not None, event
    twin = copy.deepcopy(event)  # equal, and no object shared with `event`
    assert _dpa.event_key(twin) == key and hash(_dpa.event_key(twin)) == hash(key), event
  for i, (a, key_a) in enumerate(zip(events, keys)):
    for b, key_b in zip(events[i + 1:], keys[i + 1:]):
      assert (key_a == key_b) == (a == b), (a, b)


@pytest.mark.parametrize("method", acc.ALL_METHODS)
def test_every_method_supports_each_event_or_says_why_not(method):
  for cls in TYPES:
    for event in EXAMPLES[cls]:
      verdicts = []
      for nested in _nested(event):
        acct = acc.make_accountant(method)
        err = acct.unsupported(nested)
        assert acct.supports(nested) is (err is None), (method, nested)
        if err is not None:
          assert isinstance(err.error_message, str) and err.error_message, (method, nested)
          assert isinstance(acc.describe(err.invalid_event), str)
        verdicts.append(err is None)
      alone, composed, _, wrapped = verdicts
      # A composition is accounted only if every part is; no-ops and one-fold nesting change nothing.
      assert wrapped == alone and (alone or not composed), (method, event, verdicts)
