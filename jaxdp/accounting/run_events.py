"""The events of one run: pure and approximate DP, zCDP, an RDP curve, report-noisy-max, and
DP-SGD's Poisson-subsampled Gaussian (`dpsgd_event`). Plain data, frozen `dp_accounting.DpEvent`
subclasses; the selections that repeat them and the event layer's structure are
`jaxdp.accounting.events`'s (which re-exports these)."""

from __future__ import annotations

import math
from typing import Sequence

import attr
import dp_accounting as dpa
import numpy as np

from jaxdp import _validate


def _set(obj, name, value):
  object.__setattr__(obj, name, value)  # attrs frozen classes: normalise in post-init




@attr.s(frozen=True, slots=True, auto_attribs=True)
class PureDp(dpa.DpEvent):
  """A mechanism that is epsilon-DP in the pure sense (delta = 0)."""

  epsilon: float

  def __attrs_post_init__(self):
    _set(self, "epsilon", _validate.real("epsilon", self.epsilon, low=0.0))

  def rdp(self, orders) -> np.ndarray:
    """Exact worst-case Renyi divergence of an eps-DP pair (randomized response).

    Every eps-DP pair is a post-processing of binary randomized response with
    the same eps, so D_l = log((e^{eps l} + e^{eps (1-l)}) / (1 + e^eps)) / (l - 1)
    <= min(eps, l eps^2 / 2).
    """
    eps, lam = self.epsilon, np.asarray(orders, dtype=np.float64)
    if eps == 0.0:
      return np.zeros_like(lam)
    log_sum = np.logaddexp(eps * lam, eps * (1.0 - lam)) - np.logaddexp(0.0, eps)
    # expm1-free form loses everything for eps ~ 1e-9; l eps^2/2 is then exact to O(eps^3).
    return np.minimum(np.maximum(log_sum / (lam - 1.0), 0.0), np.minimum(eps, 0.5 * lam * eps * eps))

  def hockey_stick(self, epsilon: float) -> float:
    """Exact privacy profile delta(epsilon) of the worst eps-DP pair (randomized response)."""
    if epsilon >= self.epsilon:
      return 0.0
    return -math.expm1(epsilon - self.epsilon) / (1.0 + math.exp(-self.epsilon))


@attr.s(frozen=True, slots=True, auto_attribs=True)
class Zcdp(dpa.DpEvent):
  """rho-zero-concentrated DP: (lambda, rho * lambda)-RDP for every lambda > 1."""

  rho: float

  def __attrs_post_init__(self):
    _set(self, "rho", _validate.real("rho", self.rho, low=0.0))

  def rdp(self, orders) -> np.ndarray:
    return self.rho * np.asarray(orders, dtype=np.float64)


@attr.s(frozen=True, slots=True, auto_attribs=True)
class RdpCurve(dpa.DpEvent):
  """An RDP guarantee given as values on its own orders.

  Asked for another order lambda, the curve answers with its value at the
  smallest own order >= lambda (Renyi divergence is non-decreasing in the
  order), and with +inf above its largest order: never optimistic.
  """

  orders: Sequence[float]
  values: Sequence[float]

  def __attrs_post_init__(self):
    orders = _validate.real_array("orders", self.orders, low=1.0, low_open=True)
    values = _validate.real_array("values", self.values, low=0.0, allow_inf=True)
    if orders.shape != values.shape:
      raise ValueError(f"orders and values must have the same length, got "
                       f"{orders.size} and {values.size}")
    idx = np.argsort(orders)
    orders, values = orders[idx], values[idx]
    if np.any(np.diff(orders) == 0):
      raise ValueError(f"orders must be distinct, got {self.orders!r}")
    # A larger order's bound also bounds every smaller order.
    values = np.minimum.accumulate(values[::-1])[::-1]
    _set(self, "orders", tuple(orders.tolist()))
    _set(self, "values", tuple(values.tolist()))

  def rdp(self, orders) -> np.ndarray:
    own_o = np.asarray(self.orders)
    own_v = np.append(np.asarray(self.values), np.inf)
    return own_v[np.searchsorted(own_o, np.asarray(orders, dtype=np.float64), side="left")]


@attr.s(frozen=True, slots=True, auto_attribs=True)
class ApproxDp(dpa.DpEvent):
  """(epsilon, delta)-DP at one point. With delta > 0 it bounds no Renyi
  divergence: the privacy-profile and PLD accountants account it."""

  epsilon: float
  delta: float

  def __attrs_post_init__(self):
    _set(self, "epsilon", _validate.real("epsilon", self.epsilon, low=0.0))
    _set(self, "delta", _validate.probability("delta", self.delta, zero_ok=True, one_ok=False))

  def rdp(self, orders) -> np.ndarray:
    if self.delta == 0.0:
      return PureDp(self.epsilon).rdp(orders)
    return np.full(np.shape(orders), np.inf)


@attr.s(frozen=True, slots=True, auto_attribs=True)
class ReportNoisyMax(dpa.DpEvent):
  """Report Noisy Max with Gaussian noise: argmax_i f_i(X) + N(0, sigma^2), i in [m].

  Scores have sensitivity 1; `monotonic=True` if all scores move in the same
  direction between neighbours (then the noise sees sensitivity 1, else 2).
  `num_rounds` = k adaptive rounds (KRW Thm 3.3). Only the index is released.
  """

  noise_multiplier: float
  num_candidates: int
  num_rounds: int = 1
  monotonic: bool = False

  def __attrs_post_init__(self):
    _set(self, "noise_multiplier",
         _validate.real("noise_multiplier", self.noise_multiplier, low=0.0, low_open=True))
    _set(self, "num_candidates", _validate.integer("num_candidates", self.num_candidates, low=1))
    _set(self, "num_rounds", _validate.integer("num_rounds", self.num_rounds, low=1))
    if not isinstance(self.monotonic, bool):
      raise ValueError(f"monotonic must be a bool, got {self.monotonic!r}")

  @property
  def score_sensitivity(self) -> float:
    return 1.0 if self.monotonic else 2.0

  def rdp(self, orders) -> np.ndarray:
    # KRW Thm 3.1 (Zhu & Wang 2022): per round eps_Delta(l) + log(m)/(l-1), with
    # eps_Delta(l) = l Delta^2/(2 sigma^2) the Gaussian RDP; k rounds compose.
    lam = np.asarray(orders, dtype=np.float64)
    per_round = (lam * self.score_sensitivity ** 2 / (2.0 * self.noise_multiplier ** 2)
                 + math.log(self.num_candidates) / (lam - 1.0))
    return self.num_rounds * per_round


# --------------------------------------------------------------------------- DP-SGD


def dpsgd_steps(epochs: float, sampling_prob: float) -> int:
  """The step rule: T = ceil(epochs / sampling_prob) Poisson-sampled steps.

  With expected batch q N, epochs / q steps see `epochs` passes in
  expectation; rounding up never trains (or accounts) for fewer than asked.
  A relative slack of 1e-9 keeps 3 / 0.5 at 6 steps despite float division.
  This is the rule of the trainer, the CLI, the notebooks and the docs
  (60 epochs at q = 256/60000: 14063 steps).
  """
  epochs = _validate.real("epochs", epochs, low=0.0, low_open=True)
  sampling_prob = _validate.probability("sampling_prob", sampling_prob, one_ok=True)
  ratio = epochs / sampling_prob
  return max(1, math.ceil(ratio * (1.0 - 1e-9)))


def dpsgd_event(sampling_prob: float, noise_multiplier: float, iterations: int) -> dpa.DpEvent:
  """DP-SGD: `iterations` steps of the Poisson-subsampled Gaussian (add/remove-one).

  Every step samples each example with probability `sampling_prob`, adds
  N(0, (noise_multiplier * C)^2) to the sum of gradients clipped to norm C.
  """
  sampling_prob = _validate.probability("sampling_prob", sampling_prob, one_ok=True)
  noise_multiplier = _validate.real("noise_multiplier", noise_multiplier, low=0.0)
  iterations = _validate.integer("iterations", iterations, low=1)
  step = dpa.GaussianDpEvent(noise_multiplier)
  if sampling_prob < 1.0:
    step = dpa.PoissonSampledDpEvent(sampling_prob, step)
  return dpa.SelfComposedDpEvent(step, iterations)
