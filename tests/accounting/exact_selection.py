"""Exact privacy of repeat-and-select on small mechanisms, for soundness tests.

For a base Q on a totally ordered finite output space y_1 < ... < y_n, the
best of K independent runs has law A(y_j) = f(C_j) - f(C_{j-1}),
C_j = Q(<= y_j), plus an atom f(0) at the fixed default output (K = 0).

A Gaussian score is handled by binning: binning is monotone, so the binned
best-of-K is the best-of-K of the binned base, and binning is a
post-processing, so every divergence computed here is a lower bound of the
true one that converges to it as bins shrink. A bound below these numbers is
therefore a real privacy bug.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special, stats


def best_of_k(q: np.ndarray, dist) -> np.ndarray:
  """Law of the best of K runs; index 0 is the K = 0 default, then the outputs in order."""
  q = np.asarray(q, dtype=np.float64)
  q = q / q.sum()
  cdf = np.minimum(np.concatenate([[0.0], np.cumsum(q)]), 1.0)
  f = np.asarray(dist.pgf(cdf), dtype=np.float64)
  diff = np.diff(f)
  # f(C_j) - f(C_{j-1}) cancels catastrophically for tiny bins; there the mean
  # value theorem with f' at the bin midpoint is accurate to O(q_j^2 f'').
  mid = q * np.asarray(dist.pgf_derivative(np.minimum(cdf[:-1] + 0.5 * q, 1.0)))
  imprecise = q < 1e-7 * np.maximum(f[1:], 1e-300)
  return np.concatenate([[f[0]], np.where(imprecise, mid, np.maximum(diff, 0.0))])


def renyi(p: np.ndarray, r: np.ndarray, lam: float) -> float:
  """D_lam(p || r) for discrete laws, in log space."""
  mask = p > 0
  if np.any(mask & (r == 0)):
    return math.inf
  terms = lam * np.log(p[mask]) + (1 - lam) * np.log(r[mask])
  return float(special.logsumexp(terms) / (lam - 1))


def hockey_stick(p: np.ndarray, r: np.ndarray, eps: float) -> float:
  """H_{e^eps}(p || r) = sum (p - e^eps r)_+."""
  return float(np.sum(np.maximum(p - math.exp(eps) * r, 0.0)))


def randomized_response(eps: float) -> tuple[np.ndarray, np.ndarray]:
  """The worst eps-DP pair on two ordered outputs."""
  a = math.exp(eps) / (1 + math.exp(eps))
  return np.array([1 - a, a]), np.array([a, 1 - a])


def geometric_mechanism(eps: float, n: int = 12) -> tuple[np.ndarray, np.ndarray]:
  """Two-sided geometric noise on a counting query (0 vs 1), clamped to [0, n]: eps-DP."""
  ys = np.arange(-200, 201)

  def law(c):
    w = np.exp(-eps * np.abs(ys - c))
    w /= w.sum()
    out = np.zeros(n + 1)
    np.add.at(out, np.clip(ys, 0, n), w)
    return out

  return law(n // 2), law(n // 2 + 1)


def gaussian_bins(sigma: float, shift: float = 1.0, n_bins: int = 40000,
                  width: float = 14.0) -> tuple[np.ndarray, np.ndarray]:
  """N(0, sigma^2) vs N(shift, sigma^2), binned finely (tails folded into end bins)."""
  lo, hi = -width * sigma, shift + width * sigma
  edges = np.concatenate([[-np.inf], np.linspace(lo, hi, n_bins - 1), [np.inf]])

  def law(mu):
    # Differences of the survival function keep upper-tail bins accurate.
    sf = stats.norm.sf(edges, loc=mu, scale=sigma)
    cdf = stats.norm.cdf(edges, loc=mu, scale=sigma)
    return np.where(edges[1:] > mu, sf[:-1] - sf[1:], cdf[1:] - cdf[:-1])

  return law(0.0), law(shift)


def pairs_both_ways(q0: np.ndarray, q1: np.ndarray):
  """The four (Q, Q') pairs: both neighbour orders x both score orientations."""
  for a, b in ((q0, q1), (q1, q0)):
    yield a, b
    yield a[::-1], b[::-1]
