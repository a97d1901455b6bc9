"""Inverse accounting problems: how many candidates fit a budget, and how much
noise a tuned DP-SGD run needs.

Both are bisections on a quantity assumed monotone (epsilon grows with E[K] and
shrinks with sigma). The returned value is always one whose epsilon was
computed and found within the target, so even where the bounds are not exactly
monotone (numerical eps1 search, discretised PLDs) the answer errs on the
private side; only its optimality is approximate (relative tolerance `rtol`).
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence, Union

import dp_accounting as dpa

from jaxdp import _validate
from jaxdp.accounting import accountant
from jaxdp.accounting import distributions as dist_lib
from jaxdp.accounting.events import RepeatAndSelect

Family = Union[str, Callable[[float], dist_lib.KDistribution]]

# family -> (constructor from the mean, smallest admissible mean (exclusive)).
_FAMILIES = {
    "poisson": (lambda m: dist_lib.Poisson(mean=m), 0.0),
    "geometric": (lambda m: dist_lib.Geometric(mean=m), 1.0),
    "logarithmic": (lambda m: dist_lib.Logarithmic(mean=m), 1.0),
}
_MAX_MEAN = 1e9


def _family(family: Family):
  if callable(family):
    return family, 1.0  # a callable's domain is unknown: start just above 1
  if isinstance(family, str) and family.lower() in _FAMILIES:
    return _FAMILIES[family.lower()]
  raise ValueError(f"family must be one of {tuple(_FAMILIES)} or a callable mean -> distribution, "
                   f"got {family!r}")


def max_mean(base, family: Family, epsilon: float, delta: float, method: str = "best", *,
             allow_refined: bool = False, orders: Optional[Sequence[float]] = None,
             rtol: float = 1e-3) -> float:
  """Largest E[K] such that repeat-and-select of `base` is (epsilon, delta)-DP.

  Args:
    base: one run's guarantee (any base `RepeatAndSelect` accepts).
    family: "poisson", "geometric", "logarithmic", or a callable mapping a
      mean to a distribution, e.g. `lambda m: TruncatedNegativeBinomial(0.5, mean=m)`.
    epsilon: target epsilon > 0.
    delta: target delta in (0, 1).
    method: accounting method (as for `epsilon`).
    allow_refined: let "best" use "profile-refined".
    orders: RDP orders.
    rtol: relative tolerance on the mean: the answer m satisfies the target
      and m (1 + rtol) was found not to (or the search stopped at 1e9).

  Returns:
    The mean (a float, not rounded to the family's constraints).

  Raises:
    ValueError: bad arguments, or no admissible mean meets the target.

  Example:
    >>> import dp_accounting as dpa
    >>> from jaxdp import accounting as acc
    >>> m = acc.max_mean(dpa.GaussianDpEvent(4.0), "geometric", 2.0, 1e-5, method="profile")
    >>> 15 < m < 16
    True
  """
  epsilon = _validate.real("epsilon", epsilon, low=0.0, low_open=True)
  delta = _validate.probability("delta", delta)
  rtol = _validate.real("rtol", rtol, low=0.0, low_open=True, high=1.0)
  make, floor = _family(family)

  def eps_of(mean):
    return accountant.epsilon(RepeatAndSelect(base, make(mean)), delta, method, orders,
                              allow_refined=allow_refined)

  # Smallest admissible mean to try: just above the family's floor.
  lo = floor * (1.0 + 1e-6) if floor > 0 else 1e-6
  eps_lo = eps_of(lo)
  if eps_lo > epsilon:
    raise ValueError(f"epsilon={epsilon!r} is too small: even mean={lo:.6g} needs "
                     f"epsilon={eps_lo:.6g} at delta={delta!r} by method {method!r}")
  hi = max(2.0 * lo, 2.0)
  while eps_of(hi) <= epsilon:
    lo, hi = hi, hi * 2.0
    if lo >= _MAX_MEAN:
      return lo
  # Invariant: lo meets the target, hi does not. Bisect geometrically.
  while hi / lo > 1.0 + rtol:
    mid = math.sqrt(lo * hi) if lo > 0 else 0.5 * hi
    if eps_of(mid) <= epsilon:
      lo = mid
    else:
      hi = mid
  return lo


def dpsgd_event(sampling_prob: float, noise_multiplier: float, iterations: int) -> dpa.DpEvent:
  """DP-SGD: `iterations` steps of the Poisson-subsampled Gaussian (add/remove-one)."""
  return dpa.SelfComposedDpEvent(
      dpa.PoissonSampledDpEvent(sampling_prob, dpa.GaussianDpEvent(noise_multiplier)), iterations)


def calibrate_noise(sampling_prob: float, iterations: int,
                    distribution: Optional[dist_lib.KDistribution], epsilon: float, delta: float,
                    method: str = "best", *, allow_refined: bool = False,
                    orders: Optional[Sequence[float]] = None, rtol: float = 1e-3,
                    sigma_max: float = 1e3) -> float:
  """Smallest DP-SGD noise multiplier so that tuning meets (epsilon, delta).

  Each candidate runs `iterations` steps of the Poisson-subsampled Gaussian
  with rate `sampling_prob`; the tuner draws K ~ `distribution` candidates and
  releases the best (None: a single run).

  Args:
    sampling_prob: DP-SGD sampling rate in (0, 1].
    iterations: steps per run, >= 1.
    distribution: law of K, or None.
    epsilon: target epsilon > 0.
    delta: target delta in (0, 1).
    method, allow_refined, orders: as for `epsilon`.
    rtol: relative tolerance: the answer sigma meets the target and
      sigma / (1 + rtol) was found not to.
    sigma_max: give up above this noise multiplier.

  Returns:
    sigma (noise multiplier, relative to the clipping norm), rounded up.

  Raises:
    ValueError: bad arguments, or not even `sigma_max` meets the target.
  """
  sampling_prob = _validate.probability("sampling_prob", sampling_prob, one_ok=True)
  iterations = _validate.integer("iterations", iterations, low=1)
  epsilon = _validate.real("epsilon", epsilon, low=0.0, low_open=True)
  delta = _validate.probability("delta", delta)
  rtol = _validate.real("rtol", rtol, low=0.0, low_open=True, high=1.0)
  sigma_max = _validate.real("sigma_max", sigma_max, low=0.0, low_open=True)
  if distribution is not None:
    dist_lib._check_dist(distribution)  # pylint: disable=protected-access

  def eps_of(sigma, how):
    ev = dpsgd_event(sampling_prob, sigma, iterations)
    if distribution is not None:
      ev = RepeatAndSelect(ev, distribution)
    return accountant.epsilon(ev, delta, how, orders, allow_refined=allow_refined)

  # Seed the bracket with the RDP answer (cheap); profile answers are usually a bit below it.
  seed = 1.0
  if method != "rdp":
    try:
      seed = _bisect_sigma(lambda s: eps_of(s, "rdp"), epsilon, 1.0, sigma_max, 0.05)
    except ValueError:
      seed = 1.0
  return _bisect_sigma(lambda s: eps_of(s, method), epsilon, seed, sigma_max, rtol)


def _bisect_sigma(eps_fn, target, seed, sigma_max, rtol):
  """Smallest sigma (within rtol, feasible side) with eps_fn(sigma) <= target.

  Bracket from `seed`, then false position on (log sigma, log eps) safeguarded
  by bisection: each step keeps hi feasible and lo infeasible.
  """
  hi, e_hi = seed, eps_fn(seed)
  while e_hi > target:
    hi *= 1.25
    if hi > sigma_max:
      raise ValueError(f"epsilon={target!r} is out of reach: even noise_multiplier={sigma_max!r} "
                       "does not meet it")
    e_hi = eps_fn(hi)
  lo, e_lo = hi / 1.25, eps_fn(hi / 1.25)
  while e_lo <= target:
    hi, e_hi = lo, e_lo
    lo = lo / 1.25
    if lo < 1e-6:
      return hi
    e_lo = eps_fn(lo)
  step = 0
  while hi / lo > 1.0 + rtol:
    llo, lhi = math.log(lo), math.log(hi)
    mid = 0.5 * (llo + lhi)
    if step % 2 == 0 and math.isfinite(e_lo) and e_hi > 0:
      # Interpolate log eps linearly in log sigma, aiming just inside the feasible side.
      a, b, t = math.log(e_lo), math.log(e_hi), math.log(target) - 0.25 * rtol
      if a > b:
        mid = llo + (a - t) / (a - b) * (lhi - llo)
    margin = 0.25 * math.log1p(rtol)
    mid = math.exp(min(max(mid, llo + margin), lhi - margin))
    e_mid = eps_fn(mid)
    if e_mid <= target:
      hi, e_hi = mid, e_mid
    else:
      lo, e_lo = mid, e_mid
    step += 1
  return hi
  # Invariant: hi meets the target, lo does not.
  while hi / lo > 1.0 + rtol:
    mid = math.sqrt(lo * hi)
    if eps_of(mid) <= epsilon:
      hi = mid
    else:
      lo = mid
  return hi
