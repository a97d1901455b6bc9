"""The adapter to dp-accounting's RDP internals (the PLD side is `jaxdp.accounting._dpa_pld`).

jaxdp reads a few private attributes of dp-accounting's PLD classes (the dense
PMF arrays, to evaluate hockey-stick curves vectorised, and the PLD an
accountant built), and builds Gaussian PLDs through dp-accounting's private
construction with one loop vectorised (`_GaussianPrivacyLoss`). Two more of
dp-accounting's Python loops are replaced here by numpy doing the same
floating-point operations in the same order: the subsampled Gaussian's RDP
(`poisson_gaussian_rdp`) and the tail truncation of a PLD composition
(`compose_plds`); their numbers are dp-accounting's bit for bit. They are used
here and nowhere else, under the version range pinned in pyproject.toml;
`tests/accounting/test_dpa.py` fails loudly if a new dp-accounting
release moves them or changes a number.

Caches (all keyed by value, bounded, and only of deterministic functions of
their key, so a hit returns exactly what a miss would compute):
  * `dp_event_rdp`: an event's RDP curve, by (event, orders);
  * `poisson_gaussian_rdp`: one Poisson-subsampled Gaussian step's RDP curve,
    by (q, sigma, orders), shared by every event that contains the step;
  (the PLDs' are `jaxdp.accounting._dpa_pld`'s).
Other modules keep theirs in `LruCache`s too (the profile accountant's
profiles, Lemma 7's q_max); `clear_caches()` empties them all (tests compare
cached and uncached numbers).
"""

from __future__ import annotations

import logging
import math
from typing import Optional, Sequence

import dp_accounting as dpa
import numpy as np
from scipy import special

from jaxdp._cache import LruCache, clear_caches  # noqa: F401 (clear_caches: re-exported)
from jaxdp.accounting.events import event_key  # the key of every cache below

_rdp = dpa.rdp.rdp_privacy_accountant
_PLD = dpa.pld.privacy_loss_distribution
_PLM = dpa.pld.privacy_loss_mechanism
_PMF = dpa.pld.pld_pmf
_ADD_REMOVE = dpa.NeighboringRelation.ADD_OR_REMOVE_ONE
_gammaln, _log_ndtr = special.gammaln, special.log_ndtr

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

#: Largest x with math.exp(x) finite (~709.78): e^eps of a larger privacy loss overflows.
MAX_EXP_ARG = math.log(np.finfo(np.float64).max)

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


def rdp_to_deltas(orders: np.ndarray, rdp: np.ndarray, epsilons: np.ndarray) -> np.ndarray:
  """`rdp_to_delta` at many epsilons (each >= 0), equal to it bit for bit (see `RdpDeltas`)."""
  return RdpDeltas(orders, rdp)(epsilons)


class RdpDeltas:
  """eps -> `rdp_to_delta(orders, rdp, eps)` for one curve, vectorised over eps, bit for bit.

  dp-accounting's `compute_delta` loops over the orders per epsilon in Python.
  Per order, the KL term and the constants log1p(-1/a), log(a) do not depend
  on epsilon: they are computed once, with the same `math` calls. Only
  (a - 1) * ((r - eps) + log1p(-1/a)) - log(a) (IEEE +, -, *: numpy rounds
  them as Python does), the min (Python's `min(kl, bound)` keeps kl unless
  bound is smaller) and `np.argmin` are vectorised, and the final exp is
  again `math.exp`: every value is exactly `rdp_to_delta`'s.
  """

  def __init__(self, orders: np.ndarray, rdp: np.ndarray):
    self.orders = np.asarray(orders, dtype=np.float64)
    self.rdp = np.maximum(np.asarray(rdp, dtype=np.float64), _RDP_FLOOR)
    if np.any(self.orders < 1) or self.orders.shape != self.rdp.shape:
      raise ValueError("RdpDeltas: orders must be >= 1, one RDP value per order")
    # dp-accounting's per-order KL term; rdp > 0 (the floor), so never its r <= 0 branches.
    self._kl = np.array([0.5 * math.log1p(-math.exp(-r)) for r in self.rdp.tolist()])
    self._ckb = self.orders > 1.01
    pairs = list(zip(self.orders.tolist(), self._ckb.tolist()))
    self._log1p_inv = np.array([math.log1p(-1 / a) if use else 0.0 for a, use in pairs])
    self._log_a = np.array([math.log(a) if use else 0.0 for a, use in pairs])

  def __call__(self, epsilons) -> np.ndarray:
    eps = np.asarray(epsilons, dtype=np.float64).reshape(-1)
    if eps.size == 0:
      return np.zeros(0)
    if np.any(eps < 0):
      raise ValueError(f"epsilons must be >= 0, got {eps[eps < 0][0]!r}")
    with np.errstate(invalid="ignore", over="ignore"):
      bound = (self.orders - 1) * ((self.rdp[None, :] - eps[:, None]) + self._log1p_inv) - self._log_a
    log_deltas = np.where(self._ckb & (bound < self._kl), bound, self._kl)
    best = log_deltas[np.arange(eps.size), np.argmin(log_deltas, axis=1)]
    return np.array([min(math.exp(v), 1.0) for v in best.tolist()])


def dp_event_rdp(event: dpa.DpEvent, orders: Sequence[float]) -> Optional[np.ndarray]:
  """RDP of a dp-accounting event by its RdpAccountant, or None if unsupported."""
  orders = tuple(float(o) for o in orders)
  key = event_key(event)
  key = None if key is None else (key, orders)
  out = None if key is None else _rdp_cache.get(key)
  if out is None:
    out = _rdp_of(event, orders)
    if key is not None:
      _rdp_cache.put(key, out)
  return None if out is None else out.copy()


def _rdp_of(event, orders: tuple) -> Optional[np.ndarray]:
  accountant = _RdpAccountant(list(orders))
  if not accountant.supports(event):
    return None
  accountant.compose(event)
  return np.asarray(accountant._rdp, dtype=np.float64)  # pylint: disable=protected-access


class _RdpAccountant(dpa.rdp.RdpAccountant):
  """dp-accounting's RdpAccountant, taking a Poisson-subsampled Gaussian's curve from
  `poisson_gaussian_rdp` (the same numbers, bit for bit, computed faster and cached).

  Only `PoissonSampledDpEvent(q, GaussianDpEvent(sigma))` under add/remove-one
  takes that path, with dp-accounting's own arithmetic around it
  (`self._rdp += count * curve`); every other event is dp-accounting's.
  """

  def _maybe_compose(self, event, count, do_compose):
    if (do_compose and isinstance(event, dpa.PoissonSampledDpEvent)
        and type(event.event) is dpa.GaussianDpEvent  # pylint: disable=unidiomatic-typecheck
        and self._neighboring_relation == _ADD_REMOVE):  # pylint: disable=protected-access
      self._rdp += count * poisson_gaussian_rdp(event.sampling_probability, event.event.noise_multiplier,
                                                self._orders)
      return None
    return super()._maybe_compose(event, count, do_compose)


# ----------------------------------------------------------------------------- subsampled Gaussian RDP
#
# dp-accounting's `_compute_rdp_poisson_subsampled_gaussian` sums, per order, a
# series in Python: three scalar `gammaln` calls and one `log_ndtr` per term,
# ~1 µs each, ~50 ms for its default orders at q = 0.16. `poisson_gaussian_rdp`
# computes the terms of each series as numpy arrays with the same operations
# in the same order (scipy's `gammaln` and `log_ndtr` are ufuncs: a 0-d and
# an n-d input run the same float64 loop; +, -, *, / are IEEE-rounded alike
# in numpy and Python), and only the running log-sum and the stopping test,
# which are sequential, stay a Python loop over Python floats (dp-accounting's
# `_log_add` inlined: the same comparisons and `math` calls). So every value
# is dp-accounting's bit for bit (test_dpa.py checks a grid of rates,
# noises and orders), ~5x faster. Anything off the common path (q = 0 or 1, sigma = 0, an
# infinite order, a fractional series that does not converge) is
# dp-accounting's own function.

#: Terms of a fractional order's series computed at once (most stop within 64).
_FRAC_CHUNK = 64


def _log_a_int(q: float, sigma: float, alpha: int) -> float:
  """dp-accounting's `_compute_log_a_int(q, sigma, alpha)`, its terms vectorised."""
  log1mq = math.log1p(-q)
  i = np.arange(alpha + 1, dtype=np.int64)
  log_coef = _gammaln(alpha + 1) - _gammaln(i + 1) - _gammaln(alpha - i + 1)  # _log_comb(alpha, i)
  terms = log_coef + i * math.log(q) + (alpha - i) * log1mq + (i * i - i) / (2 * (sigma**2))
  log_a = -np.inf
  log1p, exp, inf = math.log1p, math.exp, -np.inf
  for s in terms.tolist():
    # _log_add(log_a, s) inlined (min and max as the builtins compare)
    a, b = (s if s < log_a else log_a), (s if s > log_a else log_a)
    log_a = b if a == inf else log1p(exp(a - b)) + b
  return log_a


def _log_a_frac(q: float, sigma: float, alpha: float) -> float:
  """dp-accounting's `_compute_log_a_frac(q, sigma, alpha)`, its terms vectorised in chunks."""
  log1p, exp, inf = math.log1p, math.exp, -np.inf
  log_a0, log_a1 = -np.inf, -np.inf
  z0 = sigma**2 * math.log(1 / q - 1) + 0.5
  log1mq = math.log1p(-q)
  log_q, denom, scale = math.log(q), 2 * (sigma**2), math.sqrt(2) * sigma
  log_half, log_two, root_two = math.log(0.5), math.log(2), 2**0.5
  gamma_alpha = _gammaln(alpha + 1)
  last_s0 = last_s1 = -np.inf
  steps = _rdp._MAX_STEPS_LOG_A_FRAC  # pylint: disable=protected-access
  for start in range(0, steps, _FRAC_CHUNK):
    i = np.arange(start, min(start + _FRAC_CHUNK, steps), dtype=np.int64)
    log_coef = gamma_alpha - _gammaln(i + 1) - _gammaln(alpha - i + 1)  # _log_comb(alpha, i)
    j = alpha - i
    log_t0 = log_coef + i * log_q + j * log1mq
    log_t1 = log_coef + j * log_q + i * log1mq
    # log(0.5) + _log_erfc(x), _log_erfc(x) = log(2) + log_ndtr(-x * 2**0.5)
    log_e0 = log_half + (log_two + _log_ndtr(-((i - z0) / scale) * root_two))
    log_e1 = log_half + (log_two + _log_ndtr(-((z0 - j) / scale) * root_two))
    log_s0s = (log_t0 + (i * i - i) / denom + log_e0).tolist()
    log_s1s = (log_t1 + (j * j - j) / denom + log_e1).tolist()
    for log_s0, log_s1 in zip(log_s0s, log_s1s):
      # log_a0 = _log_add(log_a0, log_s0), log_a1 = _log_add(log_a1, log_s1),
      # total = _log_add(log_a0, log_a1), inlined (min and max as the builtins compare)
      a, b = (log_s0 if log_s0 < log_a0 else log_a0), (log_s0 if log_s0 > log_a0 else log_a0)
      log_a0 = b if a == inf else log1p(exp(a - b)) + b
      a, b = (log_s1 if log_s1 < log_a1 else log_a1), (log_s1 if log_s1 > log_a1 else log_a1)
      log_a1 = b if a == inf else log1p(exp(a - b)) + b
      a, b = (log_a1 if log_a1 < log_a0 else log_a0), (log_a1 if log_a1 > log_a0 else log_a0)
      total = b if a == inf else log1p(exp(a - b)) + b
      if log_s0 < last_s0 and log_s1 < last_s1 and max(log_s0, log_s1) < total - 30:
        return total
      last_s0, last_s1 = log_s0, log_s1
  # No convergence: dp-accounting's own function (it warns and drops the order).
  return _rdp._compute_log_a_frac(q, sigma, alpha)  # pylint: disable=protected-access


def _compute_poisson_gaussian_rdp(q: float, sigma: float, orders: np.ndarray) -> np.ndarray:
  if not (0.0 < q < 1.0 and sigma > 0.0 and np.all(np.isfinite(orders))):
    return _rdp._compute_rdp_poisson_subsampled_gaussian(q, sigma, orders)  # pylint: disable=protected-access
  out = []
  for alpha in orders:  # numpy scalars, as dp-accounting's `compute_one_order` gets them
    if float(alpha).is_integer():
      log_a = _log_a_int(q, sigma, int(alpha))
    else:
      log_a = _log_a_frac(q, sigma, alpha)
    out.append(log_a / (alpha - 1))
  return np.array(out)


def poisson_gaussian_rdp(q: float, sigma: float, orders: Sequence[float]) -> np.ndarray:
  """dp-accounting's `_compute_rdp_poisson_subsampled_gaussian(q, sigma, orders)`, bit for bit.

  Faster (see above) and cached by (q, sigma, orders): every accountant of a
  search asks for the curve of the same DP-SGD step (the RDP methods, the
  profile and PLD methods' discretisation), inside different events.
  """
  orders = np.array(orders)
  key = (float(q), float(sigma), orders.dtype.str, orders.tobytes())
  found = _subsampled_cache.get(key)
  if found is None:
    found = _compute_poisson_gaussian_rdp(q, sigma, orders)
    _subsampled_cache.put(key, found)
  return found.copy()


_subsampled_cache = LruCache(256)


# Keyed by value (`event_key`): searches ask for the same base's curve many
# times, and subsampled-Gaussian RDP costs ~15 ms a call. A curve is ~1 KB.
# (An unsupported event's None is not cached: it is recomputed, which only
# costs time.)
_rdp_cache = LruCache(256)
