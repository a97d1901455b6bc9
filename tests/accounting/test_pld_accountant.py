"""PldAccountant: dp-accounting agreement, exact soundness, mixture bound, floors, reasons."""

import math
import re

import dp_accounting as dpa
import numpy as np
import pytest

from jaxdp.accounting import _dpa_pld as pld_adapter
from jaxdp.accounting import distributions as dists
from jaxdp.accounting import events as ev
from jaxdp.accounting.pld_accountant import PldAccountant
from tests.accounting import exact_selection as ex

FLOOR = pld_adapter.PLD_DELTA_FLOOR
RUN = ev.dpsgd_event(0.01, 1.0, 1000)  # q = 0.01, sigma = 1, 10 epochs
_GAUSS = dpa.pld.privacy_loss_mechanism.GaussianPrivacyLoss
_ROUNDING = 1e-15  # absolute float error of a hockey-stick sum, per unit of e^eps


def _dpa_pld(event, interval=1e-4):
  return dpa.pld.PLDAccountant(value_discretization_interval=interval).compose(event)


# --------------------------------------------------------------------------- Fixed(k) = composition


def test_fixed_20_dpsgd_runs_matches_dp_accounting_acceptance():
  # Issue 11, item 4: 20 runs of DP-SGD, delta = 1e-5; dp-accounting gives ~9.27.
  ours = PldAccountant().compose(ev.RepeatAndSelect(RUN, dists.Fixed(20)))
  ref = _dpa_pld(dpa.SelfComposedDpEvent(RUN, 20))
  eps_ref = ref.get_epsilon(1e-5)
  assert eps_ref == pytest.approx(9.2675, abs=1e-4)
  assert ours.get_epsilon(1e-5) <= eps_ref * (1 + 1e-12)
  assert ours.get_epsilon(1e-5) == pytest.approx(eps_ref, rel=1e-12)
  for eps in (2.0, 9.0, 12.0):
    assert ours.get_delta(eps) == pytest.approx(ref.get_delta(eps), rel=1e-12)


@pytest.mark.parametrize("base, k", [
    (dpa.GaussianDpEvent(3.0), 5),
    (dpa.ComposedDpEvent([dpa.GaussianDpEvent(4.0), dpa.LaplaceDpEvent(3.0)]), 3),
    (dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.1, dpa.GaussianDpEvent(1.5)), 20), 7),
], ids=["gauss", "gauss+laplace", "sampled-gauss"])
def test_fixed_k_equals_dp_accounting_self_composition(base, k):
  ours = PldAccountant().compose(ev.RepeatAndSelect(base, dists.Fixed(k)))
  ref = _dpa_pld(dpa.SelfComposedDpEvent(base, k))
  # The same PLD: equal deltas. Epsilons may sit a few ulps above dp-accounting's
  # inverse where its forward curve disagrees in the last bits (feasible side).
  for delta in (1e-3, 1e-6, 1e-9):
    eps_ref = ref.get_epsilon(delta)
    assert eps_ref * (1 - 1e-15) <= ours.get_epsilon(delta) <= eps_ref * (1 + 1e-10)
  for eps in (0.5, 1.0, 3.0):
    ref_delta = ref.get_delta(eps)
    assert ours.get_delta(eps) == pytest.approx(max(ref_delta, FLOOR), rel=1e-12)


def test_nested_fixed_and_composition_order_do_not_matter():
  g = dpa.GaussianDpEvent(3.0)
  a = PldAccountant().compose(ev.RepeatAndSelect(ev.RepeatAndSelect(g, dists.Fixed(2)), dists.Fixed(3)))
  b = PldAccountant().compose(dpa.SelfComposedDpEvent(g, 6))
  assert a.get_epsilon(1e-6) == b.get_epsilon(1e-6)
  sel = ev.RepeatAndSelect(ev.PureDp(0.3), dists.Poisson(mean=2))
  c = PldAccountant().compose(dpa.ComposedDpEvent([sel, g]))
  d = PldAccountant().compose(dpa.ComposedDpEvent([g, dpa.NoOpDpEvent(), sel]))
  assert c.get_epsilon(1e-6) == pytest.approx(d.get_epsilon(1e-6), rel=1e-12)


def test_random_stopping_is_capped_geometric_selection():
  base = ev.PureDp(0.4)
  a = PldAccountant().compose(ev.RandomStopping(base, 0.3, max_iterations=10))
  b = PldAccountant().compose(ev.RepeatAndSelect(base, dists.CappedGeometric(0.3, 10)))
  assert a.get_epsilon(1e-6) == b.get_epsilon(1e-6)
  assert "CappedGeometric" in a.theorem


# --------------------------------------------------------------------------- soundness vs exact


def _exact_best_of_k_delta(q0, q1, dist, eps):
  """Exact hockey-stick of best-of-K, worst over neighbour order and score orientation."""
  return max(ex.hockey_stick(ex.best_of_k(a, dist), ex.best_of_k(b, dist), eps)
             for a, b in ex.pairs_both_ways(q0, q1))


@pytest.mark.parametrize("dist", [
    dists.Poisson(mean=3), dists.Poisson(mean=0.5), dists.Geometric(mean=3), dists.Logarithmic(mean=2),
    dists.Binomial(10, 0.3), dists.CappedGeometric(0.2, 15), dists.Fixed(3),
], ids=repr)
@pytest.mark.parametrize("base_eps", [0.1, 0.5, 1.0])
def test_at_least_exact_best_of_k_randomized_response(dist, base_eps):
  # Randomized response is the worst eps-DP pair, so its best-of-K is exact for PureDp.
  # Interval 1e-3: a k-fold pure-DP PLD spans 2 k eps / interval atoms, so 1e-4 is 10x slower.
  acct = PldAccountant(1e-3, max_terms=200).compose(ev.RepeatAndSelect(ev.PureDp(base_eps), dist))
  q0, q1 = ex.randomized_response(base_eps)
  for eps in np.linspace(0.0, 4.0 * base_eps * max(dist.mean, 1.0), 9):
    exact = _exact_best_of_k_delta(q0, q1, dist, eps)
    # Both are float sums of (p - e^eps r)_+: where the PLD is exact (eps on the
    # grid) they agree up to that cancellation, ~1e-16 e^eps absolute (for Fixed(3)
    # at eps ~ 3 the float "exact" value is 1e-8 relative above the 50-digit one,
    # which the accountant matches).
    assert acct.get_delta(eps) >= exact - _ROUNDING * math.exp(eps)
  for delta in (1e-2, 1e-4, 1e-7):
    eps = acct.get_epsilon(delta)
    assert _exact_best_of_k_delta(q0, q1, dist, eps) <= delta + _ROUNDING * math.exp(eps)


@pytest.mark.parametrize("dist", [dists.Poisson(mean=4), dists.Binomial(6, 0.5)], ids=repr)
def test_at_least_exact_best_of_k_geometric_mechanism(dist):
  q0, q1 = ex.geometric_mechanism(0.7)
  acct = PldAccountant().compose(ev.RepeatAndSelect(ev.PureDp(0.7), dist))
  for eps in (0.0, 0.5, 1.0, 2.0, 3.0):
    assert acct.get_delta(eps) >= _exact_best_of_k_delta(q0, q1, dist, eps) - _ROUNDING * math.exp(eps)


def test_at_least_exact_best_of_k_binned_gaussian():
  # Binned best-of-K is a lower bound on the true divergence (binning is post-processing).
  dist = dists.Poisson(mean=2)
  q0, q1 = ex.gaussian_bins(2.0, n_bins=4000)
  acct = PldAccountant().compose(ev.RepeatAndSelect(dpa.GaussianDpEvent(2.0), dist))
  for eps in (0.0, 0.3, 0.8, 1.5):
    assert acct.get_delta(eps) >= _exact_best_of_k_delta(q0, q1, dist, eps) - _ROUNDING * math.exp(eps)


# --------------------------------------------------------------------------- the mixture bound


def _gaussian_mixture_delta(sigma_sel, sigma_final, dist, eps, k_max):
  # Gaussian^k o Gaussian is one Gaussian with 1/s^2 = k/sigma_sel^2 + 1/sigma_final^2,
  # whose hockey-stick curve dp-accounting evaluates in closed form.
  ks = np.arange(k_max + 1)
  total = 0.0
  for k, p in zip(ks, dist.pmf(ks)):
    std = 1.0 / math.sqrt(k / sigma_sel ** 2 + 1.0 / sigma_final ** 2)
    total += p * _GAUSS(std).get_delta_for_epsilon(eps)
  return total + (1.0 - math.fsum(dist.pmf(ks)))


def test_selection_composed_with_gaussian_is_the_closed_form_mixture():
  dist = dists.Poisson(mean=3)
  sel = ev.RepeatAndSelect(dpa.GaussianDpEvent(5.0), dist)
  acct = PldAccountant().compose(dpa.ComposedDpEvent([sel, dpa.GaussianDpEvent(4.0)]))
  for eps in (0.5, 1.0, 2.0):
    expected = _gaussian_mixture_delta(5.0, 4.0, dist, eps, 60)
    ours = acct.get_delta(eps)
    # Pessimistic discretisation: never below, and within 1% above.
    assert expected <= ours <= expected * 1.01 + 1e-12
  sel_only = PldAccountant().compose(sel).get_epsilon(1e-6)
  final_only = PldAccountant().compose(dpa.GaussianDpEvent(4.0)).get_epsilon(1e-6)
  assert acct.get_epsilon(1e-6) > max(sel_only, final_only)


def test_poisson_truncation_matches_a_much_deeper_sum():
  sel = ev.RepeatAndSelect(ev.PureDp(0.3), dists.Poisson(mean=5))
  short = PldAccountant().compose(sel)
  deep = PldAccountant(tail_tolerance=1e-30, max_terms=300).compose(sel)
  tol = 1e-3 * FLOOR  # the default tail tolerance
  for eps in (0.5, 1.0, 2.0, 3.0):
    d_short, d_deep = short.get_delta(eps), deep.get_delta(eps)
    # The short sum adds its tail bound (<= tol) where the deep one has terms below it;
    # the weights' 1e-12 relative slack and FFT round-off account for the rest.
    assert d_deep * (1 - 1e-11) <= d_short <= d_deep + tol + 1e-11 * d_deep
  assert short.get_epsilon(1e-6) == pytest.approx(deep.get_epsilon(1e-6), rel=1e-6)
  assert "k <= " in short.theorem and "tail" in short.theorem


def test_non_private_base_costs_probability_of_any_run():
  # delta = P(K >= 1) * 1 + P(K = 0) * 0 = 1 - e^{-1/2} at every eps.
  acct = PldAccountant().compose(ev.RepeatAndSelect(dpa.NonPrivateDpEvent(), dists.Poisson(mean=0.5)))
  p_any = -math.expm1(-0.5)
  assert acct.get_delta(5.0) == pytest.approx(p_any, rel=1e-9)
  assert acct.get_delta(5.0) >= p_any
  assert acct.get_epsilon(0.5) == 0.0
  assert acct.get_epsilon(0.3) == math.inf


def test_non_private_composition_claims_nothing():
  acct = PldAccountant().compose(dpa.ComposedDpEvent([dpa.NonPrivateDpEvent(), dpa.GaussianDpEvent(1.0)]))
  assert acct.get_delta(100.0) == 1.0
  assert acct.get_epsilon(0.5) == math.inf


# --------------------------------------------------------------------------- consistency and floor


@pytest.mark.parametrize("event", [
    ev.RepeatAndSelect(ev.PureDp(0.5), dists.Poisson(mean=3)),
    ev.RepeatAndSelect(dpa.GaussianDpEvent(3.0), dists.Binomial(8, 0.4)),
    dpa.ComposedDpEvent([ev.ApproxDp(0.5, 1e-12), ev.RandomStopping(dpa.LaplaceDpEvent(2.0), 0.5)]),
    dpa.GaussianDpEvent(2.0),
], ids=["rr-poisson", "gauss-binomial", "approx+stopping", "gauss"])
def test_delta_of_epsilon_never_exceeds_target(event):
  acct = PldAccountant().compose(event)
  for delta in (FLOOR, 1e-9, 1e-6, 1e-3, 0.1):
    eps = acct.get_epsilon(delta)
    assert math.isfinite(eps)
    assert acct.get_delta(eps) <= delta
    if eps > 0:  # and it is the smallest such eps, up to rounding
      assert acct.get_delta(eps * (1 - 1e-6)) > delta


def test_epsilon_below_floor_is_infinite():
  acct = PldAccountant().compose(dpa.GaussianDpEvent(1.0))
  assert acct.get_epsilon(FLOOR * 0.99) == math.inf
  assert math.isfinite(acct.get_epsilon(FLOOR))


def test_delta_below_floor_is_the_floor_and_above_it_is_dp_accountings():
  # PureDp(1) composed twice: exact delta(2.0001) = 0 (beyond the largest loss);
  # the computed 0 is below the floor, so the floor is reported, never 0.
  acct = PldAccountant().compose(dpa.SelfComposedDpEvent(ev.PureDp(1.0), 2))
  assert acct.get_delta(2.5) == FLOOR
  assert acct.get_delta(math.inf) == FLOOR
  # Above the floor: the raw value, which bounds the exact RR composition.
  q0, q1 = ex.randomized_response(1.0)
  p, r = np.outer(q0, q0).ravel(), np.outer(q1, q1).ravel()
  for eps in (0.0, 0.5, 1.5):
    exact = max(ex.hockey_stick(p, r, eps), ex.hockey_stick(r, p, eps))
    assert exact > FLOOR
    assert exact * (1 - 1e-12) <= acct.get_delta(eps) <= exact + 1e-3
  # A Gaussian far in its tail: dp-accounting's raw value is below the floor.
  gauss = PldAccountant().compose(dpa.GaussianDpEvent(1.0))
  raw = _dpa_pld(dpa.GaussianDpEvent(1.0)).get_delta(9.0)
  assert 0.0 < raw < FLOOR and gauss.get_delta(9.0) == FLOOR
  raw = _dpa_pld(dpa.GaussianDpEvent(1.0)).get_delta(3.0)
  assert raw > FLOOR and gauss.get_delta(3.0) == raw


def test_pure_and_approx_dp_alone_are_their_exact_curves_rounded_up():
  for eps in (0.3, 1.0, 2.5):
    # Randomized response: delta(e) = (1 - e^{e - eps}) / (1 + e^-eps) > 0 below eps.
    got = PldAccountant().compose(ev.PureDp(eps)).get_epsilon(1e-6)
    assert ev.PureDp(eps).hockey_stick(got) <= 1e-6
    assert got <= eps + 1e-4
  # (eps, delta)-DP's dominating pair: delta at +inf, (1 - delta) times randomized response.
  got = PldAccountant().compose(ev.ApproxDp(1.0, 1e-6)).get_epsilon(2e-6)
  assert 1e-6 + (1 - 1e-6) * ev.PureDp(1.0).hockey_stick(got) <= 2e-6 * (1 + 1e-9)
  assert got <= 1.0 + 1e-4
  assert PldAccountant().compose(ev.ApproxDp(1.0, 1e-6)).get_epsilon(1e-7) == math.inf


# --------------------------------------------------------------------------- supports and reasons

_SEL = ev.RepeatAndSelect(ev.PureDp(0.5), dists.Poisson(mean=2))


@pytest.mark.parametrize("event, reason", [
    (ev.Zcdp(0.1), "zCDP"),
    (ev.RdpCurve([2.0, 4.0], [0.1, 0.3]), "RDP curve"),
    (ev.ReportNoisyMax(2.0, 10), "report-noisy-max"),
    (ev.ThresholdSelect(ev.PureDp(0.5), 0.1), "data-dependent"),
    (ev.UniformCandidates([ev.PureDp(0.5), ev.PureDp(1.0)]), "pointwise max"),
    (ev.SubsampledTuning(_SEL, ev.PureDp(1.0), 0.1), "Koskela-Kulkarni"),
    (ev.RepeatAndSelect(_SEL, dists.Poisson(mean=2)), "itself a random-K selection"),
    (ev.RepeatAndSelect(_SEL, dists.Fixed(2)), "itself a random-K selection"),
    (dpa.ComposedDpEvent([_SEL, _SEL]), "2 random-K selections"),
    (dpa.SelfComposedDpEvent(_SEL, 3), "composed 3 times"),
    (ev.RepeatAndSelect(ev.PureDp(0.5), dists.Geometric(mean=100)), r"Geometric\(mean=100.0\) needs more than max_terms=48 terms"),
    (ev.RepeatAndSelect(ev.PureDp(0.5), dists.Logarithmic(mean=1000)), "Logarithmic.*needs"),
    (dpa.ComposedDpEvent([dpa.GaussianDpEvent(1.0), ev.RepeatAndSelect(ev.Zcdp(0.1), dists.Poisson(2))]),
     "zCDP"),
    (dpa.dp_event.RepeatAndSelectDpEvent(dpa.GaussianDpEvent(1.0), 3.0, math.inf),
     "does not support RepeatAndSelectDpEvent"),
], ids=["zcdp", "rdp-curve", "rnm", "threshold", "uniform-candidates", "subsampled", "nested-random",
        "fixed-of-random", "two-random", "self-composed-random", "heavy-geometric", "heavy-log",
        "nested-unsupported", "dpa-repeat-and-select"])
def test_unsupported_with_reason(event, reason):
  acct = PldAccountant()
  assert not acct.supports(event)
  with pytest.raises(dpa.UnsupportedEventError, match=reason):
    acct.compose(event)


def test_one_random_selection_per_accountant():
  acct = PldAccountant().compose(_SEL)
  assert acct.supports(dpa.GaussianDpEvent(1.0))
  assert acct.supports(ev.RepeatAndSelect(ev.PureDp(0.5), dists.Fixed(4)))
  assert not acct.supports(_SEL)
  with pytest.raises(dpa.UnsupportedEventError, match="already holds"):
    acct.compose(_SEL)
  with pytest.raises(dpa.UnsupportedEventError, match="composed 2 times"):
    PldAccountant().compose(_SEL, 2)


def test_only_add_remove_relation():
  acct = PldAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
  assert acct.supports(dpa.NoOpDpEvent())
  assert not acct.supports(dpa.GaussianDpEvent(1.0))
  with pytest.raises(dpa.UnsupportedEventError, match="add/remove-one"):
    acct.compose(ev.PureDp(1.0))


def test_max_terms_decides_support():
  sel = ev.RepeatAndSelect(ev.PureDp(0.5), dists.Poisson(mean=10))
  theorem = PldAccountant().compose(sel).theorem
  k_max = int(re.search(r"k <= (\d+)", theorem).group(1))
  assert 30 < k_max <= 48
  assert PldAccountant(max_terms=k_max).supports(sel)
  assert not PldAccountant(max_terms=k_max - 1).supports(sel)
  with pytest.raises(dpa.UnsupportedEventError, match=f"needs more than max_terms={k_max - 1} terms"):
    PldAccountant(max_terms=k_max - 1).compose(sel)
  # Bounded K needs no tail: Binomial(n, p) with n <= max_terms is always supported.
  assert PldAccountant(max_terms=30).supports(ev.RepeatAndSelect(ev.PureDp(0.5), dists.Binomial(30, 0.9)))


@pytest.mark.parametrize("kwargs", [
    {"value_discretization_interval": 0.0}, {"tail_tolerance": 0.0}, {"tail_tolerance": 1.0},
    {"max_terms": -1},
], ids=repr)
def test_constructor_validates(kwargs):
  with pytest.raises(ValueError):
    PldAccountant(**kwargs)


def test_theorem_strings():
  assert PldAccountant().theorem == "nothing composed"
  assert PldAccountant().compose(dpa.GaussianDpEvent(1.0)).theorem.startswith("PLD composition (")
  text = PldAccountant().compose(_SEL).theorem
  assert "mixture over K ~ Poisson(mean=2.0) (joint convexity), k <= " in text


# --------------------------------------------------------------------------- DP-SGD (slow)


@pytest.mark.slow
def test_poisson_10_over_dpsgd_run_pinned():
  # ~7 s at interval 1e-4 (41 terms); the mixture sits between Fixed(10) and Fixed(41).
  acct = PldAccountant().compose(ev.RepeatAndSelect(RUN, dists.Poisson(mean=10)))
  eps = acct.get_epsilon(1e-5)
  assert eps == pytest.approx(7.3695, abs=2e-4)
  assert acct.get_delta(eps) <= 1e-5
  lo = PldAccountant().compose(ev.RepeatAndSelect(RUN, dists.Fixed(10))).get_epsilon(1e-5)
  assert lo < eps


# --------------------------------------------------------------------------- epsilon_exceeds
# `epsilon_exceeds(delta, eps)` is `get_epsilon(delta) > eps`, decided from the
# first terms of the mixture where they already exceed delta at eps. (A coarse
# grid, 1e-3, keeps the many full builds below short.)

_COARSE = 1e-3
_SEARCH = ev.RepeatAndSelect(dpa.ComposedDpEvent([ev.dpsgd_event(0.2, 2.0, 10), dpa.GaussianDpEvent(5.0)]),
                             dists.Poisson(mean=3))


@pytest.mark.parametrize("event", [
    _SEARCH,
    ev.RepeatAndSelect(ev.PureDp(0.5), dists.Geometric(mean=1.5)),
    dpa.ComposedDpEvent([ev.RepeatAndSelect(dpa.GaussianDpEvent(3.0), dists.Binomial(6, 0.5)),
                         dpa.GaussianDpEvent(4.0)]),
    ev.RepeatAndSelect(dpa.GaussianDpEvent(3.0), dists.Fixed(3)),  # no random K: the plain comparison
], ids=["dpsgd+score, Poisson", "pure, geometric", "selection + Gaussian", "fixed"])
def test_epsilon_exceeds_is_the_comparison_with_get_epsilon(event):
  exact = PldAccountant(_COARSE).compose(event).get_epsilon(1e-5)
  for target in (0.5 * exact, exact * (1 - 1e-9), exact, exact * (1 + 1e-9), math.inf):
    acct = PldAccountant(_COARSE).compose(event)
    assert acct.epsilon_exceeds(1e-5, target) == (exact > target), target
    # Whichever way it decided, get_epsilon is still the whole curve's number.
    assert acct.get_epsilon(1e-5) == exact
  assert PldAccountant(_COARSE).compose(event).epsilon_exceeds(1e-10, 1e6)  # below the floor: inf


def test_epsilon_exceeds_stops_at_the_first_terms_that_exceed(monkeypatch):
  # Poisson(3) needs 22 terms; far below the epsilon the first few already
  # put delta above the target, and the rest are never composed.
  composed = []
  real = pld_adapter.compose_plds
  monkeypatch.setattr(pld_adapter, "compose_plds", lambda a, b, *args: composed.append(1) or real(a, b,
                                                                                                  *args))
  PldAccountant(_COARSE).compose(_SEARCH).get_epsilon(1e-5)
  full = len(composed)
  composed.clear()
  acct = PldAccountant(_COARSE).compose(_SEARCH)
  assert acct.epsilon_exceeds(1e-5, 1.0)
  assert acct._curve_cache is None  # pylint: disable=protected-access
  assert 0 < len(composed) < full / 2, (len(composed), full)
