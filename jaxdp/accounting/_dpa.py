"""The one adapter to dp-accounting internals.

jaxdp reads a few private attributes of dp-accounting's PLD classes (the dense
PMF arrays, to evaluate hockey-stick curves vectorised, and the PLD an
accountant built). They are read here and nowhere else, under the version
range pinned in pyproject.toml; `tests/accounting/test_dpa_adapter.py` fails
loudly if a new dp-accounting release moves them.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Mapping, Optional, Sequence

import dp_accounting as dpa
import numpy as np

from jaxdp.accounting import events

_rdp = dpa.rdp.rdp_privacy_accountant
_PLD = dpa.pld.privacy_loss_distribution

class _DroppedOrderFilter(logging.Filter):
  """Silences dp-accounting's "failed to converge ... Excluding this order".

  Its RDP accountant drops a fractional order whose series does not converge
  (large q, small alpha) and minimises over the remaining ones: the epsilon is
  still a valid upper bound, only possibly a little looser. Calibration
  evaluates hundreds of such events, and one warning per order and event
  buried the output users need.
  """

  def filter(self, record: logging.LogRecord) -> bool:
    return "Excluding this order from the epsilon computation" not in record.getMessage()


logging.getLogger("absl").addFilter(_DroppedOrderFilter())

#: dp-accounting's default order grid: 1.1..10.9 step 0.1, 11..63, 128..1024.
DEFAULT_ORDERS: tuple = tuple(float(o) for o in _rdp.DEFAULT_RDP_ORDERS)


#: Smallest RDP value handed to dp-accounting's conversions: its KL branch takes
#: log1p(-exp(-r)), which is log(0) ("math domain error") once exp(-r) rounds to
#: 1 (r below ~1e-16). Raising a bound only weakens it, so this stays valid.
_RDP_FLOOR = 1e-15


def rdp_to_epsilon(orders: np.ndarray, rdp: np.ndarray, delta: float) -> float:
  """dp-accounting's RDP -> (eps, delta) conversion (Canonne-Kamath-Steinke + KL bound)."""
  safe = np.maximum(np.asarray(rdp, dtype=np.float64), _RDP_FLOOR)
  return float(_rdp.compute_epsilon(np.asarray(orders, dtype=np.float64), safe, delta)[0])


def rdp_to_delta(orders: np.ndarray, rdp: np.ndarray, epsilon: float) -> float:
  """dp-accounting's RDP -> delta conversion (guarded as `rdp_to_epsilon`)."""
  safe = np.maximum(np.asarray(rdp, dtype=np.float64), _RDP_FLOOR)
  return float(_rdp.compute_delta(np.asarray(orders, dtype=np.float64), safe, epsilon)[0])


def dp_event_rdp(event: dpa.DpEvent, orders: Sequence[float]) -> Optional[np.ndarray]:
  """RDP of a dp-accounting event by its RdpAccountant, or None if unsupported."""
  orders = tuple(float(o) for o in orders)
  try:
    out = _cached_rdp(event, orders)
  except TypeError:  # unhashable (a ComposedDpEvent holds a list)
    out = _rdp_of(event, orders)
  return None if out is None else out.copy()


def _rdp_of(event, orders: tuple) -> Optional[np.ndarray]:
  accountant = dpa.rdp.RdpAccountant(list(orders))
  if not accountant.supports(event):
    return None
  accountant.compose(event)
  return np.asarray(accountant._rdp, dtype=np.float64)  # pylint: disable=protected-access


# Keyed by value (events are frozen value objects): searches ask for the same
# base's curve many times, and subsampled-Gaussian RDP costs ~30 ms a call.
_cached_rdp = functools.lru_cache(maxsize=256)(_rdp_of)


def pld_supports(event: dpa.DpEvent) -> bool:
  return dpa.pld.PLDAccountant().supports(event)


def pld_of_event(event: dpa.DpEvent, interval: float):
  """(PLD, contains_non_private) of a dp-accounting event by its PLDAccountant.

  Raises:
    NotApplicableError: dp-accounting overflowed building the PLD (a
      component with a huge privacy loss, e.g. a Gaussian with sigma 0.05):
      `best` then uses the methods that can, and an explicit method says why.
  """
  accountant = dpa.pld.PLDAccountant(value_discretization_interval=interval)
  try:
    accountant.compose(event)
  except OverflowError as err:
    raise events.NotApplicableError(
        f"dp-accounting's PLD overflows on this event ({err}); its privacy loss is too large for a "
        "PLD discretisation. Use method 'rdp' (or 'best', which falls back to it)") from None
  return accountant._pld, bool(accountant._contains_non_dp_event)  # pylint: disable=protected-access


def pld_from_losses(loss_probs: Mapping[float, float], infinity_mass: float, interval: float):
  """A symmetric, pessimistic PLD with mass p at privacy loss l (losses rounded up).

  Rounding a loss up only moves mass to larger losses, which increases every
  hockey-stick divergence of the PLD and of its compositions: pessimistic.
  """
  rounded: dict = {}
  for loss, prob in loss_probs.items():
    if prob <= 0.0:
      continue
    idx = int(math.ceil(loss / interval))
    rounded[idx] = rounded.get(idx, 0.0) + float(prob)
  return _PLD.PrivacyLossDistribution.create_from_rounded_probability(
      rounded, float(infinity_mass), interval, pessimistic_estimate=True)


def pld_identity(interval: float):
  return _PLD.identity(value_discretization_interval=interval)


def pld_pmfs(pld) -> list:
  """The PMFs of a PLD whose hockey-stick curves bound the two neighbouring orders."""
  if pld._symmetric:  # pylint: disable=protected-access
    return [pld._pmf_remove]  # pylint: disable=protected-access
  return [pld._pmf_remove, pld._pmf_add]  # pylint: disable=protected-access


def pmf_table(pmf):
  """(losses, U, log W, inf_mass) of a dense PMF: U[i] = sum_{j>=i} p_j,
  W[i] = sum_{j>=i} p_j e^-L_j (kept as a log: losses reach the thousands,
  where e^-L underflows and e^eps overflows); None for a sparse PMF."""
  if not hasattr(pmf, "_probs"):
    return None
  probs = np.asarray(pmf._probs, dtype=np.float64)  # pylint: disable=protected-access
  losses = (np.arange(probs.size) + pmf._lower_loss) * pmf._discretization  # pylint: disable=protected-access
  probs = np.maximum(probs, 0.0)  # FFT round-off can leave tiny negative masses
  with np.errstate(divide="ignore"):
    log_w = np.log(probs) - losses
  # Reverse cumulative sums add the small tail terms first.
  upper = np.append(np.cumsum(probs[::-1])[::-1], 0.0)
  log_lower = np.append(np.logaddexp.accumulate(log_w[::-1])[::-1], -np.inf)
  return losses, upper, log_lower, float(pmf._infinity_mass)  # pylint: disable=protected-access


def suffix_delta(table, eps):
  """Hockey-stick values of a `pmf_table` at the (array) eps, rounded up.

  inf_mass + sum_{L > eps} p_L (1 - e^(eps - L)) = inf_mass + U[i] - e^(eps + log W[i])
  with i the first atom with L > eps (so e^(eps + log W[i]) <= U[i]: no overflow).
  """
  losses, upper, log_lower, inf_mass = table
  eps = np.asarray(eps, dtype=np.float64)
  idx = np.searchsorted(losses, eps, side="right")
  with np.errstate(invalid="ignore"):
    sub = np.exp(np.where(np.isinf(eps), -np.inf, eps + log_lower[idx]))
  val = inf_mass + upper[idx] - sub
  # The subtraction (and logaddexp's rounding, ~1e-16 relative per atom over
  # up to ~1e7 atoms) loses at most ~1e-9 of upper[idx]; add more back so
  # rounding can never make the value optimistic.
  return np.maximum(val, 0.0) + (8.0 * np.finfo(np.float64).eps + 4e-16 * losses.size ** 0.5) * upper[idx]


def pld_delta(pld, epsilon: float) -> float:
  """dp-accounting's own hockey-stick value of a PLD (its scalar path)."""
  return float(pld.get_delta_for_epsilon(epsilon))


def pld_epsilon(pld, delta: float) -> float:
  """dp-accounting's own inverse of a PLD's hockey-stick curve."""
  return float(pld.get_epsilon_for_delta(delta))


#: Smallest delta at which a PLD's hockey-stick value is trusted.
#:
#: Composed PLDs come from FFTs whose float64 round-off (absolute, ~1e-16
#: times the support size) and dp-accounting's tail truncation (inf mass
#: ~1.5e-15) swamp the true tail at small delta. Measured with dp-accounting
#: 0.6.0, eps(delta) at discretisations 2e-4 / 1e-4 / 5e-5 against RDP or
#: the exact answer:
#:   * DP-SGD q=256/60000, sigma=1.1, T=14063: 1e-10: 3.7367/3.7364/3.7361
#:     (monotone, RDP 3.925); 1e-11: 3.9625/3.9626/3.9607 (not monotone);
#:     1e-12: 5.694/4.199/4.176; 1e-13: 7.22/7.04/4.38 (RDP 4.60); <=1e-15 inf.
#:   * DP-SGD q=0.01, sigma=1.0, T=1000: 1e-9: 2.98961/2.98959/2.98959;
#:     1e-10: 3.29045/3.29046/3.29049 (not monotone); 1e-12: 3.913/3.916/3.918;
#:     1e-13: 6.72/4.25/6.95 (RDP 4.66).
#:   * Gaussian sigma=2 composed 100 times (exactly Gaussian, mu = 5):
#:     equal to the exact eps to 5 decimals down to 1e-12; 1e-13 +4e-5,
#:     1e-14 +1.7e-3, 1e-15 +0.08; <=1e-16 inf.
#: Round-off shows first at 1e-10 (q=0.01); the floor keeps a factor 10 above it.
PLD_DELTA_FLOOR = 1e-9

#: The finest discretisation `pld_interval_for` picks (dp-accounting's default).
PLD_FINEST_INTERVAL = 1e-4


def pld_interval_for(event: dpa.DpEvent, finest: float = PLD_FINEST_INTERVAL) -> float:
  """A PLD discretisation for `event` that keeps its PLD at ~2e5 atoms.

  The composed PLD spans a privacy-loss range that grows with epsilon, so the
  number of atoms is ~range / interval. The RDP epsilon at delta = 1e-10 (a
  cheap upper bound of the loss range that matters) over 5e5 keeps that
  number near the size of DP-SGD on MNIST at 1e-4. A coarser discretisation
  is still pessimistic, only looser: for q = 0.5, sigma = 0.3, T = 1000
  (eps ~ 2696) 1e-4 took 24 s to compose (1.7e7 atoms), 0.011 takes 0.3 s,
  and eps(1e-5) moves from 2696.3205 to 2696.330. Events the RDP accountant
  does not support get `finest`.
  """
  accountant = dpa.rdp.RdpAccountant()
  if not accountant.supports(event):
    return finest
  accountant.compose(event)
  eps = accountant.get_epsilon(1e-10)
  if not math.isfinite(eps):
    return finest
  return max(finest, eps / 5e5)
