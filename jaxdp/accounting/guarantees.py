"""Guarantees of one candidate run (the base mechanism Q of repeat-and-select).

A base is either a `dp_accounting.DpEvent` (its RDP comes from dp-accounting's
`RdpAccountant`) or one of the plain guarantees below. Every base answers one
question: its RDP curve on a grid of orders, as an upper bound of the Renyi
divergence in both neighbouring directions.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional, Sequence

import dp_accounting as dpa
import numpy as np

from jaxdp import _validate

#: dp-accounting's default order grid: 1.1..10.9 step 0.1, 11..63, 128..1024.
DEFAULT_ORDERS: tuple = tuple(dpa.rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS)


class UnsupportedBaseError(ValueError):
  """Raised when a base guarantee or DpEvent cannot be accounted."""


def check_orders(orders: Optional[Sequence[float]]) -> np.ndarray:
  """Validated, sorted, de-duplicated order grid (every order > 1)."""
  if orders is None:
    return np.asarray(DEFAULT_ORDERS, dtype=np.float64)
  arr = _validate.real_array("orders", orders, low=1.0, low_open=True)
  return np.unique(arr)


@dataclasses.dataclass(frozen=True)
class PureDp:
  """epsilon-DP in the pure sense (delta = 0)."""

  epsilon: float

  def __post_init__(self):
    object.__setattr__(self, "epsilon", _validate.real("epsilon", self.epsilon, low=0.0))

  def rdp(self, orders: np.ndarray) -> np.ndarray:
    # Every eps-DP pair is a post-processing of binary randomized response with
    # the same eps, so RR's Renyi divergence is the exact worst case:
    # D_l = log((e^{eps l} + e^{eps (1-l)}) / (1 + e^eps)) / (l - 1) <= min(eps, l eps^2 / 2).
    eps, lam = self.epsilon, np.asarray(orders, dtype=np.float64)
    if eps == 0.0:
      return np.zeros_like(lam)
    log_sum = np.logaddexp(eps * lam, eps * (1.0 - lam)) - np.logaddexp(0.0, eps)
    return np.minimum(log_sum / (lam - 1.0), eps)

  def hockey_stick(self, epsilon: float) -> float:
    """Exact privacy profile delta(epsilon) of the worst eps-DP pair (randomized response)."""
    if epsilon >= self.epsilon:
      return 0.0
    return (math.exp(self.epsilon) - math.exp(epsilon)) / (1.0 + math.exp(self.epsilon))


@dataclasses.dataclass(frozen=True)
class Zcdp:
  """rho-zero-concentrated DP: (lambda, rho * lambda)-RDP for every lambda > 1."""

  rho: float

  def __post_init__(self):
    object.__setattr__(self, "rho", _validate.real("rho", self.rho, low=0.0))

  def rdp(self, orders: np.ndarray) -> np.ndarray:
    return self.rho * np.asarray(orders, dtype=np.float64)


@dataclasses.dataclass(frozen=True, eq=False)
class RdpCurve:
  """An RDP guarantee given as values on its own orders.

  Asked for another order lambda, the curve answers with its value at the
  smallest own order >= lambda (Renyi divergence is non-decreasing in the order),
  and with +inf above its largest order: never optimistic.
  """

  orders: Sequence[float]
  values: Sequence[float]

  def __post_init__(self):
    orders = _validate.real_array("orders", self.orders, low=1.0, low_open=True)
    values = _validate.real_array("values", self.values, low=0.0, allow_inf=True)
    if orders.shape != values.shape:
      raise ValueError(f"orders and values must have the same length, got "
                       f"{orders.size} and {values.size}")
    idx = np.argsort(orders)
    orders, values = orders[idx], values[idx]
    if np.any(np.diff(orders) == 0):
      raise ValueError(f"orders must be distinct, got {self.orders!r}")
    # Enforce monotonicity from the right: a larger order's bound also bounds smaller ones.
    values = np.minimum.accumulate(values[::-1])[::-1]
    object.__setattr__(self, "orders", tuple(orders.tolist()))
    object.__setattr__(self, "values", tuple(values.tolist()))

  def __eq__(self, other):
    return isinstance(other, RdpCurve) and (self.orders, self.values) == (other.orders, other.values)

  def __hash__(self):
    return hash((self.orders, self.values))

  def rdp(self, orders: np.ndarray) -> np.ndarray:
    own_o = np.asarray(self.orders)
    own_v = np.append(np.asarray(self.values), np.inf)
    idx = np.searchsorted(own_o, np.asarray(orders, dtype=np.float64), side="left")
    return own_v[idx]


@dataclasses.dataclass(frozen=True)
class ApproxDp:
  """(epsilon, delta)-DP at one point. With delta > 0 it bounds no Renyi
  divergence, so only the privacy-profile methods account it."""

  epsilon: float
  delta: float

  def __post_init__(self):
    object.__setattr__(self, "epsilon", _validate.real("epsilon", self.epsilon, low=0.0))
    object.__setattr__(self, "delta", _validate.probability("delta", self.delta, zero_ok=True,
                                                            one_ok=False))

  def rdp(self, orders: np.ndarray) -> np.ndarray:
    if self.delta == 0.0:
      return PureDp(self.epsilon).rdp(orders)
    return np.full(np.shape(orders), np.inf)


@dataclasses.dataclass(frozen=True)
class ReportNoisyMax:
  """Report Noisy Max with Gaussian noise: argmax_i f_i(X) + N(0, sigma^2), i in [m].

  Scores have sensitivity 1; `monotonic=True` if all scores move in the same
  direction between neighbours (then the noise sees sensitivity 1, else 2).
  `num_rounds` = k adaptive rounds (KRW Thm 3.3). Only the index is released.

  Args:
    noise_multiplier: sigma > 0, the noise standard deviation per score.
    num_candidates: m >= 1.
    num_rounds: k >= 1.
    monotonic: whether the scores are monotone in the dataset.
  """

  noise_multiplier: float
  num_candidates: int
  num_rounds: int = 1
  monotonic: bool = False

  def __post_init__(self):
    object.__setattr__(self, "noise_multiplier",
                       _validate.real("noise_multiplier", self.noise_multiplier, low=0.0, low_open=True))
    object.__setattr__(self, "num_candidates", _validate.integer("num_candidates", self.num_candidates, low=1))
    object.__setattr__(self, "num_rounds", _validate.integer("num_rounds", self.num_rounds, low=1))
    if not isinstance(self.monotonic, bool):
      raise ValueError(f"monotonic must be a bool, got {self.monotonic!r}")

  @property
  def score_sensitivity(self) -> float:
    return 1.0 if self.monotonic else 2.0

  def rdp(self, orders: np.ndarray) -> np.ndarray:
    # KRW Thm 3.1 (Zhu & Wang 2022): per round eps_Delta(l) + log(m)/(l-1), with
    # eps_Delta(l) = l Delta^2/(2 sigma^2) the Gaussian RDP; k rounds compose.
    lam = np.asarray(orders, dtype=np.float64)
    per_round = (lam * self.score_sensitivity ** 2 / (2.0 * self.noise_multiplier ** 2)
                 + math.log(self.num_candidates) / (lam - 1.0))
    return self.num_rounds * per_round


def dp_event_rdp(event: dpa.DpEvent, orders: np.ndarray) -> np.ndarray:
  """RDP of a DpEvent from dp-accounting's RdpAccountant (add/remove-one).

  Cached per (event, orders): subsampled-Gaussian RDP at fractional orders
  costs ~0.1 s, and sweeps over distributions of K ask for the same base often.
  """
  return _dp_event_rdp(event, tuple(float(o) for o in orders)).copy()


def cache_per_event(maxsize: int):
  """LRU cache keyed by the (event, *args) call; unhashable events (e.g. a
  ComposedDpEvent built from a list) are computed without caching."""

  def wrap(fn):
    cached = functools.lru_cache(maxsize=maxsize)(fn)

    @functools.wraps(fn)
    def call(event, *args):
      try:
        hash(event)
      except TypeError:
        return fn(event, *args)
      return cached(event, *args)

    return call

  return wrap


@cache_per_event(maxsize=256)
def _dp_event_rdp(event: dpa.DpEvent, orders: tuple) -> np.ndarray:
  accountant = dpa.rdp.RdpAccountant(list(orders))
  if not accountant.supports(event):
    raise UnsupportedBaseError(
        f"base event {event!r} cannot be accounted by dp-accounting's RdpAccountant "
        "(supported: Gaussian, Poisson-subsampled Gaussian, Laplace, zCDP, compositions, ...)")
  accountant.compose(event)
  return accountant.rdp


PLAIN_GUARANTEES = (PureDp, Zcdp, RdpCurve, ApproxDp, ReportNoisyMax)
