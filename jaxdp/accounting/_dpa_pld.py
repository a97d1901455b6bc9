"""The adapter to dp-accounting's PLD internals (the RDP side is `jaxdp.accounting._dpa`).

jaxdp reads a few private attributes of dp-accounting's PLD classes (the dense
PMF arrays, to evaluate hockey-stick curves vectorised, and the PLD an
accountant built), builds Gaussian PLDs through dp-accounting's private
construction with one loop vectorised (`_GaussianPrivacyLoss`), and replaces
the tail truncation of a PLD composition (`compose_plds`) by numpy doing the
same floating-point operations in the same order: its numbers are
dp-accounting's bit for bit. Used here and nowhere else, under the version
range pinned in pyproject.toml; `tests/accounting/test_dpa.py` fails
loudly if a new dp-accounting release moves them or changes a number.

Caches (keyed by value, bounded, of deterministic functions of their key):
  * `pld_of_event`: an event's composed PLD, by (event, discretisation), at
    most `_PLD_CACHE_ENTRIES` PLDs and `_PLD_CACHE_BYTES` of PMF arrays;
  * `_gaussian_step_pld`: one (subsampled) Gaussian step's PLD, by (sigma, q,
    discretisation), at most 32 and 128 MB: k-fold compositions of one DP-SGD
    step (`Fixed(k)`, the PLD mixture's base) then differ only in the FFT
    self-composition.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from typing import Mapping

import dp_accounting as dpa
import numpy as np
from scipy import signal, special

from jaxdp._cache import LruCache
from jaxdp.accounting import events
from jaxdp.accounting._dpa import DEFAULT_ORDERS, MAX_EXP_ARG, _rdp, dp_event_rdp
from jaxdp.accounting.events import event_key  # the key of every cache below

_PLD = dpa.pld.privacy_loss_distribution
_PLM = dpa.pld.privacy_loss_mechanism
_PMF = dpa.pld.pld_pmf
_ADD_REMOVE = dpa.NeighboringRelation.ADD_OR_REMOVE_ONE
_log_ndtr = special.log_ndtr


def pld_supports(event: dpa.DpEvent) -> bool:
  return dpa.pld.PLDAccountant().supports(event)




class _GaussianPrivacyLoss(_PLM.GaussianPrivacyLoss):
  """dp-accounting's Gaussian privacy loss with `get_delta_for_epsilon` vectorised.

  dp-accounting's connect-the-dots construction asks for the hockey-stick
  value at every point of its loss grid (~56,000 for one DP-SGD step at 1e-4)
  and inverts the privacy loss there one point at a time in Python: ~0.15 s
  of the ~0.2 s a step's PLD takes. Here the inverse runs on the whole array
  with the same operations in the same order (`common.log_a_times_exp_b_plus_c`
  and `_inverse_privacy_loss_*`, elementwise numpy ufuncs on float64, which
  give a 0-d and an n-d input the same bits), and every point on one of
  dp-accounting's special branches (near the asymptote -log(1-q) where it uses
  math.isclose, where it raises, b = 0) goes through its own scalar method.
  So the PMF is dp-accounting's bit for bit; test_dpa.py checks it.
  """

  def _inverse_privacy_losses(self, epsilons: np.ndarray) -> np.ndarray:
    eps = np.asarray(epsilons, dtype=np.float64)
    kind, q, sens = self.adjacency_type, self.sampling_prob, self.sensitivity
    var = self._standard_deviation**2
    add = _PLM.AdjacencyType.ADD
    if kind not in (add, _PLM.AdjacencyType.REMOVE):
      return np.array([self.inverse_privacy_loss(e) for e in eps])
    special = ~np.isfinite(eps)
    if q == 1.0:
      loss = eps
    else:
      # log_a_times_exp_b_plus_c(1/q, b, 1 - 1/q), a > 0 > c: _log_sub(b + log a, log(-c)).
      a, c = 1 / q, 1 - 1 / q
      log_a, log_minus_c = np.log(a), np.log(-c)
      b = -eps if kind == add else eps
      d = b + log_a
      with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        loss = d + np.log1p(-np.exp(log_minus_c - d))
      if kind == add:
        loss = -loss
      # dp-accounting's branches: |eps - log-asymptote| small (math.isclose,
      # rel 1e-9; a wider net only sends more points to its own code), eps
      # beyond the asymptote (it raises), b == 0, and d <= log(-c) (raises).
      edge = -math.log(1 - q) if kind == add else math.log(1 - q)
      special |= np.abs(eps - edge) <= 1e-8 * abs(edge)
      special |= (eps > edge) if kind == add else (eps <= edge)
      special |= (b == 0) | ~(log_minus_c < d)
    x = -0.5 * sens - loss * var / sens  # _inverse_privacy_loss_without_subsampling_remove
    if kind == add:
      x = sens + x  # _inverse_privacy_loss_without_subsampling_add
    for i in np.flatnonzero(special):
      x[i] = self.inverse_privacy_loss(eps[i])
    return x

  def get_delta_for_epsilon(self, epsilon):
    # dp-accounting's AdditiveNoisePrivacyLoss.get_delta_for_epsilon, with its
    # per-point list comprehension replaced by `_inverse_privacy_losses`.
    is_scalar = isinstance(epsilon, numbers.Number)
    epsilons = np.array([epsilon]) if is_scalar else np.asarray(epsilon)
    deltas = np.zeros_like(epsilons, dtype=float)
    if self.sampling_prob == 1.0 or self.adjacency_type == _PLM.AdjacencyType.REPLACE:
      inverse_indices = np.full_like(epsilons, True, dtype=bool)
    elif self.adjacency_type == _PLM.AdjacencyType.ADD:
      inverse_indices = epsilons < -math.log1p(-self.sampling_prob)
    elif self.adjacency_type == _PLM.AdjacencyType.REMOVE:
      inverse_indices = epsilons > math.log1p(-self.sampling_prob)
      other_indices = np.logical_not(inverse_indices)
      deltas[other_indices] = -np.expm1(epsilons[other_indices])
    else:
      raise ValueError(f"{self.adjacency_type} adjacency type is not supported.")
    x_cutoffs = self._inverse_privacy_losses(epsilons[inverse_indices])
    deltas[inverse_indices] = (self.mu_upper_cdf(x_cutoffs)
                               - np.exp(epsilons[inverse_indices] + self.mu_lower_log_cdf(x_cutoffs)))
    deltas = np.clip(deltas, 0, 1)
    return float(deltas[0]) if is_scalar else deltas


def gaussian_pld(standard_deviation: float, interval: float, sampling_prob: float = 1.0):
  """dp-accounting's `from_gaussian_mechanism` (add/remove-one, its defaults), vectorised.

  Bit for bit the same PLD (see `_GaussianPrivacyLoss`), ~4x faster.
  """
  def single(adjacency_type):
    loss = _GaussianPrivacyLoss(standard_deviation, sampling_prob=sampling_prob,
                                adjacency_type=adjacency_type)
    return _PLD._create_pld_pmf_from_monotone_privacy_loss(  # pylint: disable=protected-access
        loss, pessimistic_estimate=True, value_discretization_interval=interval, use_connect_dots=True)
  return _PLD._pld_for_subsampled_mechanism(single, sampling_prob)  # pylint: disable=protected-access


# One step's PLD is ~1 MB (DP-SGD at 1e-4; up to ~10 MB for a Gaussian with
# a small sigma); k-fold compositions of the same step (T steps, k T steps for
# Fixed(k), the PLD mixture's base) share it. dp-accounting's PLD operations
# return new objects and never write to their inputs, so handing out the
# cached object is safe (test_dpa.py checks).
_step_cache = LruCache(32, 128 * 2**20)


def _gaussian_step_pld(standard_deviation: float, interval: float, sampling_prob: float = 1.0):
  # As floats: an int sigma or rate gives dp-accounting the same PLD (checked
  # in test_dpa.py), and a hit must be exactly what a miss computes.
  key = (float(standard_deviation), float(interval), float(sampling_prob))
  found = _step_cache.get(key)
  if found is None:
    found = gaussian_pld(*key)
    _step_cache.put(key, found, pld_nbytes(found))
  return found


#: Largest Laplace privacy loss 1/b given to dp-accounting's Laplace PLD. From
#: 1/b ~ 710 on (e^(1/b) overflows) its epsilon is inf at every delta (at 1/b
#: >= ~720 half of the mass sits at +inf); above this, `_PLDAccountant` uses
#: the (1/b)-DP randomized-response pair instead: eps(delta) =
#: 1/b + log(1 - delta (1 + e^(-1/b))) against Laplace's 1/b + 2 log(1 - delta),
#: about delta looser (1e-5 at delta = 1e-5).
LAPLACE_MAX_LOSS = 700.0


class _PLDAccountant(dpa.pld.PLDAccountant):
  """dp-accounting's PLDAccountant, building Gaussian PLDs through `_gaussian_step_pld`.

  Only the add/remove-one relation and nonzero noise and sampling rate take
  the cached path, with exactly dp-accounting's arguments and compositions
  (Gaussian: sigma / sqrt(count), composed once; Poisson-sampled Gaussian: one
  step, self-composed `count` times); a Laplace event with a privacy loss above
  `LAPLACE_MAX_LOSS` gets its randomized-response pair; everything else is
  dp-accounting's own.
  """

  def _maybe_compose(self, event, count, do_compose):
    if do_compose and self.neighboring_relation == _ADD_REMOVE:
      interval = self._value_discretization_interval
      if (isinstance(event, dpa.LaplaceDpEvent) and event.noise_multiplier != 0
          and 1.0 / event.noise_multiplier > LAPLACE_MAX_LOSS):
        # dp-accounting's Laplace PLD breaks down here (eps = inf); Laplace
        # is (1/b)-DP, so the randomized-response pair of 1/b dominates it.
        step = pld_from_privacy_parameters(1.0 / event.noise_multiplier, 0.0, interval)
        self._pld = compose_plds(self._pld, step.self_compose(count))
        return None
      if isinstance(event, dpa.GaussianDpEvent) and event.noise_multiplier != 0:
        step = _gaussian_step_pld(event.noise_multiplier / math.sqrt(count), interval)
        self._pld = compose_plds(self._pld, step)
        return None
      if (isinstance(event, dpa.PoissonSampledDpEvent) and isinstance(event.event, dpa.GaussianDpEvent)
          and event.sampling_probability != 0 and event.event.noise_multiplier != 0):
        step = _gaussian_step_pld(event.event.noise_multiplier, interval, event.sampling_probability)
        self._pld = compose_plds(self._pld, step.self_compose(count))
        return None
    return super()._maybe_compose(event, count, do_compose)


#: dp-accounting's default tail mass truncation of `PrivacyLossDistribution.compose`.
COMPOSE_TAIL_MASS = 1e-15


def compose_plds(pld1, pld2, tail_mass_truncation: float = COMPOSE_TAIL_MASS):
  """`pld1.compose(pld2, tail_mass_truncation)`, dp-accounting's PLD composition, bit for bit.

  dp-accounting truncates a dense composition's tails by summing its PMF in
  a Python loop, element by element, from each end until the sum passes
  tail_mass_truncation / 2: ~100,000 iterations for a DP-SGD run at 1e-4,
  more time than the FFT. `_truncation_prefix` finds the same index from
  numpy's cumulative sums, which add the same terms in the same order; the
  rest is dp-accounting's code path (`PrivacyLossDistribution.compose`,
  `compose_pmfs`, `DensePLDPmf.compose`, `_truncate_tails`) step by step, and
  any other case (sparse PMFs, no truncation) is dp-accounting's own call.
  test_dpa.py checks the PMFs are equal.
  """
  remove = _compose_pmfs(pld1._pmf_remove, pld2._pmf_remove,
                         tail_mass_truncation)  # pylint: disable=protected-access
  if pld1._symmetric and pld2._symmetric:  # pylint: disable=protected-access
    return _PLD.PrivacyLossDistribution(remove)
  add = _compose_pmfs(pld1._pmf_add, pld2._pmf_add,
                      tail_mass_truncation)  # pylint: disable=protected-access
  return _PLD.PrivacyLossDistribution(remove, add)


def _compose_pmfs(pmf1, pmf2, tail_mass_truncation: float):
  """dp-accounting's `pld_pmf.compose_pmfs`, its dense path with `_truncation_prefix`."""
  dense = _PMF.DensePLDPmf
  sparse = (isinstance(pmf1, _PMF.SparsePLDPmf) and isinstance(pmf2, _PMF.SparsePLDPmf)
            and pmf1.size * pmf2.size <= _PMF._MAX_PMF_SPARSE_SIZE)  # pylint: disable=protected-access
  if sparse or tail_mass_truncation == 0:
    return _PMF.compose_pmfs(pmf1, pmf2, tail_mass_truncation)
  pmf1, pmf2 = pmf1.to_dense_pmf(), pmf2.to_dense_pmf()
  if type(pmf1) is not dense or type(pmf2) is not dense:  # pylint: disable=unidiomatic-typecheck
    return pmf1.compose(pmf2, tail_mass_truncation)
  # DensePLDPmf.compose:
  # pylint: disable=protected-access
  pmf1.validate_composable(pmf2)
  lower_loss = pmf1._lower_loss + pmf2._lower_loss
  probs = signal.fftconvolve(pmf1._probs, pmf2._probs)
  infinity_mass = (pmf1._infinity_mass + pmf2._infinity_mass
                   - pmf1._infinity_mass * pmf2._infinity_mass)
  # _truncate_tails(probs, tail_mass_truncation, pessimistic_estimate):
  left_idx = _truncation_prefix(probs, tail_mass_truncation / 2)
  right_idx = len(probs) - _truncation_prefix(np.flip(probs), tail_mass_truncation / 2)
  right_idx = max(right_idx, left_idx + 1)
  left_mass = np.sum(probs[:left_idx])
  right_mass = np.sum(probs[right_idx:])
  truncated = probs[left_idx:right_idx]
  if pmf1._pessimistic_estimate:
    truncated[0] += left_mass
    offset, right_tail = left_idx, right_mass
  else:
    truncated[-1] += right_mass
    offset, right_tail = left_idx, 0
  return dense(pmf1._discretization, lower_loss + offset, truncated, infinity_mass + right_tail,
               pmf1._pessimistic_estimate)
  # pylint: enable=protected-access


def _truncation_prefix(arr: np.ndarray, threshold: float) -> int:
  """dp-accounting's `_find_prefix_to_truncate`: the first i with arr[0] + ... + arr[i] > threshold
  (summed left to right), else len(arr).

  np.add.accumulate adds left to right like the loop it replaces, chunk by
  chunk (doubling), each chunk starting from the running sum so far.
  """
  total, start, size = 0.0, 0, 1024
  while start < len(arr):
    chunk = np.add.accumulate(np.concatenate(([total], arr[start:start + size])))[1:]
    above = np.flatnonzero(chunk > threshold)
    if above.size:
      return start + int(above[0])
    total, start, size = chunk[-1], start + size, 2 * size
  return len(arr)


def pld_nbytes(pld) -> int:
  """Bytes held by a PLD's dense PMF arrays (0 for sparse ones, which are small)."""
  return sum(np.asarray(getattr(p, "_probs", ())).nbytes for p in pld_pmfs(pld))


#: Bounds of `pld_of_event`'s cache: a DP-SGD run's PLD at 1e-4 is ~5-10 MB.
_PLD_CACHE_ENTRIES = 16
_PLD_CACHE_BYTES = 256 * 2**20
_pld_cache = LruCache(_PLD_CACHE_ENTRIES, _PLD_CACHE_BYTES)


def pld_of_event(event: dpa.DpEvent, interval: float):
  """(PLD, contains_non_private) of a dp-accounting event by its PLDAccountant.

  The same numbers as `dp_accounting.pld.PLDAccountant`, bit for bit
  (`_PLDAccountant`), cached by (event, interval). The PLD returned may be
  shared: callers compose it into new objects and never modify it.

  Raises:
    NotApplicableError: dp-accounting failed building the PLD (see
      `building_pld`): `best` then uses the methods that can, and an explicit
      method says why.
  """
  key = event_key(event)
  key = None if key is None else (key, float(interval))
  found = None if key is None else _pld_cache.get(key)
  if found is not None:
    return found
  accountant = _PLDAccountant(value_discretization_interval=interval)
  with building_pld():
    accountant.compose(event)
  found = (accountant._pld, bool(accountant._contains_non_dp_event))  # pylint: disable=protected-access
  if key is not None:
    _pld_cache.put(key, found, pld_nbytes(found[0]))
  return found


@contextlib.contextmanager
def building_pld():
  """Any failure of dp-accounting while it builds or composes PLDs, as `NotApplicableError`.

  dp-accounting raises on valid events at the edges of float64: OverflowError
  for huge privacy losses (a Gaussian with sigma 0.05, a coarse
  discretisation), ValueError "a must be greater than b" in its
  connect-the-dots Gaussian for q within ~1e-12 of 1 and sigma <= 0.3 (9 of a
  360-point single-step sweep of q and sigma). Either says only that the PLD
  method has no answer for this event, not that the event is invalid: `best`
  then uses the methods that can, and a method named explicitly raises this
  error with the original one's type and message.
  """
  try:
    yield
  except events.NotApplicableError:
    raise
  except OverflowError as err:
    raise events.NotApplicableError(
        f"dp-accounting's PLD overflows on this event (OverflowError: {err}); its privacy loss is "
        "too large for a PLD discretisation. Use method 'rdp' (or 'best', which falls back to it)"
    ) from err
  except Exception as err:  # pylint: disable=broad-exception-caught
    raise events.NotApplicableError(
        f"dp-accounting's PLD construction fails on this event ({type(err).__name__}: {err}). Use "
        "method 'rdp' (or 'best', which falls back to it)") from err


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
  with building_pld():
    return _PLD.PrivacyLossDistribution.create_from_rounded_probability(
        rounded, float(infinity_mass), interval, pessimistic_estimate=True)


def pld_from_privacy_parameters(epsilon: float, delta: float, interval: float):
  """dp-accounting's `from_privacy_parameters`: the PLD of the (eps, delta)-DP dominating pair.

  Mass (1 - delta) / (1 + e^-eps) at loss eps, (1 - delta) / (1 + e^eps) at
  -eps, delta at +inf, losses rounded up. dp-accounting's own function
  (used as it is, bit for bit, wherever it works) evaluates e^eps, which
  overflows for eps > ~709.78; there the same masses come from e^-eps.
  """
  if epsilon <= MAX_EXP_ARG:
    with building_pld():
      return _PLD.from_privacy_parameters(dpa.pld.common.DifferentialPrivacyParameters(epsilon, delta),
                                          interval)
  tiny = math.exp(-epsilon)  # underflows to 0 for eps > ~745: that mass is then below any float
  rounded = {math.ceil(epsilon / interval): (1 - delta) / (1 + tiny)}
  if tiny > 0.0:
    low = math.ceil(-epsilon / interval)
    rounded[low] = rounded.get(low, 0.0) + (1 - delta) * tiny / (1 + tiny)
  with building_pld():
    return _PLD.PrivacyLossDistribution.create_from_rounded_probability(rounded, delta, interval)


def pld_identity(interval: float):
  return _PLD.identity(value_discretization_interval=interval)


def pld_pmfs(pld) -> list:
  """The PMFs of a PLD whose hockey-stick curves bound the two neighbouring orders."""
  if pld._symmetric:  # pylint: disable=protected-access
    return [pld._pmf_remove]  # pylint: disable=protected-access
  return [pld._pmf_remove, pld._pmf_add]  # pylint: disable=protected-access


def pld_pmf_pair(pld) -> tuple:
  """(remove, add) PMFs of a PLD (the same one twice if it is symmetric), as dp-accounting mixes them."""
  return pld._pmf_remove, pld._pmf_add  # pylint: disable=protected-access


def pmf_delta_lower(pmf, epsilon: float) -> float:
  """A PMF's hockey-stick value at `epsilon`, dp-accounting's formula on the atoms above it only.

  inf_mass + sum_{L > eps} p_L (1 - e^(eps - L)), as dp-accounting's
  `get_delta_for_epsilon` computes it, but on the slice of losses from about
  eps up (dp-accounting forms every loss and a mask first): an atom at or
  below eps the slice may take in adds p (1 - e^(eps - L)) <= 0, so the
  value is never above dp-accounting's by more than the rounding of the sums.
  """
  if not hasattr(pmf, "_probs"):
    return float(pmf.get_delta_for_epsilon(epsilon))
  # pylint: disable=protected-access
  probs, lower, disc = pmf._probs, pmf._lower_loss, pmf._discretization
  start = min(max(int(math.floor(epsilon / disc)) - lower, 0), len(probs))
  losses = (np.arange(start, len(probs)) + lower) * disc
  above = losses > epsilon
  return float(pmf._infinity_mass + np.dot(-np.expm1(epsilon - losses[above]), probs[start:][above]))
  # pylint: enable=protected-access


def pmf_table(pmf):
  """(losses, U, log W, inf_mass) of a PMF: U[i] = sum_{j>=i} p_j,
  W[i] = sum_{j>=i} p_j e^-L_j (kept as a log: losses reach the thousands,
  where e^-L underflows and e^eps overflows); None for a PMF of neither
  dp-accounting kind.

  Sparse PMFs (dp-accounting keeps PMFs of up to 1000 atoms as a dict) get
  the same table: dp-accounting's own vectorised hockey-stick of a sparse PMF
  computes U - e^eps W directly, which gives -inf (read as delta 0) once
  e^eps overflows, e.g. for a pure 720-DP part.
  """
  if hasattr(pmf, "_probs"):
    probs = np.asarray(pmf._probs, dtype=np.float64)  # pylint: disable=protected-access
    losses = (np.arange(probs.size) + pmf._lower_loss) * pmf._discretization  # pylint: disable=protected-access
  elif hasattr(pmf, "_loss_probs"):
    idx = np.array(sorted(pmf._loss_probs), dtype=np.int64)  # pylint: disable=protected-access
    probs = np.array([pmf._loss_probs[i] for i in idx.tolist()],
                     dtype=np.float64)  # pylint: disable=protected-access
    losses = idx * pmf._discretization  # pylint: disable=protected-access
  else:
    return None
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
  return np.maximum(val,
                    0.0) + (8.0 * np.finfo(np.float64).eps + 4e-16 * losses.size ** 0.5) * upper[idx]


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
  # The RdpAccountant's own get_epsilon is compute_epsilon on its curve at its
  # default orders: the cached curve (the profile accountant asks for the same
  # one) gives the same number without composing the event twice.
  rdp = dp_event_rdp(event, DEFAULT_ORDERS)
  if rdp is None:
    return finest
  eps = float(_rdp.compute_epsilon(np.asarray(DEFAULT_ORDERS), rdp, 1e-10)[0])
  if not math.isfinite(eps):
    return finest
  return max(finest, eps / 5e5)
