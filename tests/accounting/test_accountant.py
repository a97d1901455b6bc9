"""Public accounting API: epsilon/delta/report, bases, orders, event conversion."""

import json
import math

import dp_accounting as dpa
import numpy as np
import pytest

from jaxdp import accounting as acc

DPSGD = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(256 / 60000, dpa.GaussianDpEvent(1.1)), 14063)


@pytest.mark.parametrize("dist", [acc.Poisson(mean=10), acc.Geometric(mean=10), acc.Binomial(20, 0.5),
                                  acc.Fixed(3)], ids=repr)
def test_best_is_the_minimum_over_methods_and_report_agrees(dist):
  ev = acc.RepeatAndSelect(dpa.GaussianDpEvent(4.0), dist)
  per_method = {}
  for m in acc.METHODS:
    try:
      per_method[m] = acc.epsilon(ev, 1e-5, method=m)
    except acc.NotApplicableError:
      per_method[m] = None
  assert per_method["rdp"] is not None and per_method["composition"] is not None
  in_best = [e for m, e in per_method.items() if e is not None and m != "profile-refined"]
  best = acc.epsilon(ev, 1e-5, method="best")
  assert best == min(in_best)
  # "profile-refined" joins "best" only on request.
  refined = [e for e in per_method.values() if e is not None]
  assert acc.epsilon(ev, 1e-5, method="best", allow_refined=True) == min(refined)
  rep = acc.report(ev, 1e-5)
  assert {r.method: r.epsilon for r in rep.results} == per_method
  assert rep.best_epsilon == best and per_method[rep.best_method] == best
  assert rep.best_method in str(rep) and "tightest" in str(rep)
  assert json.loads(rep.to_json())["best"]["epsilon"] == pytest.approx(best)


@pytest.mark.parametrize("method", ["rdp", "composition", "best"])
def test_delta_and_epsilon_are_consistent_inverses(method):
  ev = acc.RepeatAndSelect(DPSGD, acc.Logarithmic(mean=10))
  for target in (1e-3, 1e-5, 1e-9):
    eps = acc.epsilon(ev, target, method=method)
    assert acc.delta(ev, eps, method=method) <= target * (1 + 1e-9)
    assert acc.delta(ev, eps * 0.98, method=method) > target
  assert acc.delta(ev, 0.0, method=method) <= 1.0


def test_epsilon_decreases_with_delta_and_increases_with_mean():
  eps = [acc.epsilon(acc.RepeatAndSelect(DPSGD, acc.Poisson(mean=m)), 1e-5, "rdp") for m in (1, 3, 10, 30)]
  assert np.all(np.diff(eps) > 0)
  ev = acc.RepeatAndSelect(DPSGD, acc.Poisson(mean=10))
  assert acc.epsilon(ev, 1e-3) < acc.epsilon(ev, 1e-6)


def test_single_run_epsilon_matches_dp_accounting():
  accountant = dpa.rdp.RdpAccountant()
  accountant.compose(DPSGD)
  assert acc.epsilon(DPSGD, 1e-5, "rdp") == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-12)


def test_orders_override_changes_the_grid():
  ev = acc.RepeatAndSelect(DPSGD, acc.Poisson(mean=10))
  coarse = acc.epsilon(ev, 1e-5, "rdp", orders=[2, 4, 8, 16, 32])
  assert coarse > acc.epsilon(ev, 1e-5, "rdp")
  np.testing.assert_array_equal(acc.make_accountant("rdp", orders=[8, 2, 4, 4]).compose(ev).orders, [2, 4, 8])


def test_zcdp_and_pure_bases_match_their_dp_accounting_counterparts():
  for ours, theirs in ((acc.Zcdp(0.3), dpa.ZCDpEvent(0.3)),):
    for dist in (acc.Poisson(mean=5), acc.Binomial(4, 0.5)):
      a = acc.epsilon(acc.RepeatAndSelect(ours, dist), 1e-6, "rdp")
      b = acc.epsilon(acc.RepeatAndSelect(theirs, dist), 1e-6, "rdp")
      assert a == pytest.approx(b, rel=1e-9)
  # Pure eps-DP: RDP of randomized response, below both eps and the zCDP bound l eps^2 / 2.
  lam = np.array([1.5, 2.0, 10.0, 100.0])
  rr = acc.PureDp(1.0).rdp(lam)
  assert np.all(rr <= 1.0) and np.all(rr <= lam / 2 + 1e-12)
  # 1.0-DP: delta is 0 from eps = 1 on; below, the exact randomized-response profile
  # (e - e^eps) / (1 + e) is inverted: eps(delta) = log(e - delta (1 + e)).
  assert acc.delta(acc.PureDp(1.0), 1.0) == 0.0
  assert acc.epsilon(acc.PureDp(1.0), 1e-9) == pytest.approx(math.log(math.e - 1e-9 * (1 + math.e)), abs=1e-12)


def test_rdp_curve_base_is_conservative_between_orders():
  curve = acc.RdpCurve([2, 8, 32], [0.1, 0.5, 3.0])
  np.testing.assert_array_equal(curve.rdp(np.array([1.5, 2, 3, 8, 20, 32, 33])),
                                [0.1, 0.1, 0.5, 0.5, 3.0, 3.0, np.inf])
  # A curve built from an event's own RDP reproduces that event's epsilon on the same grid.
  g = acc.make_accountant("rdp").compose(DPSGD)
  assert acc.epsilon(acc.RdpCurve(g.orders, g.rdp), 1e-5, "rdp") == pytest.approx(
      acc.epsilon(DPSGD, 1e-5, "rdp"), rel=1e-12)
  # RdpCurve enforces monotonicity in the order (a larger order's bound holds for smaller ones).
  assert acc.RdpCurve([2, 3], [1.0, 0.5]).values == (0.5, 0.5)


def test_nested_repeat_and_select_and_to_dp_event():
  inner = acc.RepeatAndSelect(dpa.GaussianDpEvent(4.0), acc.Geometric(mean=5))
  outer = acc.RepeatAndSelect(inner, acc.Poisson(mean=3))
  accountant = dpa.rdp.RdpAccountant()
  accountant.compose(outer.to_dp_event())
  assert acc.epsilon(outer, 1e-5, "rdp") == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-9)
  assert acc.epsilon(outer, 1e-5) > acc.epsilon(inner, 1e-5)
  with pytest.raises(ValueError, match="cannot express"):
    acc.RepeatAndSelect(dpa.GaussianDpEvent(1.0), acc.Binomial(3, 0.5)).to_dp_event()
  with pytest.raises(ValueError, match="no dp-accounting"):
    acc.RepeatAndSelect(acc.PureDp(1.0), acc.Poisson(3)).to_dp_event()


def test_zero_privacy_loss_base_stays_private():
  ev = acc.RepeatAndSelect(acc.Zcdp(0.0), acc.Logarithmic(mean=50))
  assert acc.epsilon(ev, 1e-5, "rdp") == 0.0
  assert acc.epsilon(acc.RepeatAndSelect(dpa.NoOpDpEvent(), acc.Poisson(mean=4)), 1e-5, "composition") == 0.0


def test_non_private_base_gives_infinite_epsilon():
  ev = acc.RepeatAndSelect(dpa.NonPrivateDpEvent(), acc.Poisson(mean=4))
  assert math.isinf(acc.epsilon(ev, 1e-5))


def test_unhashable_composed_events_are_accounted_by_every_method():
  # dp-accounting's ComposedDpEvent accepts a list, which makes it unhashable.
  listed = dpa.ComposedDpEvent([dpa.GaussianDpEvent(4.0), dpa.LaplaceDpEvent(3.0)])
  tupled = dpa.ComposedDpEvent((dpa.GaussianDpEvent(4.0), dpa.LaplaceDpEvent(3.0)))
  for method in ("rdp", "composition", "profile", "best"):
    a = acc.epsilon(acc.RepeatAndSelect(listed, acc.Poisson(mean=3)), 1e-5, method)
    b = acc.epsilon(acc.RepeatAndSelect(tupled, acc.Poisson(mean=3)), 1e-5, method)
    assert a == b
