"""Papernot-Steinke RDP bounds: dp-accounting agreement, pinned values, traps, soundness."""

import math

import dp_accounting as dpa
import numpy as np
import pytest

from jaxdp import accounting as acc
from jaxdp.accounting import rdp_selection as rs
from tests.accounting import exact_selection as ex

DPSGD = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(256 / 60000, dpa.GaussianDpEvent(1.1)), 14063)
GAUSS4 = dpa.GaussianDpEvent(4.0)
INT_ORDERS = list(range(2, 64)) + [128, 256, 512, 1024]


def _dpa_epsilon(ev, delta, orders=None):
  accountant = dpa.rdp.RdpAccountant(orders)
  accountant.compose(ev.to_dp_event())
  return accountant.get_epsilon(delta)


@pytest.mark.parametrize("base", [GAUSS4, dpa.GaussianDpEvent(1.0), DPSGD,
                                  dpa.ComposedDpEvent([GAUSS4, dpa.LaplaceDpEvent(3.0)])],
                         ids=["gauss4", "gauss1", "dpsgd", "composed"])
@pytest.mark.parametrize("dist", [
    acc.Poisson(mean=1), acc.Poisson(mean=10), acc.Poisson(mean=100),
    acc.Geometric(mean=1.5), acc.Geometric(mean=10), acc.Geometric(mean=100),
    acc.Logarithmic(mean=10), acc.Logarithmic(mean=1000),
    acc.TruncatedNegativeBinomial(0.5, mean=10), acc.TruncatedNegativeBinomial(3.0, mean=30),
], ids=repr)
@pytest.mark.parametrize("orders", [None, INT_ORDERS], ids=["default-orders", "int-orders"])
def test_rdp_equals_dp_accounting_repeat_and_select(base, dist, orders):
  ev = acc.RepeatAndSelect(base, dist)
  for delta in (1e-5, 1e-8):
    ours = acc.epsilon(ev, delta, method="rdp", orders=orders)
    assert ours == pytest.approx(_dpa_epsilon(ev, delta, orders), rel=1e-9)


# REFERENCE.md Sec. 9.1 (dp_accounting 0.6.0, default orders).
@pytest.mark.parametrize("base,dist,eps5,eps6", [
    (GAUSS4, None, 1.0126, 1.1432),
    (GAUSS4, acc.Poisson(mean=10), 2.3538, 2.5011),
    (GAUSS4, acc.Poisson(mean=100), 8.3872, 9.2260),
    (GAUSS4, acc.Geometric(mean=10), 2.1537, 2.2716),
    (GAUSS4, acc.Geometric(mean=100), 2.7162, 2.8241),
    (GAUSS4, acc.Logarithmic(mean=10), 1.7841, 1.9021),
    (GAUSS4, acc.Logarithmic(mean=100), 2.1299, 2.2378),
    (DPSGD, None, 2.5967, 2.9041),
    (DPSGD, acc.Poisson(mean=10), 5.7489, 6.0767),
    (DPSGD, acc.Poisson(mean=100), 24.0949, 25.8655),
    (DPSGD, acc.Geometric(mean=10), 5.0490, 5.3302),
    (DPSGD, acc.Geometric(mean=100), 6.3739, 6.6351),
    (DPSGD, acc.Logarithmic(mean=10), 4.2945, 4.5757),
    (DPSGD, acc.Logarithmic(mean=100), 5.1139, 5.3750),
])
def test_reference_table_9_1(base, dist, eps5, eps6):
  ev = base if dist is None else acc.RepeatAndSelect(base, dist)
  assert acc.epsilon(ev, 1e-5, method="rdp") == pytest.approx(eps5, abs=1e-4)
  assert acc.epsilon(ev, 1e-6, method="rdp") == pytest.approx(eps6, abs=1e-4)


def test_reference_integer_orders_raise_epsilon():
  ev = acc.RepeatAndSelect(DPSGD, acc.Poisson(mean=10))
  assert acc.epsilon(ev, 1e-5, "rdp", orders=INT_ORDERS) == pytest.approx(5.9658, abs=1e-4)
  assert acc.epsilon(ev, 1e-6, "rdp", orders=INT_ORDERS) == pytest.approx(6.2804, abs=1e-4)


PS_ORDERS = np.concatenate([np.arange(101, 1100) / 100, np.arange(22, 400) / 2, [256, 512, 1024]])


# REFERENCE.md Sec. 9.4: base 0.1-zCDP, delta = 1e-6, discrete-grid Thm 2 / Thm 6.
@pytest.mark.parametrize("dist,eps_10,eps_100", [
    (acc.Poisson, 4.6074, 18.7588),
    (lambda m: acc.TruncatedNegativeBinomial(-0.5, mean=m), 3.0660, 3.5174),
    (lambda m: acc.TruncatedNegativeBinomial(0.0, mean=m), 3.4511, 4.0478),
    (lambda m: acc.TruncatedNegativeBinomial(0.5, mean=m), 3.7782, 4.5575),
    (lambda m: acc.TruncatedNegativeBinomial(1.0, mean=m), 4.0680, 5.0529),
], ids=["poisson", "eta-0.5", "eta0", "eta0.5", "eta1"])
def test_reference_zcdp_base_9_4(dist, eps_10, eps_100):
  base = dpa.ZCDpEvent(0.1)
  for mean, expected in ((10, eps_10), (100, eps_100)):
    ev = acc.RepeatAndSelect(base, dist(mean))
    assert acc.epsilon(ev, 1e-6, "rdp", orders=PS_ORDERS) == pytest.approx(expected, abs=1e-4)
    # Cor 4 (continuous order optimisation) for a plain Zcdp base can only help.
    assert acc.epsilon(acc.RepeatAndSelect(acc.Zcdp(0.1), dist(mean)), 1e-6, "rdp",
                       orders=PS_ORDERS) <= expected + 1e-4


def test_reference_zcdp_single_run_and_naive_composition():
  assert acc.epsilon(dpa.ZCDpEvent(0.1), 1e-6, "rdp", orders=PS_ORDERS) == pytest.approx(2.1422, abs=1e-4)
  naive10 = acc.RepeatAndSelect(dpa.ZCDpEvent(0.1), acc.Fixed(10))
  naive100 = acc.RepeatAndSelect(dpa.ZCDpEvent(0.1), acc.Fixed(100))
  assert acc.epsilon(naive10, 1e-6, "composition", orders=PS_ORDERS) == pytest.approx(7.7662, abs=1e-4)
  assert acc.epsilon(naive100, 1e-6, "composition", orders=PS_ORDERS) == pytest.approx(32.2217, abs=1e-4)


def test_corollary4_values_and_agreement_with_continuous_theorem2():
  # REFERENCE Sec. 9.2: rho = 1/32, E[K] = 10, eta = 0.
  dist = acc.Logarithmic(mean=10)
  orders = np.array([1.5, 2.0, 20.0])
  cor4 = rs.corollary4(orders, 1 / 32, dist)
  assert cor4[0] == pytest.approx(1.208703, abs=1e-6)
  assert cor4[1] == pytest.approx(1.208703, abs=1e-6)
  assert cor4[2] == pytest.approx(1.387151, abs=1e-6)
  # Theorem 2 on a very fine grid of lambda^ approaches Cor 4 from above.
  fine = np.linspace(1.0001, 60, 400_000)
  thm2 = rs.theorem2(fine, fine / 32, dist)
  assert np.interp(20.0, fine, thm2) == pytest.approx(1.387151, abs=2e-5)


@pytest.mark.parametrize("eta", [-0.5, 0.0, 0.5, 1.0, 2.0])
def test_corollary3_pure_dp_gives_2_plus_eta_eps(eta):
  ev = acc.RepeatAndSelect(acc.PureDp(0.7), acc.TruncatedNegativeBinomial(eta, mean=10))
  assert acc.epsilon(ev, 1e-9, "rdp") == pytest.approx((2 + eta) * 0.7, rel=1e-12)
  assert acc.delta(ev, (2 + eta) * 0.7, "rdp") == 0.0
  # Theorem 2 at lambda = lambda^ -> inf gives the same: eps' -> eps + (1+eta) eps.
  big = np.array([1e9])
  assert rs.theorem2(big, acc.PureDp(0.7).rdp(big), ev.distribution)[0] == pytest.approx(
      (2 + eta) * 0.7, abs=1e-6)


def test_trap_a_lemma7_without_k0_atom_is_false():
  # K ~ Bin(1, 0.3), Gaussian sigma = 2 (D_4(Q||Q') = 4/8 = 0.5), lambda = 4.
  dist, lam, base_rdp = acc.Binomial(1, 0.3), 4.0, 0.5
  printed = base_rdp + math.log(0.3) / (lam - 1)  # f' = p: Lemma 7 as printed
  q0, q1 = ex.gaussian_bins(2.0)
  exact = max(ex.renyi(ex.best_of_k(a, dist), ex.best_of_k(b, dist), lam) for a, b in ex.pairs_both_ways(q0, q1))
  assert printed == pytest.approx(0.0987, abs=1e-4)
  assert exact == pytest.approx(0.2384, abs=1e-4)
  assert printed < exact
  ours = acc.make_accountant("rdp", orders=[lam]).compose(acc.RepeatAndSelect(dpa.GaussianDpEvent(2.0), dist)).rdp[0]
  assert ours >= exact
  # Bin(1, p) is a mixture of "default" and one run: the atom-aware bound is exact here.
  assert ours == pytest.approx(exact, rel=1e-3)


def test_trap_b_theorem6_rejects_mean_below_one():
  orders, rdp = np.array([8.0]), np.array([8.0 / 128])  # Gaussian sigma 8 at lambda = 8
  printed = rdp[0] + math.log(0.3) / 7  # Thm 6 with delta^ ~ 0
  assert printed < 0
  with pytest.raises(ValueError, match="mean >= 1"):
    rs.theorem6(orders, rdp, 0.3)
  ev = acc.RepeatAndSelect(dpa.GaussianDpEvent(8.0), acc.Poisson(mean=0.3))
  ours = acc.make_accountant("rdp", orders=[8.0]).compose(ev).rdp[0]
  q0, q1 = ex.gaussian_bins(8.0)
  exact = max(ex.renyi(ex.best_of_k(a, ev.distribution), ex.best_of_k(b, ev.distribution), 8.0)
              for a, b in ex.pairs_both_ways(q0, q1))
  assert 0 < exact <= ours


def test_poisson_atom_corrected_bound_never_below_theorem6_for_mean_at_least_one():
  orders = np.asarray(acc.DEFAULT_ORDERS)
  rdp = acc.PureDp(1.0).rdp(orders)
  for mean in (1.0, 3.0, 30.0):
    assert np.all(rs.poisson_any_mean(orders, rdp, mean) >= rs.theorem6(orders, rdp, mean) - 1e-12)


@pytest.mark.parametrize("k", [1, 2, 5, 30])
def test_fixed_k_is_plain_composition(k):
  ev = acc.RepeatAndSelect(GAUSS4, acc.Fixed(k))
  composed = dpa.SelfComposedDpEvent(GAUSS4, k)
  for method in ("rdp", "composition"):
    assert acc.epsilon(ev, 1e-5, method) == pytest.approx(acc.epsilon(composed, 1e-5, "rdp"), rel=1e-9)


def test_lemma7_is_below_composition_for_binomial_with_small_p():
  ev = acc.RepeatAndSelect(GAUSS4, acc.Binomial(100, 0.1))
  lemma = rs.lemma7(np.asarray(acc.DEFAULT_ORDERS), acc.make_accountant("rdp").compose(GAUSS4).rdp, ev.distribution)
  comp = rs.composition(np.asarray(acc.DEFAULT_ORDERS), acc.make_accountant("rdp").compose(GAUSS4).rdp, ev.distribution)
  # Neither dominates order-wise: composition wins at small orders, Lemma 7 at large ones.
  assert np.any(lemma < comp) and np.any(comp < lemma)
  assert np.all(np.isfinite(lemma))
  assert acc.epsilon(ev, 1e-5, "rdp") < acc.epsilon(ev, 1e-5, "composition")


def test_binomial_approaches_poisson_like_bound():
  # Bin(n, m/n) -> Poisson(m): the numerical Lemma 7 bound stays in the Poisson bound's range.
  eps_pois = acc.epsilon(acc.RepeatAndSelect(GAUSS4, acc.Poisson(mean=10)), 1e-5, "rdp")
  eps_bin = acc.epsilon(acc.RepeatAndSelect(GAUSS4, acc.Binomial(1000, 0.01)), 1e-5, "rdp")
  assert 0.8 * eps_pois < eps_bin < 1.5 * eps_pois


def test_composition_of_random_k_matches_pgf_formula():
  ev = acc.RepeatAndSelect(acc.Zcdp(0.05), acc.Poisson(mean=4))
  g = acc.make_accountant("composition", orders=[2.0, 5.0]).compose(ev)
  # e^{(l-1) eps'} = f(e^{(l-1) rho l}) = exp(mean (e^{(l-1) rho l} - 1)).
  expected = [4 * math.expm1(1 * 0.05 * 2) / 1, 4 * math.expm1(4 * 0.05 * 5) / 4]
  np.testing.assert_allclose(g.rdp, expected, rtol=1e-12)


# --------------------------------------------------------------------------
# Soundness: every bound >= the exact divergence of concrete mechanisms.
# --------------------------------------------------------------------------

SOUND_DISTS = [acc.Poisson(mean=0.5), acc.Poisson(mean=1.0), acc.Poisson(mean=5), acc.Geometric(mean=3),
               acc.Logarithmic(mean=5), acc.TruncatedNegativeBinomial(-0.5, mean=5),
               acc.TruncatedNegativeBinomial(2.0, mean=4), acc.Binomial(1, 0.3), acc.Binomial(8, 0.4),
               acc.Fixed(1), acc.Fixed(3)]
SOUND_ORDERS = [1.5, 2.0, 4.0, 8.0, 16.0, 32.0]


def _exact_rdp(q0, q1, dist, lam):
  return max(ex.renyi(ex.best_of_k(a, dist), ex.best_of_k(b, dist), lam) for a, b in ex.pairs_both_ways(q0, q1))


def _exact_delta(q0, q1, dist, eps):
  return max(ex.hockey_stick(ex.best_of_k(a, dist), ex.best_of_k(b, dist), eps)
             for a, b in ex.pairs_both_ways(q0, q1))


@pytest.mark.parametrize("dist", SOUND_DISTS, ids=repr)
@pytest.mark.parametrize("mech", ["rr", "geometric", "gaussian"])
def test_rdp_bounds_are_sound_on_exact_mechanisms(dist, mech):
  if mech == "rr":
    base, (q0, q1) = acc.PureDp(0.8), ex.randomized_response(0.8)
  elif mech == "geometric":
    base, (q0, q1) = acc.PureDp(0.5), ex.geometric_mechanism(0.5)
  else:
    base, (q0, q1) = dpa.GaussianDpEvent(3.0), ex.gaussian_bins(3.0, n_bins=8000, width=12)
  ev = acc.RepeatAndSelect(base, dist)
  for method in ("rdp", "composition"):  # the RDP-curve methods; profiles: test_soundness_profiles
    bound = acc.make_accountant(method, orders=SOUND_ORDERS).compose(ev).rdp
    for lam, b in zip(SOUND_ORDERS, bound):
      assert b >= _exact_rdp(q0, q1, dist, lam) * (1 - 1e-6) - 1e-9, (method, lam)
    for delta in (1e-3, 1e-6):
      eps = acc.epsilon(ev, delta, method, orders=SOUND_ORDERS)
      if math.isinf(eps):  # e.g. composition when the PGF of K diverges: trivially sound
        continue
      assert _exact_delta(q0, q1, dist, eps) <= delta * (1 + 1e-6) + 1e-12, (method, delta)


def test_vectorised_rdp_to_delta_equals_dp_accounting():
  rng = np.random.default_rng(0)
  orders = np.asarray(acc.DEFAULT_ORDERS)
  for rdp in (acc.make_accountant("rdp").compose(DPSGD).rdp, rng.uniform(0, 3, orders.size),
              np.where(orders > 40, np.inf, orders / 50), np.zeros(orders.size)):
    eps = np.array([0.0, 0.01, 0.3, 1.0, 4.0, 30.0])
    ours = rs.rdp_to_delta(orders, rdp, eps)
    ref = [dpa.rdp.rdp_privacy_accountant.compute_delta(orders, rdp, e)[0] for e in eps]
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=0)


# --------------------------------------------------------------------------
# Vectorised paths: the same numbers as the scalar loops they replaced.
# --------------------------------------------------------------------------


def _composition_scalar_loop(orders, rdp, dist):
  """`rs.composition` as it was before the PGF was vectorised over the orders (1bd2e7c)."""
  lam1 = orders - 1.0
  out = np.full_like(orders, np.inf)
  for i, (l1, e) in enumerate(zip(lam1, rdp)):
    if not math.isfinite(e):
      continue
    if isinstance(dist, acc.Fixed):
      out[i] = dist.k * e
      continue
    if isinstance(dist, acc.Poisson):
      with np.errstate(over="ignore"):
        out[i] = dist.mean * np.expm1(l1 * e) / l1
      continue
    try:
      with np.errstate(over="ignore"):
        val = float(dist.pgf(math.exp(l1 * e)))
    except (ValueError, OverflowError):
      continue
    if math.isfinite(val) and val > 0:
      out[i] = math.log(val) / l1
  return rs.monotone(out)


COMPOSITION_LAWS = [acc.Geometric(mean=10), acc.Geometric(mean=1e4), acc.Logarithmic(mean=30),
                    acc.Logarithmic(mean=4.5e7), acc.TruncatedNegativeBinomial(0.5, mean=8),
                    acc.TruncatedNegativeBinomial(0.5, mean=2.4e5), acc.TruncatedNegativeBinomial(-0.5, mean=5),
                    acc.TruncatedNegativeBinomial(2.5, mean=3), acc.Poisson(mean=3), acc.Fixed(3),
                    acc.Binomial(6, 0.5), acc.CappedGeometric(0.2, 12)]


@pytest.mark.parametrize("dist", COMPOSITION_LAWS, ids=repr)
def test_composition_vectorised_over_orders_equals_the_scalar_loop(dist):
  orders = np.asarray(acc.DEFAULT_ORDERS)
  curves = [acc.make_accountant("rdp").compose(DPSGD).rdp, acc.make_accountant("rdp").compose(GAUSS4).rdp,
            np.where(orders > 30, np.inf, orders / 40), np.full(orders.size, 1e-9), orders * 0.5]
  for rdp in curves:
    assert np.array_equal(rs.composition(orders, rdp, dist), _composition_scalar_loop(orders, rdp, dist))


@pytest.mark.parametrize("pure", [None, 2.0], ids=["rdp-only", "pure"])
def test_lemma7_with_its_q_max_cached_equals_a_fresh_computation(pure):
  from jaxdp.accounting import _dpa  # pylint: disable=g-import-not-at-top
  orders = np.asarray(acc.DEFAULT_ORDERS)
  rdp = acc.make_accountant("rdp").compose(GAUSS4).rdp
  laws = [acc.Fixed(2), acc.Fixed(9), acc.Binomial(6, 0.5), acc.CappedGeometric(0.2, 12)]
  _dpa.clear_caches()
  warm = [rs.lemma7(orders, rdp, d, pure) for d in laws]  # the first computes q_max, the rest reuse it
  for d, got in zip(laws, warm):
    _dpa.clear_caches()
    assert np.array_equal(rs.lemma7(orders, rdp, d, pure), got)
