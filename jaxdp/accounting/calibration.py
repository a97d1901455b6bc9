"""Noise calibration over a grid of DP-SGD (sampling rate, length) pairs.

Koskela & Kulkarni (NeurIPS 2023, Sec. 5 and App. F) tune hyperparameters that
change a candidate's own privacy, the sampling rate gamma and the number of
epochs, and give every candidate the smallest noise multiplier sigma that
keeps that single run within a fixed per-candidate (epsilon, delta) target.
`calibrate_noise_grid` computes that sigma for every grid point by bisection on
dp-accounting's RDP accountant through `calibrate_dp_mechanism` (the subsampled-Gaussian RDP of Mironov, Talwar
& Zhang 2019, converted to (epsilon, delta) by dp-accounting's conversion).

Rounding is always towards more noise: the returned sigma has been checked to
meet the target, and sigma / (1 + rtol) was found not to.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from jaxdp import _validate
from jaxdp.accounting import _dpa
from jaxdp.accounting import events as ev
from jaxdp.accounting import inverse


def _as_grid_array(name: str, values, *, low: float, low_open: bool) -> np.ndarray:
  try:
    arr = np.asarray(values, dtype=np.float64)
  except (TypeError, ValueError):
    raise ValueError(f"{name} must be a real number or an array of them, got {values!r}") from None
  if arr.size == 0:
    raise ValueError(f"{name} must not be empty, got {values!r}")
  if not np.all(np.isfinite(arr)):
    raise ValueError(f"{name} must contain only finite numbers, got {values!r}")
  bad = arr[(arr <= low) if low_open else (arr < low)]
  if bad.size:
    raise ValueError(f"every entry of {name} must be in {'(' if low_open else '['}{low!r}, inf), got {bad.flat[0]!r}")
  return arr


def calibrate_noise_grid(sampling_probs, epochs=None, *, steps=None, target_epsilon, target_delta: float,
                         orders: Optional[Sequence[float]] = None, rtol: float = 1e-4,
                         sigma_max: float = 1e3) -> np.ndarray:
  """Smallest DP-SGD noise multiplier per (sampling rate, epochs) grid point.

  For every grid point (gamma, T) with T = ceil(epochs / gamma) (the step
  rule `dpsgd_steps` of the trainer) or T = steps, returns the smallest
  sigma (within `rtol`) such that T steps of the Poisson-subsampled Gaussian
  with rate gamma are (target_epsilon, target_delta)-DP by the RDP accountant
  (Koskela & Kulkarni 2023, Sec. 5: per-candidate calibration when gamma and
  epochs are tuned).

  Args:
    sampling_probs: gamma, scalar or array, entries in (0, 1].
    epochs: epochs, scalar or array broadcastable against `sampling_probs`,
      entries > 0. Exactly one of `epochs` and `steps` must be given.
    steps: number of DP steps instead of epochs (integers >= 1).
    target_epsilon: per-candidate epsilon > 0 (scalar or broadcastable array).
    target_delta: delta in (0, 1).
    orders: RDP orders (> 1); None uses dp-accounting's default orders (those
      of `acc.epsilon(..., method="rdp")`).
    rtol: relative tolerance in (0, 1]: sigma meets the target and
      sigma / (1 + rtol) was found not to (unless sigma is the 1e-3 floor).
    sigma_max: give up above this noise multiplier.

  Returns:
    float64 array of sigma with the broadcast shape of the inputs (a 0-d
    array for scalar inputs).

  Raises:
    ValueError: a bad argument, or a grid point (named in the message) that
      not even `sigma_max` brings within the target.

  Guarantees:
    Every returned sigma has epsilon(gamma, sigma, T) <= target_epsilon by
    `dpa.rdp.RdpAccountant(orders)` (rounding towards more noise).

  Example:
    >>> from jaxdp import accounting as acc
    >>> float(acc.calibrate_noise_grid(128 / 6000, 40, target_epsilon=1.0, target_delta=1e-5).round(2))
    3.85
  """
  gammas, lengths, targets = _check_grid(sampling_probs, epochs, steps, target_epsilon)
  target_delta = _validate.probability("target_delta", target_delta)
  rtol = _validate.real("rtol", rtol, low=0.0, low_open=True, high=1.0)
  sigma_max = _validate.real("sigma_max", sigma_max, low=1e-3, low_open=True)
  orders = list(_dpa.DEFAULT_ORDERS) if orders is None else list(_validate.real_array("orders", orders, low=1.0,
                                                                                 low_open=True))
  try:
    gammas, lengths, targets = np.broadcast_arrays(gammas, lengths, targets)
  except ValueError:
    raise ValueError(f"sampling_probs {gammas.shape}, {'steps' if steps is not None else 'epochs'} "
                     f"{lengths.shape} and target_epsilon {targets.shape} do not broadcast") from None
  return _noise_per_point(gammas, lengths, targets, steps is not None, target_delta=target_delta,
                          orders=orders, rtol=rtol, sigma_max=sigma_max)


def _check_grid(sampling_probs, epochs, steps, target_epsilon) -> tuple:
  """(sampling rates, epochs or steps, targets) as validated arrays, not yet broadcast."""
  if (epochs is None) == (steps is None):
    raise ValueError(f"exactly one of epochs and steps must be given, got epochs={epochs!r}, steps={steps!r}")
  gammas = _as_grid_array("sampling_probs", sampling_probs, low=0.0, low_open=True)
  if np.any(gammas > 1.0):
    raise ValueError(f"every entry of sampling_probs must be in (0.0, 1.0], got {gammas[gammas > 1.0].flat[0]!r}")
  if steps is not None:
    lengths = _as_grid_array("steps", steps, low=1.0, low_open=False)
    if np.any(lengths != np.floor(lengths)):
      raise ValueError(f"steps must be integers >= 1, got {lengths[lengths != np.floor(lengths)].flat[0]!r}")
  else:
    lengths = _as_grid_array("epochs", epochs, low=0.0, low_open=True)
  return gammas, lengths, _as_grid_array("target_epsilon", target_epsilon, low=0.0, low_open=True)


def _noise_per_point(gammas, lengths, targets, by_steps: bool, *, target_delta, orders, rtol,
                     sigma_max) -> np.ndarray:
  """The calibrated sigma at every point of the (broadcast) grid; equal points are solved once."""
  out = np.empty(gammas.shape, dtype=np.float64)
  cache: dict = {}
  for idx in np.ndindex(gammas.shape):
    gamma, target = float(gammas[idx]), float(targets[idx])
    num_steps = int(lengths[idx]) if by_steps else ev.dpsgd_steps(float(lengths[idx]), gamma)
    point = (gamma, num_steps, target)
    if point not in cache:
      where = (f"sampling_prob={gamma!r}, steps={num_steps}"
               + ("" if by_steps else f" (epochs={float(lengths[idx])!r})"))
      cache[point] = inverse.noise_for(
          lambda sigma, g=gamma, t=num_steps: ev.dpsgd_event(g, sigma, t), target, target_delta,
          method="rdp", orders=orders, rtol=rtol, sigma_max=sigma_max, where=f" for grid point {where}")
    out[idx] = cache[point]
  return out
