"""`acc.epsilon` / `acc.delta` refuse what they cannot account honestly."""

import dp_accounting as dpa
import numpy as np
import pytest

from jaxdp import accounting as acc


@pytest.mark.parametrize("event", [
    dpa.GaussianDpEvent(float("nan")),
    dpa.ComposedDpEvent(np.array([dpa.GaussianDpEvent(float("nan")), dpa.GaussianDpEvent(1.0)], dtype=object)),
    dpa.ComposedDpEvent(__import__("collections").deque([dpa.GaussianDpEvent(float("nan"))])),
    dpa.GaussianDpEvent(__import__("jax").numpy.sqrt(__import__("jax").numpy.float32(-2.0))),
    dpa.ComposedDpEvent([dpa.GaussianDpEvent(1.0), dpa.GaussianDpEvent(float("nan"))]),
    dpa.PoissonSampledDpEvent(float("nan"), dpa.GaussianDpEvent(1.0)),
    acc.RepeatAndSelect(acc.UniformCandidates([dpa.GaussianDpEvent(1.0), dpa.GaussianDpEvent(np.float32("nan"))]),
                        acc.Poisson(mean=3)),
])
@pytest.mark.parametrize("method", ["best", "rdp"])
def test_an_event_with_a_nan_parameter_is_refused_not_accounted_to_nothing(event, method):
  """dp-accounting accounts GaussianDpEvent(nan) to epsilon about 4e-9: refused, naming where."""
  with pytest.raises(ValueError, match=r"is NaN in"):
    acc.epsilon(event, 1e-5, method)
  with pytest.raises(ValueError, match=r"is NaN in"):
    acc.delta(event, 1.0, method)


@pytest.mark.parametrize("method", ["best", "rdp", "pld"])
def test_an_iterator_of_events_is_refused_not_composed_to_nothing(method):
  """The first accountant to check a `map` consumes it; the next then composed nothing (epsilon 0)."""
  for events in (map(dpa.GaussianDpEvent, [1.0, 1.0]), (dpa.GaussianDpEvent(x) for x in [1.0])):
    with pytest.raises(ValueError, match="give a list or tuple"):
      acc.epsilon(acc.RepeatAndSelect(dpa.ComposedDpEvent(events), acc.Poisson(mean=5)), 1e-5, method)
  with pytest.raises(ValueError, match="is NaN"):
    acc.make_accountant(method).compose(dpa.GaussianDpEvent(float("nan")))
