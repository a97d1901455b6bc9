"""Tuning on a random subset (Koskela & Kulkarni, NeurIPS 2023).

The data set X is Poisson-subsampled with rate q into X1; a private random
search (Papernot-Steinke, K ~ Poisson) runs on X1; its hyperparameters are
extrapolated and a final model is trained once, on X \\ X1 (variant 1) or on
X (variant 2). Both stages are released.

RDP curves here live on integer orders 2, 3, ..., because both bounds expand
binomial sums over the order.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy import special

from jaxdp import _validate

#: Integer order grid used when the caller gives none.
DEFAULT_INTEGER_ORDERS: tuple = tuple(range(2, 129))


def check_integer_orders(orders) -> np.ndarray:
  """Validated, sorted integer orders >= 2 (Thm 1 and Zhu-Wang need integers)."""
  if orders is None:
    return np.asarray(DEFAULT_INTEGER_ORDERS, dtype=np.float64)
  arr = _validate.real_array("orders", orders, low=2.0)
  bad = arr[arr != np.floor(arr)]
  if bad.size:
    raise ValueError(f"orders must be integers >= 2 for subsampled tuning (Koskela-Kulkarni "
                     f"Thm 1 and the Zhu-Wang bound expand binomial sums), got {bad[0]!r}")
  return np.unique(arr)


def _log_binom(n, k):
  return special.gammaln(n + 1) - special.gammaln(k + 1) - special.gammaln(n - k + 1)


def _weighted(eps: np.ndarray, j: np.ndarray) -> np.ndarray:
  """(j - 1) eps(j), with the order-1 term defined as 0 (Thm 1: 'multiplied by 0')."""
  out = (j - 1.0) * eps[j.astype(int)]
  return np.where(j == 1, 0.0, out)


def _full_curve(curve_fn, max_order: int) -> np.ndarray:
  """eps at orders 0..max_order (index = order); orders 0, 1 are placeholders (0)."""
  ints = np.arange(2, max_order + 1, dtype=np.float64)
  return np.concatenate([[0.0, 0.0], curve_fn(ints)])


def zhu_wang(eps_fn, q: float, orders: np.ndarray) -> np.ndarray:
  """Poisson-subsampled RDP of a mechanism with RDP `eps_fn` (Zhu & Wang 2019; KK Thm 4).

  eps'(a) = log[(1-q)^{a-1}(a q - q + 1) + C(a,2) q^2 (1-q)^{a-2} e^{eps(2)}
               + 3 sum_{j=3}^a C(a,j) q^j (1-q)^{a-j} e^{(j-1) eps(j)}] / (a - 1),
  for integer a >= 2 and add/remove-one neighbours. Works for any RDP curve;
  dp-accounting only subsamples its own Gaussian mechanisms.

  Args:
    eps_fn: maps an array of integer orders >= 2 to RDP values.
    q: sampling rate in [0, 1).
    orders: integer orders >= 2.
  """
  if q == 0.0:
    return np.zeros_like(orders)
  q = _validate.probability("q", q)
  eps = _full_curve(eps_fn, int(orders.max()))
  log_q, log_1mq = math.log(q), math.log1p(-q)
  out = np.empty_like(orders)
  for i, a in enumerate(orders):
    j = np.arange(3, int(a) + 1, dtype=np.float64)
    terms = np.concatenate([
        [(a - 1) * log_1mq + math.log(a * q - q + 1),
         _log_binom(a, 2) + 2 * log_q + (a - 2) * log_1mq + eps[2]],
        math.log(3) + _log_binom(a, j) + j * log_q + (a - j) * log_1mq + _weighted(eps, j)])
    out[i] = special.logsumexp(terms) / (a - 1)
  return out


def variant1(tune_fn, base_fn, q: float, orders: np.ndarray) -> np.ndarray:
  """KK Theorem 1: RDP of tuning on X1 ~ Poisson(q) and training the final model on X \\ X1.

  eps(a) = max(eps1(a), eps2(a)) with, writing T = eps_tune, B = eps_base and
  (j-1)eps(j) = 0 at j = 1,
  eps1(a) = log[q^a e^{(a-1)T(a)} + (1-q)^a e^{(a-1)B(a)}
               + sum_{j=1}^{a-1} C(a,j) q^{a-j}(1-q)^j e^{(a-j-1)T(a-j)} e^{(j-1)B(j)}] / (a-1),
  eps2(a) = log[(1-q)^{a-1} e^{(a-1)B(a)}
               + sum_{j=1}^{a-1} C(a-1,j) q^j (1-q)^{a-1-j} e^{j T(j+1)} e^{(a-j-1)B(a-j)}] / (a-1).
  eps1 bounds D_a(M(X u {x}) || M(X)), eps2 the reverse direction.
  """
  top = int(orders.max())
  tune, base = _full_curve(tune_fn, top), _full_curve(base_fn, top)
  if q == 0.0:
    return base[orders.astype(int)]
  if q == 1.0:
    return tune[orders.astype(int)]
  log_q, log_1mq = math.log(q), math.log1p(-q)
  out = np.empty_like(orders)
  for i, a in enumerate(orders):
    j = np.arange(1, int(a), dtype=np.float64)
    e1 = np.concatenate([
        [a * log_q + (a - 1) * tune[int(a)], a * log_1mq + (a - 1) * base[int(a)]],
        _log_binom(a, j) + (a - j) * log_q + j * log_1mq + _weighted(tune, a - j) + _weighted(base, j)])
    e2 = np.concatenate([
        [(a - 1) * log_1mq + (a - 1) * base[int(a)]],
        _log_binom(a - 1, j) + j * log_q + (a - 1 - j) * log_1mq + j * tune[(j + 1).astype(int)]
        + _weighted(base, a - j)])
    out[i] = max(special.logsumexp(e1), special.logsumexp(e2)) / (a - 1)
  return out


def variant2(tune_fn, base_fn, q: float, orders: np.ndarray) -> np.ndarray:
  """Variant 2: Zhu-Wang-subsampled tuning RDP composed with the final run on all of X."""
  return zhu_wang(tune_fn, q, orders) + base_fn(orders)


def parallel_composition(curves: Sequence[np.ndarray]) -> np.ndarray:
  """RDP of mechanisms on disjoint shards, even adaptive: the pointwise max (KK App. E)."""
  if not curves:
    raise ValueError("curves must be non-empty")
  return np.max(np.stack([np.asarray(c, dtype=np.float64) for c in curves]), axis=0)
