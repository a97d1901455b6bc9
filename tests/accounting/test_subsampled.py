"""Koskela-Kulkarni subsampled tuning: Thm 1, Zhu-Wang, limits, pinned values."""

import math

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

from jaxdp import accounting as acc
from jaxdp.accounting import rdp_selection as rs
from jaxdp.accounting import subsampled as ss

ORDERS = np.arange(2, 129, dtype=np.float64)
KK_BASE = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(2.0)), 5000)


def _curve_fn(values):
  return lambda o: values[(np.asarray(o) - 2).astype(int)]


@pytest.fixture(scope="module")
def kk_curves():
  base = acc.make_accountant("rdp", orders=ORDERS).compose(KK_BASE).rdp
  raw = {}
  for mu in (15, 45):
    # Thm 6 without the monotone repair: the convention of REFERENCE Sec. 9.7.
    raw[mu] = base + mu * rs._delta_hat(ORDERS, base, None) + math.log(mu) / (ORDERS - 1)  # pylint: disable=protected-access
  return base, raw


# REFERENCE.md Sec. 9.7 (gamma=0.01, sigma=2, T=5000, delta=1e-5, orders 2..128).
@pytest.mark.parametrize("mu,q,v1,v2", [
    (15, 0.05, 1.9002, 2.2956), (15, 0.1, 2.4550, 2.9139), (15, 0.5, 3.9753, 4.6351),
    (45, 0.01, 4.6953, 3.9661), (45, 0.1, 6.9883, 6.9460), (45, 0.2, 7.6809, 7.8688),
])
def test_reference_values_9_7(kk_curves, mu, q, v1, v2):
  base, raw = kk_curves
  t, b = _curve_fn(raw[mu]), _curve_fn(base)
  assert compute_epsilon(ORDERS, ss.variant1(t, b, q, ORDERS), 1e-5)[0] == pytest.approx(v1, abs=1e-4)
  assert compute_epsilon(ORDERS, ss.variant2(t, b, q, ORDERS), 1e-5)[0] == pytest.approx(v2, abs=1e-4)


@pytest.mark.parametrize("variant", [1, 2])
def test_limits_in_q(kk_curves, variant):
  base, raw = kk_curves
  t, b = _curve_fn(raw[15]), _curve_fn(base)
  fn = ss.variant1 if variant == 1 else ss.variant2
  # Remark 2: q -> 0 gives the final run alone (variant 2: plus a vanishing tuning term).
  np.testing.assert_allclose(fn(t, b, 1e-9, ORDERS[:10]), base[:10], rtol=1e-5, atol=1e-7)
  if variant == 1:  # q -> 1: the tuning alone (the final run sees no data)
    np.testing.assert_allclose(ss.variant1(t, b, 1 - 1e-12, ORDERS[:20]), raw[15][:20], rtol=1e-6)


@pytest.mark.parametrize("variant", [1, 2])
def test_monotone_in_q(kk_curves, variant):
  base, raw = kk_curves
  t, b = _curve_fn(raw[15]), _curve_fn(base)
  fn = ss.variant1 if variant == 1 else ss.variant2
  eps = [compute_epsilon(ORDERS, fn(t, b, q, ORDERS), 1e-5)[0] for q in (0.01, 0.05, 0.1, 0.3, 0.6)]
  assert np.all(np.diff(eps) > 0)


@pytest.mark.parametrize("sigma,q", [(1.0, 0.01), (2.0, 0.1), (4.0, 0.3), (0.8, 0.05)])
def test_zhu_wang_upper_bounds_exact_subsampled_gaussian(sigma, q):
  orders = np.arange(2, 64, dtype=np.float64)
  zw = ss.zhu_wang(lambda o: o / (2 * sigma**2), q, orders)
  exact = acc.make_accountant("rdp", orders=orders).compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma))).rdp
  assert np.all(zw >= exact * (1 - 1e-12))
  # ... and is close to it at small orders (the factor 3 only touches j >= 3 terms).
  assert zw[0] == pytest.approx(exact[0], rel=1e-9)
  delta = 1e-5
  assert compute_epsilon(orders, zw, delta)[0] < 1.6 * compute_epsilon(orders, exact, delta)[0]


def test_parallel_composition_is_pointwise_max():
  np.testing.assert_array_equal(ss.parallel_composition([np.array([1.0, 3.0]), np.array([2.0, 2.5])]),
                                [2.0, 3.0])


@pytest.mark.parametrize("orders,match", [
    ([2.5, 3], "integers"), ([1.5], "orders"), ([], "non-empty")])
def test_integer_orders_validation(orders, match):
  with pytest.raises(ValueError, match=match):
    ss.check_integer_orders(orders)


@pytest.fixture(scope="module")
def kk_events():
  tune = acc.RepeatAndSelect(KK_BASE, acc.Poisson(mean=15))
  return tune, {v: acc.SubsampledTuning(tune=tune, final=KK_BASE, q=0.1, variant=v) for v in (1, 2)}


def test_subsampled_tuning_through_the_public_api(kk_events):
  tune, events = kk_events
  # Default integer grid 2..128; the monotone Thm 6 curve can only lower the Sec. 9.7 values.
  eps1 = acc.epsilon(events[1], 1e-5, "rdp")
  eps2 = acc.epsilon(events[2], 1e-5, "rdp")
  assert eps1 == pytest.approx(2.4550, abs=2e-3) and eps1 <= 2.4550 + 1e-4
  assert eps2 == pytest.approx(2.9139, abs=2e-3) and eps2 <= 2.9139 + 1e-4
  baseline = acc.epsilon(tune, 1e-5, "rdp", orders=ORDERS)
  assert baseline == pytest.approx(4.6571, abs=1e-4)
  assert eps1 < eps2 < baseline
  rep = acc.report(events[1], 1e-5)
  methods = {r.method: r.epsilon for r in rep.results}
  assert methods["profile"] is None and methods["rdp"] == pytest.approx(eps1)
  assert rep.best_epsilon == acc.epsilon(events[1], 1e-5) == min(e for e in methods.values() if e)
  # Composition of everything is valid for both variants but far looser.
  assert methods["composition"] > baseline


def test_subsampled_tuning_orders_must_be_integers(kk_events):
  _, events = kk_events
  with pytest.raises(ValueError, match="integers"):
    acc.epsilon(events[1], 1e-5, orders=[2.5, 3.0])
  small = acc.epsilon(events[1], 1e-5, "rdp", orders=range(2, 33))
  assert small >= acc.epsilon(events[1], 1e-5, "rdp") - 1e-12


@pytest.mark.parametrize("kwargs,match", [
    (dict(q=0.0), r"q must be in \(0.0, 1.0\)"), (dict(q=1.0), "q must be in"),
    (dict(q=0.1, variant=3), "variant must be 1 or 2"),
    (dict(q=0.1, final="final"), "base must be"),
    (dict(q=0.1, tune=KK_BASE), "tune must be a RepeatAndSelect"),
])
def test_subsampled_tuning_rejects_bad_input(kwargs, match):
  args = dict(tune=acc.RepeatAndSelect(KK_BASE, acc.Poisson(mean=15)), final=KK_BASE, q=0.1, variant=1)
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    acc.SubsampledTuning(**args)


def test_uniform_candidates_take_the_worst_candidate():
  weak = dpa.GaussianDpEvent(2.0)
  strong = dpa.GaussianDpEvent(8.0)
  both = acc.UniformCandidates([weak, strong])
  g = acc.make_accountant("rdp").compose(both).rdp
  np.testing.assert_allclose(g, np.maximum(acc.make_accountant("rdp").compose(weak).rdp, acc.make_accountant("rdp").compose(strong).rdp))
  for method in ("rdp", "profile", "best"):
    tuned = acc.epsilon(acc.RepeatAndSelect(both, acc.Geometric(mean=10)), 1e-5, method)
    assert tuned == pytest.approx(acc.epsilon(acc.RepeatAndSelect(weak, acc.Geometric(mean=10)), 1e-5, method),
                                  rel=1e-9)
  with pytest.raises(ValueError, match="non-empty"):
    acc.UniformCandidates([])
  with pytest.raises(ValueError, match="base must be"):
    acc.UniformCandidates([weak, "strong"])
