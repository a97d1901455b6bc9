"""Base privacy profiles: closed forms, PLD agreement, symmetry and inversion."""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np
import pytest
from scipy import stats

from jaxdp import accounting as acc
from jaxdp.accounting import _dpa
from jaxdp.accounting import _dpa_pld
from jaxdp.accounting import profiles
from tests.accounting import exact_selection as ex

DPSGD = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(256 / 60000, dpa.GaussianDpEvent(1.1)), 14063)


@pytest.fixture(scope="module")
def dpsgd_profile():
  return acc.ProfileAccountant().profile_of(DPSGD)


def test_gaussian_profile_matches_balle_wang_closed_form():
  sigma = 4.0
  prof = acc.ProfileAccountant().profile_of(dpa.GaussianDpEvent(sigma))
  for eps in (0.0, 0.3, 1.0, 2.5):
    # Phi(1/(2 sigma) - eps sigma) - e^eps Phi(-1/(2 sigma) - eps sigma), Delta = 1.
    want = stats.norm.cdf(0.5 / sigma - eps * sigma) - math.exp(eps) * stats.norm.cdf(-0.5 / sigma - eps * sigma)
    assert prof.delta(eps) == pytest.approx(want, rel=1e-9, abs=1e-15)


def test_gaussian_profile_upper_bounds_binned_gaussian():
  prof = acc.ProfileAccountant().profile_of(dpa.GaussianDpEvent(2.0))
  p, r = ex.gaussian_bins(2.0, n_bins=6000, width=10.0)
  for eps in (0.0, 0.5, 1.0):
    assert ex.hockey_stick(p, r, eps) <= prof.delta(eps) + 1e-12


def test_self_composed_gaussian_is_one_gaussian():
  comp = acc.ProfileAccountant().profile_of(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(8.0), 4))
  one = acc.ProfileAccountant().profile_of(dpa.GaussianDpEvent(4.0))
  assert comp.delta(0.7) == pytest.approx(one.delta(0.7), rel=1e-12)


@pytest.mark.parametrize("delta,want", [(1e-5, 2.3818), (1e-6, 2.6969)], ids=["1e-5", "1e-6"])
def test_dpsgd_single_run_matches_reference(dpsgd_profile, delta, want):
  # REFERENCE 9.6: PLD (discretisation 1e-4) single-run epsilon.
  assert dpsgd_profile.epsilon(delta) == pytest.approx(want, abs=1e-3)


def test_pld_delta_matches_dp_accounting_and_is_not_smaller(dpsgd_profile):
  accountant = dpa.pld.PLDAccountant()
  accountant.compose(DPSGD)
  pld = profiles.PldProfile(DPSGD)
  for eps in (0.0, 0.5, 1.5, 2.3818, 4.0):
    ref = accountant.get_delta(eps)
    ours = dpsgd_profile.delta(eps)
    assert ours >= ref * (1 - 1e-12)
    # The raw PLD value (ours drops FFT round-off negatives); at eps = 4 it is
    # ~1e-11, below PLD_DELTA_FLOOR, where the profile itself no longer uses it.
    assert pld.raw_pld_delta(eps) == pytest.approx(ref, rel=5e-2, abs=1e-12)
    if ref >= _dpa_pld.PLD_DELTA_FLOOR:
      assert ours == pytest.approx(ref, rel=5e-2, abs=1e-12)
    else:
      assert pld.delta(eps) == _dpa_pld.PLD_DELTA_FLOOR


def test_pld_vectorised_equals_scalar(dpsgd_profile):
  eps = np.linspace(-1.0, 5.0, 13)
  vec = dpsgd_profile.delta(eps)
  assert np.allclose(vec, [dpsgd_profile.delta(float(e)) for e in eps], rtol=0, atol=0)
  assert np.all(np.diff(vec) <= 1e-15)  # non-increasing in eps


def test_negative_epsilon_uses_reverse_direction():
  prof = profiles.PureDpProfile(1.0)
  p, r = ex.randomized_response(1.0)
  for a in (0.2, 0.9, 2.0):
    assert prof.delta(-a) == pytest.approx(max(ex.hockey_stick(p, r, -a), ex.hockey_stick(r, p, -a)), rel=1e-12)


def test_pure_and_approx_profiles_are_exact_on_dominating_pairs():
  e0, d0 = 0.6, 1e-3
  a = math.exp(e0) / (1 + math.exp(e0))
  p = np.array([d0, (1 - d0) * a, (1 - d0) * (1 - a), 0.0])
  prof = acc.ProfileAccountant().profile_of(acc.ApproxDp(e0, d0))
  for eps in (0.0, 0.3, 0.6, 1.0):
    assert prof.delta(eps) == pytest.approx(ex.hockey_stick(p, p[::-1], eps), rel=1e-12)
  assert prof.epsilon(d0) == pytest.approx(e0)
  assert prof.epsilon(d0 / 2) == math.inf
  pure = acc.ProfileAccountant().profile_of(acc.PureDp(0.8))
  assert pure.epsilon(0.0) == 0.8
  # Below delta(0) the inverse follows the randomized-response curve
  # (e^0.8 - e^eps) / (1 + e^0.8) = 1e-9 (it used to return 0.8 flat).
  assert pure.epsilon(1e-9) == pytest.approx(math.log(math.exp(0.8) - 1e-9 * (1 + math.exp(0.8))), rel=1e-11)
  assert pure.epsilon(1e-9) <= 0.8


@pytest.mark.parametrize("base", [dpa.GaussianDpEvent(3.0), acc.PureDp(1.3), acc.ApproxDp(1.0, 1e-6),
                                  acc.Zcdp(0.05), acc.ReportNoisyMax(4.0, 10)],
                         ids=["gauss", "pure", "approx", "zcdp", "rnm"])
def test_epsilon_inverts_delta_on_the_private_side(base):
  prof = acc.ProfileAccountant().profile_of(base)
  for delta in (1e-3, 1e-6):
    eps = prof.epsilon(delta)
    assert prof.delta(eps) <= delta
    if 0 < eps < math.inf and base != acc.PureDp(1.3):
      assert prof.delta(eps - 1e-3) > delta


def test_zcdp_profile_agrees_with_rdp_conversion():
  assert acc.epsilon(acc.Zcdp(0.1), 1e-6, method="profile") == pytest.approx(
      acc.epsilon(acc.Zcdp(0.1), 1e-6, method="rdp"), rel=1e-9)


def test_report_noisy_max_reference_values():
  # REFERENCE 9.5, RNM sigma=4, delta=1e-6: RDP Thm 3.1 / HS Thm 3.2.
  for m, rdp, hs in ((10, 2.6517, 2.4903), (1000, 3.0582, 2.9097), (100000, 3.4212, 3.2787)):
    rnm = acc.ReportNoisyMax(4.0, m)
    assert acc.epsilon(rnm, 1e-6, method="rdp") == pytest.approx(rdp, abs=1e-4)
    assert acc.epsilon(rnm, 1e-6, method="profile") == pytest.approx(hs, abs=1e-4)


@pytest.mark.parametrize("kwargs,match", [
    (dict(noise_multiplier=0.0, num_candidates=3), "noise_multiplier"),
    (dict(noise_multiplier=1.0, num_candidates=0), "num_candidates"),
    (dict(noise_multiplier=1.0, num_candidates=3, num_rounds=0), "num_rounds"),
    (dict(noise_multiplier=1.0, num_candidates=3, monotonic="yes"), "monotonic"),
], ids=["sigma", "m", "k", "monotonic"])
def test_report_noisy_max_validation(kwargs, match):
  with pytest.raises(ValueError, match=match):
    acc.ReportNoisyMax(**kwargs)


@pytest.mark.parametrize("eps,delta,match", [(-1.0, 0.1, "epsilon"), (1.0, 1.0, "delta"),
                                             (1.0, -0.1, "delta"), (math.nan, 0.1, "epsilon")])
def test_approx_dp_validation(eps, delta, match):
  with pytest.raises(ValueError, match=match):
    acc.ApproxDp(eps, delta)


def test_composed_pld_profile_uses_suffix_sums_equal_to_dp_accounting():
  # A candidate with a DP score: DP-SGD composed with a Gaussian. Its profile's
  # values come from suffix sums; they must equal dp-accounting's own
  # hockey-stick (to round-off, never below it) plus the trusted floor.
  from jaxdp.accounting import profile_accountant  # pylint: disable=g-import-not-at-top
  event = dpa.ComposedDpEvent([acc.dpsgd_event(0.16, 1.0, 63), dpa.GaussianDpEvent(1.0)])
  accountant = profile_accountant.ProfileAccountant()
  accountant.compose(event)
  profile = accountant.profile()
  assert isinstance(profile, profile_accountant.ComposedPldProfile)
  eps = np.linspace(0.0, 20.0, 41)
  fast = profile._delta_nonneg(eps)  # pylint: disable=protected-access
  slow = np.minimum(1.0, np.maximum(np.asarray(profile._pld.get_delta_for_epsilon(eps)), 0.0)  # pylint: disable=protected-access
                    + _dpa_pld.PLD_DELTA_FLOOR)
  np.testing.assert_allclose(fast, slow, rtol=1e-9, atol=1e-12)
  assert np.all(fast >= slow - 1e-15)
