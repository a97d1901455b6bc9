"""Liu-Talwar events and their accounting."""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np
import pytest

from jaxdp import accounting as acc


@pytest.mark.parametrize("gamma,t,want", [
    (0.1, None, 1.0),                        # Thm 3.1(b), T = inf: 2 eps1
    (0.1, 100, 1.0 + 2 * math.exp(-10.0)),   # 2 eps1 + 2 e^{-gamma T}
    (0.1, 2, 1.0),                           # T < 1 + 1/(e gamma): composition, T eps1
    (0.5, 1, 0.5),
], ids=["inf", "T100", "T2", "T1"])
def test_threshold_select(gamma, t, want):
  ev = acc.ThresholdSelect(acc.PureDp(0.5), gamma, t)
  # A want-DP guarantee read at delta = 1e-6 through its exact randomized-response profile.
  assert acc.delta(ev, want, "liu-talwar") == 0.0
  assert acc.epsilon(ev, 1e-6) == pytest.approx(_pure_at(want, 1e-6), rel=1e-12)
  rep = acc.report(ev, 1e-6)
  assert rep.best_epsilon == pytest.approx(_pure_at(want, 1e-6), rel=1e-12)
  # Composition over the (at most T) calls ties Liu-Talwar only when T eps1 is the bound.
  assert rep.best_method == "liu-talwar" or {r.method: r.epsilon for r in rep.results}["composition"] == rep.best_epsilon


def _pure_at(eps0, delta):
  """eps at `delta` of an eps0-DP guarantee: the inverse of (e^eps0 - e^eps) / (1 + e^eps0)."""
  return math.log(math.exp(eps0) - delta * (1.0 + math.exp(eps0)))


def test_threshold_select_needs_pure_base():
  ev = acc.ThresholdSelect(dpa.GaussianDpEvent(2.0), 0.1)
  with pytest.raises(acc.NotApplicableError, match="pure-DP"):
    acc.epsilon(ev, 1e-6, method="liu-talwar")
  # Only composition over the geometric number of calls covers an (eps, delta) base.
  assert acc.epsilon(ev, 1e-6) == acc.epsilon(ev, 1e-6, method="composition")
  assert acc.epsilon(ev, 1e-6) == pytest.approx(acc.epsilon(
      acc.RepeatAndSelect(dpa.GaussianDpEvent(2.0), acc.Geometric(gamma=0.1)), 1e-6, "composition"))
  # A Laplace event is pure: 1/b-DP.
  assert acc.epsilon(acc.ThresholdSelect(dpa.LaplaceDpEvent(2.0), 0.1), 1e-6) == pytest.approx(_pure_at(1.0, 1e-6))


def test_random_stopping_is_geometric_repeat_and_select():
  ev = acc.RandomStopping(acc.PureDp(1.0), 0.1)
  # Accounted exactly as repeat-and-select with K ~ Geometric(gamma=0.1) (mean 10) by every other method.
  same = acc.RepeatAndSelect(acc.PureDp(1.0), acc.Geometric(gamma=0.1))
  assert same.distribution.mean == pytest.approx(10.0)
  for method in ("rdp", "composition", "profile"):
    assert acc.epsilon(ev, 1e-9, method) == acc.epsilon(same, 1e-9, method)
  # Thm 3.2 says 3 eps; the pure limit of Lemma 7 is sharper for gamma = 0.1:
  # max over the constraints' corner u' = e^eps/(1+e^eps): eps + 2 log(...) = 2.5919.
  assert acc.epsilon(ev, 1e-9, method="liu-talwar") == pytest.approx(2.5919, abs=2e-3)
  assert acc.epsilon(ev, 1e-9, method="liu-talwar") <= 3.0


def test_hard_stop_is_no_worse_than_uncapped():
  uncapped = acc.epsilon(acc.RandomStopping(acc.PureDp(1.0), 0.1), 1e-9, method="liu-talwar")
  for t in (1, 3, 30, 300):
    capped = acc.epsilon(acc.RandomStopping(acc.PureDp(1.0), 0.1, t), 1e-9, method="liu-talwar")
    assert capped <= uncapped + 1e-3
  assert acc.epsilon(acc.RandomStopping(acc.PureDp(1.0), 0.1, 1), 1e-9, method="liu-talwar") == pytest.approx(1.0, abs=1e-3)


def test_capped_geometric_distribution():
  d = acc.CappedGeometric(0.2, 6)
  ks = np.arange(0, 8)
  pmf = d.pmf(ks)
  assert pmf.sum() == pytest.approx(1.0)
  assert d.mean == pytest.approx(float((ks * pmf).sum()))
  x = np.array([0.0, 0.3, 0.9, 1.0])
  assert np.allclose(d.pgf(x), [(pmf * xx ** ks).sum() for xx in x])
  assert np.allclose(d.pgf_derivative(x), [(ks[1:] * pmf[1:] * xx ** (ks[1:] - 1)).sum() for xx in x])
  big = acc.CappedGeometric(0.01, 10000)  # closed-form derivative branch
  assert float(big.pgf_derivative(1.0)) == pytest.approx(big.mean, rel=1e-9)
  draws = d.sample(np.random.default_rng(0), size=20000)
  assert draws.max() == 6 and draws.mean() == pytest.approx(d.mean, rel=0.03)


@pytest.mark.parametrize("kwargs,match", [
    (dict(stop_prob=0.0), "stop_prob"), (dict(stop_prob=1.5), "stop_prob"),
    (dict(stop_prob=0.1, max_iterations=0), "max_iterations"),
    (dict(stop_prob=0.1, max_iterations=2.5), "max_iterations"),
], ids=["zero", "big", "T0", "Tfrac"])
def test_validation(kwargs, match):
  with pytest.raises(ValueError, match=match):
    acc.ThresholdSelect(acc.PureDp(1.0), **kwargs)
  with pytest.raises(ValueError, match=match):
    acc.RandomStopping(acc.PureDp(1.0), **kwargs)


def test_bad_base_is_rejected():
  with pytest.raises(ValueError, match="base"):
    acc.ThresholdSelect("not a base", 0.1)


def _pure_epsilon(event):
  acct = acc.LiuTalwarAccountant()
  return acct.compose(event).pure_epsilon if acct.supports(event) else None


def test_pure_epsilon_of_composed_and_nested_parts():
  assert _pure_epsilon(dpa.SelfComposedDpEvent(dpa.LaplaceDpEvent(2.0), 3)) == pytest.approx(1.5)
  assert _pure_epsilon(dpa.GaussianDpEvent(1.0)) is None
  nested = acc.RepeatAndSelect(acc.PureDp(0.5), acc.Geometric(mean=5))
  assert _pure_epsilon(nested) <= 1.5 + 1e-12
