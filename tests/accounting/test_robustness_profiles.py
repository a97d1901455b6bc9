"""Profiles at the edges: tiny deltas never hang, inverses are inverses, PLD floor."""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np
import pytest

from jaxdp.accounting import _dpa
from jaxdp.accounting import _dpa_pld
from jaxdp.accounting import distributions
from jaxdp.accounting import profiles

TINY_DELTAS = [1e-300, 5e-321, 1e-323, 5e-324, 0.0]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("delta", TINY_DELTAS, ids=[repr(d) for d in TINY_DELTAS])
@pytest.mark.parametrize("mu", [0.05, 1.0, 30.0])
def test_gaussian_epsilon_of_tiny_delta_returns_a_valid_large_value(mu, delta):
  prof = profiles.GaussianProfile(mu)
  eps = prof.epsilon(delta)
  if delta == 0.0:
    assert eps == math.inf  # the Gaussian profile is positive everywhere
    return
  assert math.isfinite(eps)
  assert prof.delta(eps) <= delta
  # Chernoff: delta(eps) <= exp(-(eps - mu^2/2)^2 / (2 mu^2)), so the answer is at
  # most the Chernoff epsilon; and it is large: delta(eps) >= tiny needs eps >~ mu sqrt(2 log(1/delta)).
  chernoff = mu * mu / 2 + mu * math.sqrt(2 * -math.log(delta))
  assert eps <= chernoff + 1e-9
  assert eps >= 0.5 * chernoff - mu


@pytest.mark.timeout(10)
@pytest.mark.parametrize("delta", TINY_DELTAS, ids=[repr(d) for d in TINY_DELTAS])
def test_every_profile_answers_tiny_deltas_quickly(delta):
  orders = np.array(_dpa.DEFAULT_ORDERS)
  for prof in (profiles.PureDpProfile(1.0), profiles.ApproxDpProfile(1.0, 1e-8),
               profiles.RdpProfile(orders, 0.05 * orders),
               profiles.ScaledShiftedProfile(profiles.GaussianProfile(0.5), 10.0, 0.3)):
    eps = prof.epsilon(delta)
    assert eps >= 0.0
    if math.isfinite(eps):
      assert prof.delta(eps) <= delta


def _profiles():
  orders = np.array(_dpa.DEFAULT_ORDERS)
  gauss = profiles.GaussianProfile(0.5)
  return {
      "gauss": gauss,
      "pure": profiles.PureDpProfile(1.0),
      "approx": profiles.ApproxDpProfile(0.5, 1e-6),
      "rdp": profiles.RdpProfile(orders, 0.05 * orders),
      "scaled": profiles.ScaledShiftedProfile(gauss, 30.0, 0.7),
      "scaled-neg": profiles.ScaledShiftedProfile(profiles.PureDpProfile(1.0), 1.0, 0.25),
      "max": profiles.MaxProfile([gauss, profiles.PureDpProfile(1.0)]),
      "min": profiles.tighter_of(gauss, profiles.RdpProfile(orders, orders / 8.0)),
  }


PROFILES = _profiles()
DELTA_GRID = [0.5, 0.2, 1e-2, 1e-4, 1e-6, 1e-9, 1e-12]
EPS_GRID = [0.0, 0.05, 0.3, 0.9, 1.7, 3.0]
#: epsilon is the smallest valid value up to this (relative) bracket width.
TOL = 2 * profiles.EPSILON_RTOL


@pytest.mark.timeout(20)
@pytest.mark.parametrize("name", list(PROFILES), ids=list(PROFILES))
def test_epsilon_inverts_delta_and_is_smallest(name):
  prof = PROFILES[name]
  for d in DELTA_GRID:
    eps = prof.epsilon(d)
    if not math.isfinite(eps):
      continue
    assert prof.delta(eps) <= d, (d, eps)
    if eps > 0:  # smallest: just below it the curve is above d
      assert prof.delta(eps - TOL * max(1.0, eps)) > d, (d, eps)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("name", list(PROFILES), ids=list(PROFILES))
def test_epsilon_of_delta_of_eps_is_at_most_eps(name):
  prof = PROFILES[name]
  for e in EPS_GRID:
    d = prof.delta(e)
    if d >= 1.0:
      continue
    assert prof.epsilon(d) <= e + TOL * max(1.0, e), (e, d)


def test_pure_dp_inverse_follows_the_curve():
  prof = profiles.PureDpProfile(1.0)
  for d in (1e-9, 1e-3, 0.1, 0.2):
    # (e^1 - e^eps) / (1 + e^1) = d.
    want = math.log(math.e - d * (1 + math.e))
    assert prof.epsilon(d) == pytest.approx(want, rel=1e-11)
  assert prof.epsilon(0.0) == 1.0


def test_scaled_shifted_goes_below_its_shift():
  # min(1, RR_1(eps - 0.25)): at eps = 0.25 it is RR_1(0) = 0.462 and at eps = 0
  # it is 1 - e^-0.25 (1 - RR_1(0.25)) = 0.522, so for delta = 0.5 the answer
  # lies in (0, 0.25), below the shift.
  prof = profiles.ScaledShiftedProfile(profiles.PureDpProfile(1.0), 1.0, 0.25)
  eps = prof.epsilon(0.5)
  assert 0.0 < eps < 0.25
  assert prof.delta(eps) <= 0.5 < prof.delta(eps - 1e-9)


def test_scaled_approx_dp_is_finite_when_delta_over_scale_rounds_below_delta0():
  # scale * 1e-6 == delta exactly, but delta / scale rounds just below 1e-6, so
  # inner.epsilon(delta / scale) + shift would be inf; the product decides.
  scale = 3.83554
  delta = scale * 1e-6
  assert delta / scale < 1e-6 and scale * 1e-6 <= delta
  prof = profiles.ScaledShiftedProfile(profiles.ApproxDpProfile(0.5, 1e-6), scale, 1.3)
  eps = prof.epsilon(delta)
  assert eps == pytest.approx(1.8, abs=1e-9)
  assert prof.delta(eps) <= delta
  assert prof.delta(eps - 1e-6) > delta  # never optimistic


def test_approx_dp_selected_with_geometric_is_finite():
  # ApproxDp(0.5, 1e-6), K ~ Geometric(mean=10) at delta = 1e-5 (KRW Cor 6.2 shape).
  dist = distributions.Geometric(mean=10)
  m = max(dist.mean, float(dist.pgf_derivative(1.0)))
  assert m == 10.0
  prof = profiles.ScaledShiftedProfile(profiles.ApproxDpProfile(0.5, 1e-6), m, 1.3)
  eps = prof.epsilon(1e-5)
  assert math.isfinite(eps) and prof.delta(eps) <= 1e-5


@pytest.fixture(scope="module")
def q01():
  ev = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.0)), 1000)
  rdp = _dpa.dp_event_rdp(ev, _dpa.DEFAULT_ORDERS)
  rdp_prof = profiles.RdpProfile(np.array(_dpa.DEFAULT_ORDERS), rdp)
  return profiles.PldProfile(ev), profiles.PldProfile(ev, rdp_fallback=rdp_prof), rdp_prof


def test_pld_never_uses_values_below_the_floor(q01):
  pld, with_rdp, rdp_prof = q01
  floor = _dpa_pld.PLD_DELTA_FLOOR
  eps = np.linspace(0.0, 12.0, 61)
  raw = pld.raw_pld_delta(eps)
  assert np.all(pld.delta(eps) >= floor)
  assert np.all(pld.delta(eps) >= raw)
  assert pld.epsilon(floor / 10) == math.inf
  # With the RDP fallback: the pointwise min of the two valid bounds.
  np.testing.assert_array_equal(with_rdp.delta(eps), np.minimum(np.maximum(raw, floor), rdp_prof.delta(eps)))
  small = with_rdp.epsilon(1e-12)
  assert small == rdp_prof.epsilon(1e-12) and with_rdp.source(1e-12) == "RDP"
  assert with_rdp.source(1e-6) == "PLD"
  assert with_rdp.epsilon(1e-6) == pytest.approx(2.1245, abs=1e-3)  # measured PLD value
  assert with_rdp.epsilon(1e-6) < rdp_prof.epsilon(1e-6)


def test_tighter_of_equals_pld_with_fallback(q01):
  pld, with_rdp, rdp_prof = q01
  both = profiles.tighter_of(pld, rdp_prof)
  for d in (1e-3, 1e-6, 1e-9, 1e-11, 1e-14):
    assert both.epsilon(d) == with_rdp.epsilon(d)
  assert both.source(1e-14) == rdp_prof.description


@pytest.mark.timeout(60)
def test_adaptive_interval_is_fast_and_consistent_with_dp_accounting():
  # q = 0.5, sigma = 0.3, T = 1000: at discretisation 1e-4 the PLD has 1.7e7
  # atoms (24 s to compose); the adaptive interval (~0.011) has 1.7e5.
  ev = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.5, dpa.GaussianDpEvent(0.3)), 1000)
  prof = profiles.PldProfile(ev, None)
  assert 5e-3 < prof.interval < 2e-2
  eps = prof.epsilon(1e-5)
  assert prof.delta(eps) <= 1e-5 < prof.delta(eps - 1e-6)
  # dp-accounting's own delta of the same PLD agrees (losses near 2700: e^eps overflows
  # a naive evaluation).
  ref = dpa.pld.PLDAccountant(value_discretization_interval=prof.interval)
  ref.compose(ev)
  assert prof.raw_pld_delta(eps) == pytest.approx(ref.get_delta(eps), rel=1e-9)
  assert eps == pytest.approx(2695.35, abs=0.05)
