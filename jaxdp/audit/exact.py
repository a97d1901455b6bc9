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
(monotone in s). `epsilon(delta)` returns the pair (eps_lo, eps_hi) with
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


def _ndtr_diff(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
  """Phi(hi) - Phi(lo), accurate in both tails (lower tail by ndtr, upper by ndtr(-x))."""
  upper = lo > 0
  return np.where(upper, special.ndtr(-lo) - special.ndtr(-hi), special.ndtr(hi) - special.ndtr(lo))


@dataclasses.dataclass(frozen=True)
class GadgetProfile:
  """The privacy profile of the gadget's best-of-K release, bracketed on `cells` score cells.

  Attributes:
    noise_multiplier: sigma of each candidate's step (as run: rounded up to
      float32, `jaxdp.train.noise.round_up_float32`).
    repetitions: K's law.
    arms: grid size; arms 1..arms-1 are sensitive.
    cells: score cells over [-span sigma, 1 + span sigma].
    span: grid half-width in units of sigma.
  """
  noise_multiplier: float
  repetitions: dist_lib.KDistribution
  arms: int = 2
  cells: int = 200_000
  span: float = 12.0

  def __post_init__(self):
    sigma = _validate.real("noise_multiplier", self.noise_multiplier, low=0.0)
    object.__setattr__(self, "noise_multiplier", round_up_float32(sigma) if sigma > 0 else 0.0)
    dist_lib.check_distribution(self.repetitions)
    _validate.integer("arms", self.arms, low=2)
    _validate.integer("cells", self.cells, low=10)
    _validate.real("span", self.span, low=1.0)
    if self.private:
      object.__setattr__(self, "_tables", self._build_tables())

  @property
  def private(self) -> bool:
    """False without noise: the sensitive arm's score then reveals the canary, epsilon = inf."""
    return self.noise_multiplier > 0 and float(self.repetitions.sf(0)) > 0

  def _build_tables(self):
    """Per cell and arm class: bracketed masses on D and D', and bracketed ratios f_0 / f_1."""
    sigma, dist = self.noise_multiplier, self.repetitions
    edges = np.linspace(-self.span * sigma, 1.0 + self.span * sigma, self.cells + 1)
    lo, hi = edges[:-1], edges[1:]
    p = np.array([1.0 / self.arms, 1.0 - 1.0 / self.arms])
    f0 = lambda s: special.ndtr(s / sigma)
    f1 = lambda s: p[0] * special.ndtr(s / sigma) + p[1] * special.ndtr((s - 1.0) / sigma)
    g = lambda x: np.asarray(dist.pgf_derivative(np.clip(x, 0.0, 1.0)), np.float64)
    g0_lo, g0_hi, g1_lo, g1_hi = g(f0(lo)), g(f0(hi)), g(f1(lo)), g(f1(hi))
    masses = {}
    for b, (g_lo, g_hi) in ((0, (g0_lo, g0_hi)), (1, (g1_lo, g1_hi))):
      for c in (0, 1):
        shift = b * c
        gauss = _ndtr_diff((lo - shift) / sigma, (hi - shift) / sigma) * p[c]
        masses[b, c] = (gauss * g_lo, gauss * g_hi)
    with np.errstate(divide="ignore", invalid="ignore"):
      # f_0 / f_1 on a cell: Gaussian ratio exp(-(2s - 1) c / (2 sigma^2)) (decreasing in s) times
      # G'(F_0(s)) / G'(F_1(s)), within [G'(F_0(lo)) / G'(F_1(hi)), G'(F_0(hi)) / G'(F_1(lo))].
      g_min = np.where(g1_hi > 0, g0_lo / g1_hi, 0.0)
      g_max = np.where(g1_lo > 0, g0_hi / g1_lo, np.inf)
    ratios = {}
    for c in (0, 1):
      log_gauss_hi = -(2.0 * lo - 1.0) * c / (2.0 * sigma**2)  # largest on the cell (at lo)
      log_gauss_lo = -(2.0 * hi - 1.0) * c / (2.0 * sigma**2)
      with np.errstate(over="ignore", invalid="ignore"):
        ratios[c] = (np.exp(log_gauss_lo) * g_min, np.exp(log_gauss_hi) * g_max)
    # All of a side's released mass outside the grid (K >= 1): bounded by its own CDF.
    tails = []
    for cdf in (f0, f1):
      pgf = lambda x: float(dist.pgf(x))
      tails.append(max(0.0, pgf(float(cdf(edges[0]))) - pgf(0.0)) + max(0.0, 1.0 - pgf(float(cdf(edges[-1])))))
    return masses, ratios, tails

  def deltas(self, epsilon: float) -> tuple[float, float]:
    """(lower, upper) bounds on max(delta_{D'||D}, delta_{D||D'}) at `epsilon`."""
    epsilon = _validate.real("epsilon", epsilon, low=0.0)
    if not self.private:
      return 0.0, 1.0  # no claim: epsilon() says inf
    masses, ratios, tails = self._tables
    e = math.exp(epsilon)
    lower, upper = [0.0, 0.0], [tails[1], tails[0]]
    for c in (0, 1):
      r_lo, r_hi = ratios[c]
      m0_lo, m0_hi = masses[0, c]
      m1_lo, m1_hi = masses[1, c]
      # Direction D' || D (P = f_1, Q = f_0; Q / P >= r_lo) and D || D' (P = f_0, Q = f_1; Q / P >= 1 / r_hi).
      lower[0] += float(np.sum(np.maximum(m1_lo - e * m0_hi, 0.0)))
      upper[0] += float(np.sum(m1_hi * np.maximum(1.0 - e * r_lo, 0.0)))
      lower[1] += float(np.sum(np.maximum(m0_lo - e * m1_hi, 0.0)))
      with np.errstate(divide="ignore"):
        inv = np.where(np.isfinite(r_hi), 1.0 / r_hi, 0.0)
      upper[1] += float(np.sum(m0_hi * np.maximum(1.0 - e * inv, 0.0)))
    # Float sums of up to `cells` terms: widen by their rounding (n ulps of the total, generously).
    slack = 4.0 * self.cells * np.finfo(np.float64).eps
    return max(lower) * (1.0 - slack), min(1.0, max(upper) * (1.0 + slack))

  def epsilon(self, delta: float) -> tuple[float, float]:
    """(eps_lo, eps_hi): the gadget search's true epsilon at `delta` lies between them.

    eps_hi is the smallest eps (to 1e-9) where the upper bound on delta is at
    most `delta`; eps_lo the smallest where the lower bound is. inf for the
    non-private gadget.
    """
    delta = _validate.probability("delta", delta)
    if not self.private:
      return math.inf, math.inf
    return self._solve(delta, 0), self._solve(delta, 1)

  def _solve(self, delta: float, which: int) -> float:
    lo, hi = 0.0, 1.0
    if self.deltas(0.0)[which] <= delta:
      return 0.0
    while self.deltas(hi)[which] > delta:
      lo, hi = hi, 2.0 * hi
      if hi > 1e4:
        return math.inf
    while hi - lo > 1e-9 * max(1.0, hi):
      mid = 0.5 * (lo + hi)
      lo, hi = (mid, hi) if self.deltas(mid)[which] > delta else (lo, mid)
    return hi

  def log_ratio(self, sensitive, score) -> np.ndarray:
    """log f_1(c, s) / f_0(c, s) at releases (arm class c, score s): the Neyman-Pearson statistic.

    Thresholding it is the most powerful test of D' against D at every
    level, so an audit that uses it (`jaxdp.audit.attacks.selection_gadget`
    with `repetitions=`) is limited by its trials, not by its statistic.
    """
    c = np.asarray(sensitive, np.float64)
    s = np.asarray(score, np.float64)
    sigma, p1 = self.noise_multiplier, 1.0 - 1.0 / self.arms
    f0 = special.ndtr(s / sigma)
    f1 = (1.0 - p1) * f0 + p1 * special.ndtr((s - 1.0) / sigma)
    g = lambda x: np.asarray(self.repetitions.pgf_derivative(np.clip(x, 0.0, 1.0)), np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
      selection = np.log(g(f1)) - np.log(g(f0))
    # Far below every score a search releases G' can underflow to 0 on both sides: no evidence.
    return c * (2.0 * s - 1.0) / (2.0 * sigma**2) + np.nan_to_num(selection, nan=0.0, posinf=0.0, neginf=0.0)
