"""The dp-accounting internals `jaxdp.accounting._dpa` reads: present and meaning what it assumes.

A failure here means a dp-accounting release changed them: update `_dpa.py`
and the version pin in pyproject.toml together.
"""

from __future__ import annotations

import importlib.metadata
import math

import dp_accounting as dpa
import numpy as np
import pytest

from jaxdp.accounting import _dpa
from jaxdp.accounting import _dpa_pld

EVENTS = {
    "gaussian": dpa.GaussianDpEvent(2.0),
    "dpsgd": dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.0)), 100),
}


def _require(obj, attr: str):
  if not hasattr(obj, attr):
    pytest.fail(f"dp-accounting internals changed: {type(obj).__name__}.{attr} is missing "
                f"(dp-accounting {importlib.metadata.version('dp-accounting')})")
  return getattr(obj, attr)


@pytest.fixture(scope="module", params=list(EVENTS), ids=list(EVENTS))
def accountant(request):
  acct = dpa.pld.PLDAccountant(value_discretization_interval=1e-3)
  acct.compose(EVENTS[request.param])
  return acct


def test_pld_accountant_attributes(accountant):
  pld = _require(accountant, "_pld")
  assert isinstance(pld, dpa.pld.privacy_loss_distribution.PrivacyLossDistribution), \
      "dp-accounting internals changed: PLDAccountant._pld is not a PrivacyLossDistribution"
  flag = _require(accountant, "_contains_non_dp_event")
  assert flag is False, "dp-accounting internals changed: _contains_non_dp_event"
  non_private = dpa.pld.PLDAccountant()
  non_private.compose(dpa.NonPrivateDpEvent())
  assert _require(non_private, "_contains_non_dp_event") is True, \
      "dp-accounting internals changed: _contains_non_dp_event does not flag NonPrivateDpEvent"


def test_pld_pmf_attributes(accountant):
  pld = accountant._pld  # pylint: disable=protected-access
  symmetric = _require(pld, "_symmetric")
  assert isinstance(symmetric, bool), "dp-accounting internals changed: _symmetric"
  pmfs = [_require(pld, "_pmf_remove")] + ([] if symmetric else [_require(pld, "_pmf_add")])
  for pmf in pmfs:
    probs = np.asarray(_require(pmf, "_probs"))
    lower = _require(pmf, "_lower_loss")
    disc = _require(pmf, "_discretization")
    inf_mass = _require(pmf, "_infinity_mass")
    assert probs.ndim == 1 and probs.size > 1, "dp-accounting internals changed: _probs is not a dense array"
    assert isinstance(lower, (int, np.integer)), "dp-accounting internals changed: _lower_loss is not an integer index"
    assert disc == pytest.approx(1e-3), "dp-accounting internals changed: _discretization"
    assert 0.0 <= inf_mass < 1e-6, "dp-accounting internals changed: _infinity_mass"
    # The masses plus the infinity mass add to one (the pessimistic
    # connect-the-dots discretisation and FFT round-off move it by ~1e-8).
    assert probs.sum() + inf_mass == pytest.approx(1.0, abs=1e-6), \
        "dp-accounting internals changed: _probs / _infinity_mass do not form a distribution"


def test_suffix_table_equals_dp_accounting_delta(accountant):
  pld = accountant._pld  # pylint: disable=protected-access
  tables = [_dpa_pld.pmf_table(p) for p in _dpa_pld.pld_pmfs(pld)]
  assert all(t is not None for t in tables), "dp-accounting internals changed: PMF not dense"
  for eps in np.linspace(-0.5, 4.0, 19):
    ours = float(np.max([_dpa_pld.suffix_delta(t, np.array([eps]))[0] for t in tables]))
    ref = float(pld.get_delta_for_epsilon(float(eps)))
    # The loss grid (_lower_loss, _discretization) and the masses mean what _dpa
    # assumes iff the two formulas agree.
    assert ours == pytest.approx(ref, abs=1e-12, rel=1e-9), \
        f"dp-accounting internals changed: suffix-table delta {ours!r} != get_delta_for_epsilon {ref!r} at eps={eps}"
    assert ours >= ref - 1e-15


def test_rdp_accountant_attribute():
  orders = [2.0, 4.0, 8.0]
  rdp = _dpa.dp_event_rdp(dpa.GaussianDpEvent(2.0), orders)
  assert rdp is not None, "dp-accounting internals changed: RdpAccountant._rdp"
  # Gaussian RDP is order / (2 sigma^2).
  np.testing.assert_allclose(rdp, np.asarray(orders) / 8.0, rtol=1e-12,
                             err_msg="dp-accounting internals changed: RdpAccountant._rdp")
  assert _dpa.dp_event_rdp(dpa.UnsupportedDpEvent(), orders) is None


def test_rdp_conversions_are_inverse():
  orders, rdp = np.array(_dpa.DEFAULT_ORDERS), np.array(_dpa.DEFAULT_ORDERS) * 0.05
  eps = _dpa.rdp_to_epsilon(orders, rdp, 1e-6)
  assert _dpa.rdp_to_delta(orders, rdp, eps) == pytest.approx(1e-6, rel=1e-6)


def test_pld_interval_for_is_finest_for_small_losses_and_coarser_for_large():
  assert _dpa_pld.pld_interval_for(EVENTS["dpsgd"]) == _dpa_pld.PLD_FINEST_INTERVAL
  big = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.5, dpa.GaussianDpEvent(0.3)), 1000)
  assert 5e-3 < _dpa_pld.pld_interval_for(big) < 2e-2
  assert _dpa_pld.pld_interval_for(dpa.UnsupportedDpEvent()) == _dpa_pld.PLD_FINEST_INTERVAL


def test_dropped_order_warnings_are_silenced_and_the_bound_kept(caplog):
  # q = 0.16, sigma = 1.57: dp-accounting drops alpha = 1.1..1.4 with a warning
  # per order; jaxdp filters exactly that message (the epsilon over the other
  # orders is still an upper bound) and nothing else from absl.
  import logging  # pylint: disable=g-import-not-at-top
  event = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.16, dpa.GaussianDpEvent(1.573427)), 63)
  with caplog.at_level(logging.WARNING, logger="absl"):
    eps = dpa.rdp.RdpAccountant().compose(event).get_epsilon(1e-5)
    logging.getLogger("absl").warning("another absl warning")
  messages = [r.getMessage() for r in caplog.records]
  assert messages == ["another absl warning"]
  assert 0 < eps < float("inf")


def test_pld_overflow_becomes_not_applicable_and_best_falls_back_to_rdp():
  # A DP score with sigma = 0.05 composed into DP-SGD: dp-accounting's PLD
  # overflows (math range error). "pld" names the reason; "best" still answers
  # with a method that can (never an uncaught OverflowError mid-calibration).
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  candidate = dpa.ComposedDpEvent([acc.dpsgd_event(0.16, 1.0, 63), dpa.GaussianDpEvent(0.05)])
  search = acc.RepeatAndSelect(candidate, acc.Poisson(mean=4))
  with pytest.raises(acc.NotApplicableError, match="PLD overflows"):
    acc.epsilon(search, 1e-5, method="pld")
  best = acc.epsilon(search, 1e-5, method="best")
  assert best <= acc.epsilon(search, 1e-5, method="rdp") and math.isfinite(best)


# ----------------------------------------------------------------------------- speed paths
# Each faster path below must give dp-accounting's (or the previous code's)
# numbers exactly: these compare bit for bit, not to a tolerance.


def _same_pld(ours, ref) -> bool:
  """Whether two PLDs are equal bit for bit (dense arrays, sparse dicts, tails, symmetry)."""
  if ours._symmetric != ref._symmetric:  # pylint: disable=protected-access
    return False
  for a, b in zip(_dpa_pld.pld_pmfs(ours), _dpa_pld.pld_pmfs(ref)):
    if type(a) is not type(b) or a._infinity_mass != b._infinity_mass:  # pylint: disable=protected-access
      return False
    if hasattr(b, "_loss_probs"):  # sparse
      if a._loss_probs != b._loss_probs:  # pylint: disable=protected-access
        return False
    elif (a._lower_loss != b._lower_loss  # pylint: disable=protected-access
          or not np.array_equal(np.asarray(a._probs), np.asarray(b._probs))):  # pylint: disable=protected-access
      return False
  return True


@pytest.mark.parametrize("sigma,q,interval", [
    (1.1, 256 / 60000, 1e-4),   # one DP-SGD step on MNIST
    (1.1, 256 / 60000, 1e-3),
    (0.3, 0.5, 1e-3),           # large losses
    (0.7, 0.999, 1e-3),         # next to q = 1 (the asymptote -log(1-q) is far out)
    (2.0, 1e-5, 1e-4),          # a tiny rate
    (1.0, 1.0, 1e-4),           # no subsampling: the symmetric PLD
    (2, 0.5, 1e-4),             # an int sigma
    (8.0, 0.1, 0.0137),         # a coarse grid: sparse PMFs
    (50.0, 0.5, 1e-3),
], ids=lambda v: repr(v))
def test_gaussian_pld_is_dp_accountings_bit_for_bit(sigma, q, interval):
  ref = dpa.pld.privacy_loss_distribution.from_gaussian_mechanism(
      sigma, value_discretization_interval=interval, sampling_prob=q)
  assert _same_pld(_dpa_pld.gaussian_pld(sigma, interval, q), ref)


def test_int_and_float_parameters_give_dp_accounting_the_same_pld():
  # The step cache keys sigma and q as floats; this is what makes that sound.
  from_gaussian = dpa.pld.privacy_loss_distribution.from_gaussian_mechanism
  assert _same_pld(from_gaussian(2, value_discretization_interval=1e-4, sampling_prob=1),
                   from_gaussian(2.0, value_discretization_interval=1e-4, sampling_prob=1.0))


PLD_EVENTS = {
    "dpsgd": EVENTS["dpsgd"],
    "gaussian": dpa.GaussianDpEvent(2.0),
    "gaussian x 9": dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(2.0), 9),
    "composed": dpa.ComposedDpEvent([EVENTS["dpsgd"], dpa.LaplaceDpEvent(3.0),
                                     dpa.SelfComposedDpEvent(EVENTS["dpsgd"], 2)]),
    "sampled laplace": dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.1, dpa.LaplaceDpEvent(1.0)), 5),
    "no-op and non-private": dpa.ComposedDpEvent([dpa.NoOpDpEvent(), EVENTS["dpsgd"], dpa.NonPrivateDpEvent()]),
    "rate 0": dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.0, dpa.GaussianDpEvent(1.0)), 3),
}


@pytest.mark.parametrize("name", list(PLD_EVENTS))
@pytest.mark.parametrize("interval", [1e-3, 1e-4])
def test_pld_of_event_is_dp_accountings_pld_accountant_bit_for_bit(name, interval):
  event = PLD_EVENTS[name]
  ref = dpa.pld.PLDAccountant(value_discretization_interval=interval)
  ref.compose(event)
  _dpa.clear_caches()
  for _ in range(2):  # built, then from the caches
    pld, non_private = _dpa_pld.pld_of_event(event, interval)
    assert _same_pld(pld, ref._pld)  # pylint: disable=protected-access
    assert non_private == ref._contains_non_dp_event  # pylint: disable=protected-access


@pytest.mark.parametrize("name", ["gaussian", "dpsgd"])
def test_pld_of_event_overflows_where_dp_accounting_does(name):
  # A discretisation of 1000 (what a huge composed epsilon makes pld_interval_for
  # pick) overflows math.expm1 in dp-accounting's connect-the-dots step.
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  event = PLD_EVENTS[name]
  with pytest.raises(OverflowError):
    dpa.pld.PLDAccountant(value_discretization_interval=1e3).compose(event)
  with pytest.raises(acc.NotApplicableError, match="PLD overflows"):
    _dpa_pld.pld_of_event(event, 1e3)


def test_cached_plds_are_not_modified_by_what_callers_do_with_them():
  _dpa.clear_caches()
  pld, _ = _dpa_pld.pld_of_event(EVENTS["dpsgd"], 1e-4)
  before = [np.array(p._probs,
                     copy=True) for p in _dpa_pld.pld_pmfs(pld)]  # pylint: disable=protected-access
  composed = pld.compose(pld).self_compose(3)
  pld.compute_mixture(composed, 0.3)
  _dpa_pld.pld_of_event(dpa.SelfComposedDpEvent(EVENTS["dpsgd"], 3),
                        1e-4)  # the cached step, self-composed
  for old, p in zip(before, _dpa_pld.pld_pmfs(pld)):
    assert np.array_equal(old, np.asarray(p._probs))  # pylint: disable=protected-access
  again, _ = _dpa_pld.pld_of_event(EVENTS["dpsgd"], 1e-4)
  assert again is pld


def test_rdp_deltas_equal_rdp_to_delta_bit_for_bit():
  rng = np.random.default_rng(0)
  orders = np.asarray(_dpa.DEFAULT_ORDERS)
  curves = [_dpa.dp_event_rdp(EVENTS["dpsgd"], orders), rng.uniform(0, 3, orders.size),
            np.where(orders > 40, np.inf, orders / 50), np.zeros(orders.size), orders * 1e-17,
            np.sort(rng.exponential(0.1, orders.size))]
  eps = np.concatenate([[0.0, 1e-300], rng.uniform(0, 10, 40), rng.exponential(1e-3, 10), [50.0, 1e3, np.inf]])
  for rdp in curves:
    ours = _dpa.rdp_to_deltas(orders, rdp, eps)
    with np.errstate(invalid="ignore"):  # dp-accounting's inf - inf at eps = inf
      ref = np.array([_dpa.rdp_to_delta(orders, rdp, float(e)) for e in eps])
    assert np.array_equal(ours, ref)
  with pytest.raises(ValueError, match="epsilons must be >= 0"):
    _dpa.rdp_to_deltas(orders, curves[0], [-1.0])


def test_pld_interval_for_equals_the_rdp_accountants_epsilon():
  big = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.5, dpa.GaussianDpEvent(0.3)), 1000)
  for event in (big, EVENTS["dpsgd"], PLD_EVENTS["composed"], dpa.LaplaceDpEvent(0.001)):
    eps = dpa.rdp.RdpAccountant().compose(event).get_epsilon(1e-10)
    assert _dpa_pld.pld_interval_for(event) == max(_dpa_pld.PLD_FINEST_INTERVAL, eps / 5e5)


def test_dp_event_rdp_cached_equals_fresh():
  orders = _dpa.DEFAULT_ORDERS
  for event in (EVENTS["dpsgd"], PLD_EVENTS["composed"]):
    ref = dpa.rdp.RdpAccountant(list(orders)).compose(event)._rdp  # pylint: disable=protected-access
    _dpa.clear_caches()
    first = _dpa.dp_event_rdp(event, orders)
    first[0] = -1.0  # a copy: callers cannot spoil the cache
    assert np.array_equal(_dpa.dp_event_rdp(event, orders), ref)


def test_event_key_is_equal_exactly_for_equal_events():
  a = dpa.ComposedDpEvent([EVENTS["dpsgd"], dpa.GaussianDpEvent(1.0)])
  same = dpa.ComposedDpEvent([EVENTS["dpsgd"], dpa.GaussianDpEvent(1.0)])
  swapped = dpa.ComposedDpEvent([dpa.GaussianDpEvent(1.0), EVENTS["dpsgd"]])
  assert _dpa.event_key(a) == _dpa.event_key(same) and hash(_dpa.event_key(a)) == hash(_dpa.event_key(same))
  assert _dpa.event_key(a) != _dpa.event_key(swapped)
  assert _dpa.event_key(dpa.SelfComposedDpEvent(a, 2)) != _dpa.event_key(dpa.SelfComposedDpEvent(a, 3))
  assert _dpa.event_key(EVENTS["dpsgd"]) is EVENTS["dpsgd"]  # hashable events are their own key
  assert _dpa.event_key(a) != _dpa.event_key(dpa.ComposedDpEvent([a]))  # nesting is kept


def test_lru_cache_is_bounded_by_entries_and_bytes():
  cache = _dpa.LruCache(max_entries=3, max_bytes=100)
  for i in range(4):
    cache.put(i, str(i), nbytes=10)
  assert len(cache) == 3 and cache.get(0) is None  # the oldest went first
  assert cache.get(1) == "1"  # ... and a read makes an entry the newest
  cache.put(4, "4", nbytes=85)  # 115 bytes: the least recently used go until <= 100
  assert cache.get(2) is None and cache.get(3) is None and cache.get(1) == "1" and cache.get(4) == "4"
  cache.put(5, "too big", nbytes=101)  # larger than the whole budget: never kept
  assert cache.get(5) is None and cache.get(4) == "4"
  cache.put(6, None)  # None is "missing": never kept
  assert len(cache) == 2
  _dpa.clear_caches()  # reaches every LruCache
  assert len(cache) == 0


# ----------------------------------------------------------------------------- large losses


@pytest.mark.parametrize("eps,delta", [(0.5, 0.0), (3.3, 1e-6), (709.0, 0.0), (709.78, 1e-7)])
def test_privacy_parameters_pld_is_dp_accountings_where_it_has_one(eps, delta):
  interval = max(1e-4, eps / 5e5)
  ref = dpa.pld.privacy_loss_distribution.from_privacy_parameters(
      dpa.pld.common.DifferentialPrivacyParameters(eps, delta), interval)
  assert _same_pld(_dpa_pld.pld_from_privacy_parameters(eps, delta, interval), ref)


@pytest.mark.parametrize("eps,delta", [(710.0, 0.0), (720.0, 1e-7), (1e6, 0.0), (1e6, 1e-7)])
def test_privacy_parameters_pld_beyond_exp_has_the_dominating_pairs_masses(eps, delta):
  interval = max(1e-4, eps / 5e5)
  with pytest.raises(OverflowError):  # dp-accounting evaluates e^eps
    dpa.pld.privacy_loss_distribution.from_privacy_parameters(
        dpa.pld.common.DifferentialPrivacyParameters(eps, delta), interval)
  pmf = _dpa_pld.pld_pmfs(_dpa_pld.pld_from_privacy_parameters(eps, delta, interval))[0]
  tiny = math.exp(-eps)
  want = {math.ceil(eps / interval): (1 - delta) / (1 + tiny)}
  if tiny > 0:
    want[math.ceil(-eps / interval)] = (1 - delta) * tiny / (1 + tiny)
  assert pmf._loss_probs == want and pmf._infinity_mass == delta  # pylint: disable=protected-access


def test_sparse_suffix_table_equals_dp_accountings_scalar_delta():
  # dp-accounting keeps PMFs of at most 1000 atoms sparse (a dict); _dpa_pld.pmf_table
  # reads that dict too. Its vectorised delta gives -inf past exp's range.
  pld = _dpa_pld.pld_from_privacy_parameters(1.3, 1e-4, 1e-3).compose(
      _dpa_pld.pld_from_privacy_parameters(0.4, 0.0, 1e-3))
  huge = _dpa_pld.pld_from_privacy_parameters(720.0, 0.0, 1e-3)
  for p, grid in ((pld, np.linspace(-0.5, 2.0, 26)), (huge, np.array([0.0, 5.0, 714.0, 719.99]))):
    pmf = _dpa_pld.pld_pmfs(p)[0]
    assert hasattr(pmf, "_loss_probs"), "dp-accounting internals changed: small PMFs are not sparse"
    table = _dpa_pld.pmf_table(pmf)
    for eps in grid:
      ref = float(p.get_delta_for_epsilon(float(eps)))  # the scalar path: -expm1, no overflow
      ours = float(_dpa_pld.suffix_delta(table, np.array([eps]))[0])
      assert ours == pytest.approx(ref, abs=1e-15, rel=1e-12) and ours >= ref - 1e-16, eps
  with np.errstate(over="ignore"):
    assert p.get_delta_for_epsilon(np.array([714.0]))[0] == -np.inf  # why the table is needed


def test_laplace_beyond_exps_range_gets_its_randomized_response_pair():
  # dp-accounting's own Laplace PLD moves the mass at loss 1/b to +inf from 1/b ~ 710 on.
  with np.errstate(over="ignore"):
    ref = dpa.pld.PLDAccountant(value_discretization_interval=0.02).compose(dpa.LaplaceDpEvent(1e-3))
    assert ref.get_epsilon(1e-5) == math.inf
  pld, _ = _dpa_pld.pld_of_event(dpa.LaplaceDpEvent(1e-3), 0.02)
  assert _same_pld(pld, _dpa_pld.pld_from_privacy_parameters(1e3, 0.0, 0.02))
  assert 1e3 - 2e-5 <= pld.get_epsilon_for_delta(1e-5) <= 1e3
  # Below LAPLACE_MAX_LOSS: dp-accounting's Laplace PLD, bit for bit.
  below, _ = _dpa_pld.pld_of_event(dpa.LaplaceDpEvent(1 / 650), 0.01)
  ref = dpa.pld.PLDAccountant(value_discretization_interval=0.01).compose(dpa.LaplaceDpEvent(1 / 650))
  assert _same_pld(below, ref._pld)  # pylint: disable=protected-access


# ----------------------------------------------------------------------------- faster, bit for bit
# `poisson_gaussian_rdp` and `compose_plds` replace dp-accounting's Python loops
# with numpy that performs the same floating-point operations in the same order:
# every number must be dp-accounting's exactly (not approximately).

_RDP = dpa.rdp.rdp_privacy_accountant


@pytest.mark.parametrize("q", [1e-4, 256 / 60000, 0.16, 0.5, 0.99])
@pytest.mark.parametrize("sigma", [0.3, 1.0, 2.7040846420396387, 50.0])
def test_poisson_gaussian_rdp_is_dp_accountings_bit_for_bit(q, sigma):
  # dp-accounting's default grid (fractional 1.1..10.9, integers up to 1024) and
  # orders off it (near 1, large fractional).
  for orders in (np.array(_dpa.DEFAULT_ORDERS), np.array([1.01, 1.5, 2.25, 3.7, 12.5, 33.3, 100.5, 200.0])):
    ref = _RDP._compute_rdp_poisson_subsampled_gaussian(q, sigma, orders)  # pylint: disable=protected-access
    ours = _dpa._compute_poisson_gaussian_rdp(q, sigma, orders)  # pylint: disable=protected-access
    assert ours.dtype == ref.dtype and np.array_equal(ours, ref), np.flatnonzero(ours != ref)


def test_poisson_gaussian_rdp_edges_and_cache_are_dp_accountings():
  orders = np.array([1.5, 2.0, 32.0, np.inf])
  for q, sigma in [(0.0, 1.0), (1.0, 1.0), (0.1, 0.0), (0.1, 1.0)]:  # dp-accounting's own branches
    ref = _RDP._compute_rdp_poisson_subsampled_gaussian(q, sigma, orders)  # pylint: disable=protected-access
    assert np.array_equal(_dpa.poisson_gaussian_rdp(q, sigma, orders), ref)
  first = _dpa.poisson_gaussian_rdp(0.16, 2.0, _dpa.DEFAULT_ORDERS)
  first[0] = -1.0  # a copy: callers cannot spoil the cache
  ref = _RDP._compute_rdp_poisson_subsampled_gaussian(  # pylint: disable=protected-access
      0.16, 2.0, np.array(_dpa.DEFAULT_ORDERS))
  assert np.array_equal(_dpa.poisson_gaussian_rdp(0.16, 2.0, _dpa.DEFAULT_ORDERS), ref)
  # Through the RDP accountant jaxdp composes with: a whole DP-SGD run and a composition.
  for event in (EVENTS["dpsgd"], dpa.ComposedDpEvent([EVENTS["dpsgd"], dpa.GaussianDpEvent(5.0)])):
    _dpa.clear_caches()
    ref = dpa.rdp.RdpAccountant().compose(event)._rdp  # pylint: disable=protected-access
    assert np.array_equal(_dpa.dp_event_rdp(event, _dpa.DEFAULT_ORDERS), ref)


def _assert_same_pld(ours, ref):
  assert ours._symmetric == ref._symmetric  # pylint: disable=protected-access
  for a, b in zip(_dpa_pld.pld_pmf_pair(ours), _dpa_pld.pld_pmf_pair(ref)):
    assert type(a) is type(b) and a._infinity_mass == b._infinity_mass  # pylint: disable=protected-access
    if hasattr(b, "_probs"):
      assert a._lower_loss == b._lower_loss and np.array_equal(a._probs, b._probs)  # pylint: disable=protected-access
    else:
      assert a._loss_probs == b._loss_probs  # pylint: disable=protected-access


def test_compose_plds_is_dp_accountings_bit_for_bit():
  pld_lib = dpa.pld.privacy_loss_distribution
  run = pld_lib.from_gaussian_mechanism(1.0, sampling_prob=0.16, value_discretization_interval=1e-3).self_compose(20)
  gauss = pld_lib.from_gaussian_mechanism(5.0, value_discretization_interval=1e-3)  # symmetric
  pure = pld_lib.from_privacy_parameters(dpa.pld.common.DifferentialPrivacyParameters(1.0, 1e-6), 1e-3)  # sparse
  identity = pld_lib.identity(1e-3)
  for a, b in [(run, gauss), (gauss, run), (run, run), (gauss, gauss), (run, pure), (pure, pure), (identity, run)]:
    for tail in (_dpa_pld.COMPOSE_TAIL_MASS, 0.0, 1e-8):
      _assert_same_pld(_dpa_pld.compose_plds(a, b, tail), a.compose(b, tail))
  optimistic = pld_lib.from_gaussian_mechanism(1.0, sampling_prob=0.16, pessimistic_estimate=False,
                                               value_discretization_interval=1e-3)
  _assert_same_pld(_dpa_pld.compose_plds(optimistic, optimistic), optimistic.compose(optimistic))


def test_truncation_prefix_is_dp_accountings_sum_from_the_left():
  rng = np.random.default_rng(0)
  for size in (0, 1, 5, 1023, 1024, 1025, 5000):
    arr = rng.exponential(size=size) * 10.0 ** rng.uniform(-20, -14, size=size)
    for threshold in (0.0, 1e-16, 5e-16, 1e-14, 1.0):
      s, ref = 0, size
      for i, val in enumerate(arr):  # dp-accounting's _find_prefix_to_truncate
        s += val
        if s > threshold:
          ref = i
          break
      assert _dpa_pld._truncation_prefix(arr, threshold) == ref  # pylint: disable=protected-access


def test_pmf_delta_lower_is_dp_accountings_value():
  pld = dpa.pld.privacy_loss_distribution.from_gaussian_mechanism(
      1.0, sampling_prob=0.16, value_discretization_interval=1e-3).self_compose(20)
  for pmf in _dpa_pld.pld_pmf_pair(pld):
    for eps in (-1.0, 0.0, 0.5, 1.0, 2.0, 3.0 + 1e-7, 50.0):
      assert _dpa_pld.pmf_delta_lower(pmf, eps) == pytest.approx(float(pmf.get_delta_for_epsilon(eps)),
                                                                 rel=1e-12)
