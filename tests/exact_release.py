"""Exact privacy of a one-dimensional Gaussian release on two neighbouring data sets.

A release that is N(m0, s0^2) on D and N(m1, s1^2) on D' has hockey-stick
divergence delta(eps) = P0[L > eps] - e^eps P1[L > eps], with L the log
likelihood ratio. L is quadratic in x (linear when s0 = s1), so the region
{L > eps} is a half-line, an interval or the complement of one, and both
probabilities are normal CDFs: no integration, no binning. These helpers are
what the DP score and DP-SGD normaliser tests compare the accounted epsilon to.
"""

from __future__ import annotations

import math

from scipy import stats


def _region(m0, s0, m1, s1, eps):
  """Intervals (lo, hi) where log N(x; m0, s0) - log N(x; m1, s1) > eps."""
  # L(x) = a x^2 + b x + c
  a = -0.5 / s0**2 + 0.5 / s1**2
  b = m0 / s0**2 - m1 / s1**2
  c = -0.5 * m0**2 / s0**2 + 0.5 * m1**2 / s1**2 + math.log(s1 / s0) - eps
  if a == 0.0:
    if b == 0.0:
      return [(-math.inf, math.inf)] if c > 0 else []
    root = -c / b
    return [(root, math.inf)] if b > 0 else [(-math.inf, root)]
  disc = b * b - 4 * a * c
  if disc <= 0:
    return [(-math.inf, math.inf)] if a > 0 else []
  r1, r2 = sorted(((-b - math.sqrt(disc)) / (2 * a), (-b + math.sqrt(disc)) / (2 * a)))
  return [(-math.inf, r1), (r2, math.inf)] if a > 0 else [(r1, r2)]


def _mass(m, s, intervals):
  # Upper tails through the survival function: 1 - cdf would cancel to nothing.
  return sum(stats.norm.sf(lo, m, s) - stats.norm.sf(hi, m, s) if lo > m
             else stats.norm.cdf(hi, m, s) - stats.norm.cdf(lo, m, s) for lo, hi in intervals)


def delta_one_way(m0, s0, m1, s1, eps):
  """sup_S P0(S) - e^eps P1(S) for P0 = N(m0, s0^2), P1 = N(m1, s1^2)."""
  region = _region(m0, s0, m1, s1, eps)
  return max(0.0, _mass(m0, s0, region) - math.exp(eps) * _mass(m1, s1, region))


def delta(m0, s0, m1, s1, eps):
  """The larger of the two directions' hockey-stick divergences."""
  return max(delta_one_way(m0, s0, m1, s1, eps), delta_one_way(m1, s1, m0, s0, eps))


def epsilon(m0, s0, m1, s1, target_delta, hi=200.0):
  """The smallest eps with delta(eps) <= target_delta (bisection to 1e-12)."""
  lo = 0.0
  if delta(m0, s0, m1, s1, lo) <= target_delta:
    return 0.0
  for _ in range(200):
    mid = 0.5 * (lo + hi)
    if delta(m0, s0, m1, s1, mid) <= target_delta:
      hi = mid
    else:
      lo = mid
    if hi - lo < 1e-12:
      break
  return hi


def gaussian_mechanism_epsilon(mu, target_delta):
  """epsilon of the Gaussian mechanism with sensitivity / std = mu (the closed form)."""
  return epsilon(0.0, 1.0, mu, 1.0, target_delta)

