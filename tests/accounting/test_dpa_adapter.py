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
  tables = [_dpa.pmf_table(p) for p in _dpa.pld_pmfs(pld)]
  assert all(t is not None for t in tables), "dp-accounting internals changed: PMF not dense"
  for eps in np.linspace(-0.5, 4.0, 19):
    ours = float(np.max([_dpa.suffix_delta(t, np.array([eps]))[0] for t in tables]))
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
  assert _dpa.pld_interval_for(EVENTS["dpsgd"]) == _dpa.PLD_FINEST_INTERVAL
  big = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.5, dpa.GaussianDpEvent(0.3)), 1000)
  assert 5e-3 < _dpa.pld_interval_for(big) < 2e-2
  assert _dpa.pld_interval_for(dpa.UnsupportedDpEvent()) == _dpa.PLD_FINEST_INTERVAL


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
