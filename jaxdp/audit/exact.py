"""The exact privacy profile of the selection gadget's whole search.

The gadget (`jaxdp.audit.attacks.selection_gadget`) trains each candidate by
one full-batch Gaussian step on a scalar, so a candidate drawn from the grid
scores S = b c + sigma Z: c = 1 for an arm sensitive to the canary (chosen
with probability p_1 = (arms - 1) / arms, the grid being drawn uniformly with
replacement), 0 otherwise; b = 1 on D' (the canary is there), 0 on D; Z
standard normal. The search draws K ~ law, K independent candidates, and
releases the best one's arm and score (nothing when K = 0, with the same
probability G(0) on both sides). With one candidate's score CDF F_b and the
probability generating function G of K, the released (arm class c, score s)
has the density

  f_b(c, s) = p_c phi_sigma(s - b c) G'(F_b(s)),
  F_0(s) = Phi(s / sigma),  F_1(s) = p_0 Phi(s / sigma) + p_1 Phi((s - 1) / sigma),

(sum over k of P(K = k) k F^{k-1}: the best of k has density k f F^{k-1}, the
arm of the best is the arm of that draw). The hockey-stick divergences
delta_{D'||D}(eps) = int (f_1 - e^eps f_0)_+ and delta_{D||D'} have no closed
form, so `GadgetProfile` brackets them on a grid of score cells with rigorous
bounds (no quadrature error estimate is trusted):

  * lower: the divergence of the cell-binned release, a post-processing of
    the release, so no larger (data processing): sum over cells of
    (lower mass under P - e^eps upper mass under Q)_+;
  * upper: on a cell, (f_P - e^eps f_Q)_+ <= f_P (1 - e^eps r)_+ with r a
    lower bound of f_Q / f_P there, plus all of P's mass outside the grid.

Cell masses are bracketed by Phi differences times G' at the cell's ends (G'
and F_b increase), and r by the same monotonicity and the Gaussian ratio's
(monotone in s). Everything is float64 at the sigma that runs, and every
rounding is added to the bracket (`GadgetProfile`, Guarantees). `epsilon(delta)` returns the pair (eps_lo, eps_hi) with
delta_lower(eps_lo) = delta_upper(eps_hi) = delta up to bisection: the true
epsilon of the gadget's search lies between them, and `eps_hi`, the private
side, is the "exact" epsilon an audit reports.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import special

from jaxdp import _validate
from jaxdp.accounting import distributions as dist_lib
from jaxdp.train.noise import round_up_float32


# Rounding model of the tables (see `GadgetProfile`'s Guarantees). _U: float64's machine epsilon,
# used as a generous stand-in for one rounding (which is at most _U / 2).
_U = float(np.finfo(np.float64).eps)
# scipy.special.ndtr's relative error, assumed: 2.3e-13 measured against 40-digit mpmath on
# [-37.5, 8] (the tests re-measure it); 1e-12 leaves a factor of four.
NDTR_RTOL = 1e-12
# A law's pgf_derivative on [0, 1], relative error per unit of max(1, E[K]), assumed: the laws of
# `jaxdp.accounting` measure 30 ulps (7e-15) or less at E[K] <= 50 against mpmath.
PGF_RTOL = 1e-12
# Absolute slack per value: covers ndtr's underflow to subnormals or 0 (true values below 1e-300).
_TINY = 1e-300


def _gauss_edges(x: np.ndarray):
  """Phi and 1 - Phi at the computed points `x`, with their error: (cdf, sf, rel).

  `x` is (s - shift) / sigma computed in float64 (at most two roundings: a
  relative theta <= 2.0001 _U of x). `cdf` = ndtr(x) and `sf` = ndtr(-x) are
  each within a relative `rel` (plus _TINY) of Phi and 1 - Phi at the exact
  point: ndtr's own NDTR_RTOL, and the argument's rounding, which moves the
  smaller of the two by phi(x) |x| theta <= (1 + x^2) theta of itself (Mills:
  Phi(-|x|) >= phi(x) |x| / (1 + x^2)) and the larger (>= 1/2) by less,
  counted as 4 _U (1 + x^2).
  """
  return special.ndtr(x), special.ndtr(-x), NDTR_RTOL + 4.0 * _U * (1.0 + x * x)


def _cell_masses(x: np.ndarray):
  """Bounds (lower, upper) on Phi(x_hi) - Phi(x_lo) for the cells between consecutive points `x`.

  Where a cell lies above 0 the difference is taken of survival values
  (1 - Phi), so that neither end has already rounded to 1; its error is the
  two ends' (a relative `rel` of each value subtracted, plus _TINY) and the
  subtraction's own rounding.
  """
  cdf, sf, rel = _gauss_edges(x)
  upper = x[:-1] > 0
  at_lo = np.where(upper, sf[:-1], cdf[:-1])
  at_hi = np.where(upper, sf[1:], cdf[1:])
  diff = np.where(upper, at_lo - at_hi, at_hi - at_lo)
  err = (rel[:-1] * at_lo + rel[1:] * at_hi + 2.0 * _TINY) * (1.0 + 4.0 * _U) + 2.0 * _U * np.abs(diff)
  return np.maximum(diff - err, 0.0), diff + err


def _times(e: float, r: np.ndarray) -> np.ndarray:
  """e r rounded down (2 _U), with inf * 0 read as 0: a lower bound on e^eps times a ratio's lower bound."""
  with np.errstate(invalid="ignore", over="ignore"):
    return np.where(r > 0, e * r * (1.0 - 2.0 * _U), 0.0)


@dataclasses.dataclass(frozen=True)
class GadgetProfile:
  """The privacy profile of the gadget's best-of-K release, bracketed on `cells` score cells.

  Attributes:
    noise_multiplier: sigma of each candidate's step as it runs: the device
      adds noise with the smallest float32 >= the sigma given
      (`jaxdp.train.noise.round_up_float32`), so that value, held exactly as a
      float64 Python float, is the sigma whose epsilon is bracketed.
    distribution: K's law.
    arms: grid size; arms 1..arms-1 are sensitive.
    cells: score cells over [-span sigma, 1 + span sigma].
    span: grid half-width in units of sigma.

  Guarantees:
    For every epsilon, `deltas(epsilon)` = (lower, upper) satisfies lower <=
    max(delta_{D'||D}(epsilon), delta_{D||D'}(epsilon)) <= upper for the
    release of the model in the module docstring at sigma =
    `noise_multiplier`, and `epsilon(delta)` = (eps_lo, eps_hi) satisfies
    eps_lo <= eps_true(delta) <= eps_hi (so eps_lo <= eps_hi: never
    inverted). Everything is float64 and every float64 operation's rounding
    is accounted for: each Phi value is widened by NDTR_RTOL plus its
    argument's rounding, each G' value by PGF_RTOL max(1, E[K]) (and its
    argument F_b by F_b's error, G' being increasing), each product,
    quotient and exp by a few ulps, each (a - b)_+ by its operands'
    widening, and each sum of n nonnegative terms by a relative n ulps. The
    two assumptions are the accuracy of scipy's ndtr (NDTR_RTOL = 1e-12,
    4x its measured worst) and of the law's pgf_derivative (PGF_RTOL =
    1e-12 per unit of max(1, E[K]), over 100x the measured worst). These
    slacks cost about 5e-8 of delta (1e-8 of epsilon: mostly ndtr's error
    over the narrow cells' Phi differences); the bracket's width is that of the cells
    (relative 1e-5 of epsilon at the default 200,000 cells, more for laws
    whose G' varies fast, e.g. 1e-3 for K = 10 fixed). The model is the
    continuous one: the float32 rounding of the device's own arithmetic
    (w = sigma Z + c in float32) is not part of it.
  """
  noise_multiplier: float
  distribution: dist_lib.KDistribution
  arms: int = 2
  cells: int = 200_000
  span: float = 12.0

  def __post_init__(self):
    sigma = _validate.real("noise_multiplier", self.noise_multiplier, low=0.0)
    # float(), not the float32 array: every table below must be float64 at exactly this sigma.
    object.__setattr__(self, "noise_multiplier", float(round_up_float32(sigma)) if sigma > 0 else 0.0)
    dist_lib.check_distribution(self.distribution)
    _validate.integer("arms", self.arms, low=2)
    _validate.integer("cells", self.cells, low=10)
    _validate.real("span", self.span, low=1.0)
    if self.private:
      object.__setattr__(self, "_tables", self._build_tables())

  @property
  def private(self) -> bool:
    """False without noise: the sensitive arm's score then reveals the canary, epsilon = inf."""
    return self.noise_multiplier > 0 and float(self.distribution.sf(0)) > 0

  def _build_tables(self):
    """Per cell and arm class: bracketed masses on D and D', and bracketed ratios f_0 / f_1."""
    sigma, dist = self.noise_multiplier, self.distribution
    edges = np.linspace(-self.span * sigma, 1.0 + self.span * sigma, self.cells + 1, dtype=np.float64)
    lo, hi = edges[:-1], edges[1:]
    # p_0 = 1 / arms, p_1 = (arms - 1) / arms: one rounding each.
    p = np.array([1.0 / self.arms, (self.arms - 1.0) / self.arms])
    x0, x1 = edges / sigma, (edges - 1.0) / sigma  # exact sigma; one and two roundings
    gauss = {0: _gauss_edges(x0), 1: _gauss_edges(x1)}
    # F_b at every edge, bracketed: F_0 = Phi(x0), F_1 = p_0 Phi(x0) + p_1 Phi(x1).
    cdf_lo = {s: gauss[s][0] * (1.0 - gauss[s][2]) - _TINY for s in (0, 1)}
    cdf_hi = {s: gauss[s][0] * (1.0 + gauss[s][2]) + _TINY for s in (0, 1)}
    f_lo = [cdf_lo[0] * (1.0 - 2.0 * _U), (p[0] * cdf_lo[0] + p[1] * cdf_lo[1]) * (1.0 - 8.0 * _U)]
    f_hi = [cdf_hi[0] * (1.0 + 2.0 * _U), (p[0] * cdf_hi[0] + p[1] * cdf_hi[1]) * (1.0 + 8.0 * _U)]
    g_rel = PGF_RTOL * max(1.0, float(dist.mean))
    g = lambda x: np.asarray(dist.pgf_derivative(np.clip(x, 0.0, 1.0)), np.float64)
    # G' increases: its extremes on a cell are at the ends, at the ends' extreme F.
    g_lo = [g(f[:-1]) * (1.0 - g_rel) for f in f_lo]
    g_hi = [g(f[1:]) * (1.0 + g_rel) for f in f_hi]
    gauss_masses = {0: _cell_masses(x0), 1: _cell_masses(x1)}
    masses = {}
    for b in (0, 1):
      for c in (0, 1):
        m_lo, m_hi = gauss_masses[b * c]
        masses[b, c] = (m_lo * p[c] * g_lo[b] * (1.0 - 8.0 * _U), m_hi * p[c] * g_hi[b] * (1.0 + 8.0 * _U))
    with np.errstate(divide="ignore", invalid="ignore"):
      # f_0 / f_1 on a cell: Gaussian ratio exp(-(2s - 1) c / (2 sigma^2)) (decreasing in s) times
      # G'(F_0(s)) / G'(F_1(s)), within [G'(F_0(lo)) / G'(F_1(hi)), G'(F_0(hi)) / G'(F_1(lo))].
      g_min = np.where(g_hi[1] > 0, g_lo[0] / g_hi[1], 0.0) * (1.0 - 2.0 * _U)
      g_max = np.where(g_lo[1] > 0, g_hi[0] / g_lo[1], np.inf) * (1.0 + 2.0 * _U)
    ratios = {}
    for c in (0, 1):
      # Three roundings in the exponent (a relative 4 _U of it), then exp and the product (4 _U).
      arg_hi = -(2.0 * lo - 1.0) * c / (2.0 * sigma**2)  # largest on the cell (at lo)
      arg_lo = -(2.0 * hi - 1.0) * c / (2.0 * sigma**2)
      with np.errstate(over="ignore", invalid="ignore"):
        r_lo = np.exp(arg_lo - 4.0 * _U * np.abs(arg_lo)) * g_min * (1.0 - 4.0 * _U)
        r_hi = np.exp(arg_hi + 4.0 * _U * np.abs(arg_hi)) * g_max * (1.0 + 4.0 * _U)
      ratios[c] = (np.nan_to_num(r_lo, nan=0.0), np.nan_to_num(r_hi, nan=np.inf))
    # All of a side's released mass outside the grid: below it every one of K >= 1 draws is, with
    # probability G(F(e_0)) - G(0) <= E[K] F(e_0) (G convex); above it one draw at least, with
    # probability <= E[K] (1 - F(e_n)) (union bound). No cancellation, unlike G(F) - G(0).
    tails = []
    mean_hi = float(g(1.0)) * (1.0 + g_rel)
    sf_hi = {s: gauss[s][1][-1] * (1.0 + gauss[s][2][-1]) + _TINY for s in (0, 1)}
    below = [f_hi[0][0], f_hi[1][0]]
    above = [sf_hi[0] * (1.0 + 2.0 * _U), (p[0] * sf_hi[0] + p[1] * sf_hi[1]) * (1.0 + 8.0 * _U)]
    for b in (0, 1):
      tails.append(float(min(1.0, mean_hi * (below[b] + above[b]) * (1.0 + 4.0 * _U))))
    return masses, ratios, tails

  def deltas(self, epsilon: float) -> tuple[float, float]:
    """(lower, upper) bounds on max(delta_{D'||D}, delta_{D||D'}) at `epsilon`.

    Raises:
      ValueError: `epsilon` is not a finite real number >= 0.
    """
    forward, backward = self.direction_deltas(epsilon)
    return max(forward[0], backward[0]), max(forward[1], backward[1])

  def direction_deltas(self, epsilon: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """((lower, upper) of delta_{D'||D}, (lower, upper) of delta_{D||D'}) at `epsilon`.

    Raises:
      ValueError: `epsilon` is not a finite real number >= 0.
    """
    epsilon = _validate.real("epsilon", epsilon, low=0.0)
    if not self.private:
      return (0.0, 1.0), (0.0, 1.0)  # no claim: epsilon() says inf
    masses, ratios, tails = self._tables
    with np.errstate(over="ignore"):
      e = math.exp(epsilon) if epsilon < 709.0 else math.inf
    # exp is within an ulp or two: e_lo <= e^eps <= e_hi.
    e_lo, e_hi = e * (1.0 - 4.0 * _U), e * (1.0 + 4.0 * _U)
    lower, upper = [0.0, 0.0], [tails[1], tails[0]]
    with np.errstate(invalid="ignore", over="ignore"):
      for c in (0, 1):
        r_lo, r_hi = ratios[c]
        m0_lo, m0_hi = masses[0, c]
        m1_lo, m1_hi = masses[1, c]
        # Direction D' || D (P = f_1, Q = f_0; Q / P >= r_lo) and D || D' (P = f_0, Q = f_1; Q / P >= 1 / r_hi).
        # Lower: the binned divergence, Q's mass rounded up (2 _U for the product) and P's down.
        # Upper: (1 - e r)_+ with e r rounded down and 2 _U added for the subtraction's rounding.
        inv = np.where(np.isfinite(r_hi), 1.0 / r_hi, 0.0) * (1.0 - 2.0 * _U)
        lower[0] += float(np.sum(np.nan_to_num(np.maximum(m1_lo - e_hi * m0_hi * (1.0 + 2.0 * _U), 0.0))))
        upper[0] += float(np.sum(m1_hi * np.maximum(1.0 + 2.0 * _U - _times(e_lo, r_lo), 0.0)))
        lower[1] += float(np.sum(np.nan_to_num(np.maximum(m0_lo - e_hi * m1_hi * (1.0 + 2.0 * _U), 0.0))))
        upper[1] += float(np.sum(m0_hi * np.maximum(1.0 + 2.0 * _U - _times(e_lo, inv), 0.0)))
    # Sums of up to 2 cells + 1 nonnegative terms in any order: within a relative (2 cells + 1) _U;
    # 4 cells _U, generously.
    slack = 4.0 * self.cells * _U
    return tuple((lower[k] * (1.0 - slack), min(1.0, upper[k] * (1.0 + slack))) for k in (0, 1))

  def epsilon(self, delta: float) -> tuple[float, float]:
    """(eps_lo, eps_hi): the gadget search's true epsilon at `delta` lies between them.

    eps_hi is where the upper bound on delta has come down to `delta`, eps_lo
    the last point found where the lower bound is still above it (a
    bisection to relative 1e-9 of each), so eps_lo <= eps_true <= eps_hi
    (see the class's Guarantees). inf for the non-private gadget.

    Raises:
      ValueError: `delta` is not in (0, 1).
    """
    delta = _validate.probability("delta", delta)
    if not self.private:
      return math.inf, math.inf
    return self._solve(delta, 0), self._solve(delta, 1)

  def _solve(self, delta: float, which: int) -> float:
    # Invariant: deltas(lo)[which] > delta >= deltas(hi)[which]. For the lower bound (which = 0)
    # that puts eps_true above lo, for the upper one below hi: each end returns its own side.
    lo, hi = 0.0, 1.0
    if self.deltas(0.0)[which] <= delta:
      return 0.0
    while self.deltas(hi)[which] > delta:
      lo, hi = hi, 2.0 * hi
      if hi > 1e4:
        return lo if which == 0 else math.inf
    while hi - lo > 1e-9 * max(1.0, hi):
      mid = 0.5 * (lo + hi)
      lo, hi = (mid, hi) if self.deltas(mid)[which] > delta else (lo, mid)
    return lo if which == 0 else hi

  def log_ratio(self, sensitive, score) -> np.ndarray:
    """log f_1(c, s) / f_0(c, s) at releases (arm class c, score s): the Neyman-Pearson statistic.

    Thresholding it is the most powerful test of D' against D at every
    level, so an audit that uses it (`jaxdp.audit.attacks.selection_gadget`
    with `distribution=`) is limited by its trials, not by its statistic.
    """
    c = np.asarray(sensitive, np.float64)
    s = np.asarray(score, np.float64)
    sigma, p1 = self.noise_multiplier, 1.0 - 1.0 / self.arms
    f0 = special.ndtr(s / sigma)
    f1 = (1.0 - p1) * f0 + p1 * special.ndtr((s - 1.0) / sigma)
    g = lambda x: np.asarray(self.distribution.pgf_derivative(np.clip(x, 0.0, 1.0)), np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
      selection = np.log(g(f1)) - np.log(g(f0))
    # Far below every score a search releases G' can underflow to 0 on both sides: no evidence.
    return c * (2.0 * s - 1.0) / (2.0 * sigma**2) + np.nan_to_num(selection, nan=0.0, posinf=0.0, neginf=0.0)
