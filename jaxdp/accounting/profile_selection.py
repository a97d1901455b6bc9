"""Privacy-profile (hockey-stick) bounds for private selection.

Koskela, Redberg & Wang, "Privacy profiles for private selection" (ICML 2024),
KRW below. Formulas are the reconstructions of REFERENCE section 4 (the
extraction lost most of the math); every one is an instance of this recipe.

**Shift recipe** (KRW Thm 4.1 with f(z) = (z - e^eps)_+). The best of K runs
has law A(y) = Q(y) E_t[f'(q_y(t))], where q_y(t) = E_Q[g_t] for the
post-processing g_t = 1[y' < y] + t 1[y' = y], t ~ U[0, 1], and likewise A'
with the *same* g_t (f is the PGF of K). If f'(q)/f'(q') <= e^c for every pair
(q, q') = (E_Q g, E_Q' g), then
  [Q(y) f'(q) - e^eps Q'(y) f'(q')]_+ <= f'(q) [Q(y) - e^(eps-c) Q'(y)]_+,
and f' <= f'(1) = m = E[K], so the outputs of runs add at most m delta_Q(eps - c)
to H_{e^eps}(A || A'), for every real eps. The K = 0 atom has mass P[K=0] on
both sides: it adds (1 - e^eps) P[K=0] for eps < 0 and nothing for eps >= 0,
so H_{e^eps}(A || A') <= m delta_Q(eps - c) at every eps >= 0.
Any (eps1, delta1 = delta_Q(eps1)) gives such a c: post-processing keeps
q <= e^eps1 q' + delta1 and (1-q') <= e^eps1 (1-q) + delta1. The bound
separates: eps_A(delta) = eps_Q(delta/m) + min_{eps1 >= 0} c(eps1). The
minimisation over eps1 is numerical (a grid plus golden-section refinement):
it may miss the optimum, which only loosens the bound; c is then evaluated
exactly at the chosen eps1 with an upper bound of delta_Q, so the result stays
valid.

Per distribution of K (PGF f, m = E[K]):
  * truncated negative binomial (KRW Thm 5.2; geometric eta = 1, logarithmic
    eta = 0): f'(x) ~ (gamma + (1-gamma)(1-x))^(-eta-1), hence with u = 1-q,
    u' = 1-q' and u' <= e^eps1 u + delta1:
      c = (eta+1) log(e^eps1 + (1-gamma)/gamma delta1)              ["profile"]
    **Refined** ("profile-refined", not in the paper). The ratio
    (gamma + (1-gamma)(e^eps1 u + delta1)) / (gamma + (1-gamma) u) is a
    linear-fractional function of u in [0, 1], hence monotone, so its maximum
    is at u = 0 or u = 1:
      c = (eta+1) log max(1 + (1-gamma)/gamma delta1,
                          gamma + (1-gamma) e^eps1 + (1-gamma) delta1).
    Both arguments are <= the printed one (gamma <= gamma e^eps1 and
    (1-gamma) delta1 <= (1-gamma)/gamma delta1), so this is never looser.
    Pure eps-DP (delta1 = 0 at eps1 = eps): (eta+2) eps (KRW Cor 5.3, PS Cor 3);
    an (eps, delta)-DP point gives KRW Cor 5.4.
  * Binomial(n, p) (KRW Thm 5.7): f'(q)/f'(q') = ((1-p+pq)/(1-p+pq'))^(n-1),
    again linear-fractional in q', endpoints 1 + p delta1/(1-p) (q' = 0) and
    1 + p(e^eps1 - 1) + p delta1 (q' = 1). The theorem takes the second and
    requires eps1 >= log(1 + p/(1-p) delta1), where it is the larger;
    c = (n-1) log(1 + p(e^eps1 - 1) + p delta1). c is non-decreasing in eps1 for
    exact profiles, so we take the smallest eps1 meeting the condition
    (bisection). "profile-refined" takes the max of both endpoints and needs no
    condition (its minimum is the same point).
  * Poisson(m) (KRW Cor 5.8): f'(q)/f'(q') = e^(m(q-q')),
    c = m(e^eps1 - 1) + m delta1; refined (KRW App. C.8, from the complement
    constraint): c = m(1 - e^-eps1 (1 - delta1)). Both equal m delta_Q(0) at
    eps1 = 0, which is optimal for exact profiles.
  * Fixed(k) and other laws: no profile theorem; `NotApplicableError`.

Report Noisy Max (KRW Thm 3.2 / 3.3) is a base profile: see `profiles`.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import numpy as np

from jaxdp.accounting import distributions as dist_lib
from jaxdp.accounting import profiles as prof_lib
from jaxdp.accounting.events import NotApplicableError

_GRID = 160
_GOLDEN_ITERS = 40


# ----------------------------------------------------------------------------
# c(eps1) for each distribution.  Each takes (eps1 array, delta1 array) -> c array.
# ----------------------------------------------------------------------------

def tnb_shift(eps1, delta1, eta: float, gamma: float, refined: bool = False,
              log_gamma: Optional[float] = None) -> np.ndarray:
  """c(eps1) of KRW Thm 5.2 (refined: linear-fractional endpoint maximum).

  In log space: gamma may underflow to 0 (TNB with eta near -1 and a large
  mean), so `log_gamma` (default log(gamma)) carries it.
  """
  eps1, delta1 = np.asarray(eps1, dtype=np.float64), np.asarray(delta1, dtype=np.float64)
  log_gamma = math.log(gamma) if log_gamma is None else float(log_gamma)
  with np.errstate(divide="ignore"):
    log_ratio_delta = math.log1p(-gamma) - log_gamma + np.log(delta1)  # log((1-gamma)/gamma delta1)
  if not refined:
    log_inner = np.logaddexp(eps1, log_ratio_delta)
  else:
    log_inner = np.maximum(np.logaddexp(0.0, log_ratio_delta),
                           np.log(gamma + (1.0 - gamma) * (np.exp(eps1) + delta1)))
  return (eta + 1.0) * log_inner


def poisson_shift(eps1, delta1, mean: float, refined: bool = False) -> np.ndarray:
  """c(eps1) of KRW Cor 5.8 (refined: also App. C.8's complement form, take the min)."""
  eps1, delta1 = np.asarray(eps1, dtype=np.float64), np.asarray(delta1, dtype=np.float64)
  c = mean * (np.expm1(eps1) + delta1)
  if refined:
    c = np.minimum(c, mean * (-np.expm1(-eps1) + np.exp(-eps1) * delta1))
  return c


def binomial_shift(eps1, delta1, n: int, p: float, refined: bool = False) -> np.ndarray:
  """c(eps1) of KRW Thm 5.7; +inf where its condition fails (unless refined)."""
  eps1, delta1 = np.asarray(eps1, dtype=np.float64), np.asarray(delta1, dtype=np.float64)
  with np.errstate(over="ignore"):
    upper = np.log1p(p * np.expm1(eps1) + p * delta1)
  # Past exp's range (eps1 of a pure base beyond ~709.78) the same value as
  # eps1 + log(p + (1 - p + p delta1) e^-eps1).
  big = np.isinf(upper) & np.isfinite(eps1)
  if np.any(big):
    upper = np.where(big, eps1 + np.log(p + (1.0 - p + p * delta1) * np.exp(-eps1)), upper)
  if p == 1.0:
    lower = np.where(delta1 > 0, np.inf, 0.0)
  else:
    lower = np.log1p(p / (1.0 - p) * delta1)
  if refined:
    return (n - 1) * np.maximum(upper, lower)
  ok = eps1 >= lower  # the theorem's condition eps1 >= log(1 + p/(1-p) delta(eps1))
  return np.where(ok, (n - 1) * upper, np.inf)


# ----------------------------------------------------------------------------
# The eps1 search.
# ----------------------------------------------------------------------------

def minimise_shift(profile: prof_lib.PrivacyProfile, shift_fn: Callable, eps1_max: float,
                   ) -> tuple[float, float]:
  """(c*, eps1*) ~ min over eps1 in [0, eps1_max] of shift_fn(eps1, delta_Q(eps1)).

  Grid search plus golden-section refinement around the best grid point; the
  profile's pure epsilon (if any) is also tried. c* is always shift_fn evaluated
  at eps1* with the profile's (upper-bound) delta, hence a valid shift.
  """
  eps1_max = max(float(eps1_max), 1e-9)
  grid = np.linspace(0.0, eps1_max, _GRID)
  if profile.pure_epsilon is not None and profile.pure_epsilon <= eps1_max:
    grid = np.unique(np.append(grid, profile.pure_epsilon))
  vals = np.asarray(shift_fn(grid, profile.delta(grid)), dtype=np.float64)
  i = int(np.argmin(vals))
  best_c, best_e = float(vals[i]), float(grid[i])
  if not math.isfinite(best_c):
    return best_c, best_e
  lo, hi = float(grid[max(i - 1, 0)]), float(grid[min(i + 1, grid.size - 1)])
  f = lambda e: float(shift_fn(np.array([e]), np.atleast_1d(profile.delta(np.array([e]))))[0])
  inv_phi = (math.sqrt(5.0) - 1.0) / 2.0
  a, b = lo, hi
  x1, x2 = b - inv_phi * (b - a), a + inv_phi * (b - a)
  f1, f2 = f(x1), f(x2)
  for _ in range(_GOLDEN_ITERS):
    if b - a < 1e-9:
      break
    if f1 <= f2:
      b, x2, f2 = x2, x1, f1
      x1 = b - inv_phi * (b - a)
      f1 = f(x1)
    else:
      a, x1, f1 = x1, x2, f2
      x2 = a + inv_phi * (b - a)
      f2 = f(x2)
  for e, c in ((x1, f1), (x2, f2)):
    if c < best_c:
      best_c, best_e = c, e
  return best_c, best_e


def _smallest_feasible_eps1(profile, n: int, p: float) -> float:
  """Smallest eps1 with e^eps1 - 1 >= p/(1-p) delta(eps1) (KRW Thm 5.7's condition).

  The left side increases and the right side decreases in eps1, so bisect;
  return the upper end (feasible). eps1 = log(1/(1-p)) is always feasible.
  """
  def ok(e):
    return float(np.expm1(e)) >= p / (1.0 - p) * float(profile.delta(e))
  if ok(0.0):
    return 0.0
  lo, hi = 0.0, -math.log1p(-p)
  for _ in range(100):
    if hi - lo < 1e-12 * max(1.0, hi):
      break
    mid = 0.5 * (lo + hi)
    if ok(mid):
      hi = mid
    else:
      lo = mid
  return hi


def _pgf_mean(dist) -> float:
  """E[K] = f'(1), never below the nominal mean (gamma is rounded towards larger means)."""
  return max(float(dist.mean), float(dist.pgf_derivative(1.0)))


def has_theorem(dist) -> bool:
  """Whether KRW give a profile bound for K ~ `dist` (TNB, Poisson, binomial)."""
  return isinstance(dist, (dist_lib.TruncatedNegativeBinomial, dist_lib.Poisson, dist_lib.Binomial))


def select(base: prof_lib.PrivacyProfile, dist: dist_lib.KDistribution, refined: bool = False,
           ) -> tuple[prof_lib.PrivacyProfile, str, float, float]:
  """Profile of the best of K ~ `dist` runs of a mechanism with profile `base`.

  Returns:
    (profile, theorem, eps1, c): the bound m * base.delta(eps - c) as a
    profile, the theorem's name, and the chosen eps1 and shift c(eps1).

  Raises:
    NotApplicableError: no theorem for `dist`, or its condition fails.
  """
  m = _pgf_mean(dist)
  tag = " (refined)" if refined else ""
  if isinstance(dist, dist_lib.TruncatedNegativeBinomial):
    eta, gamma = dist.eta, dist.gamma
    shift_fn = lambda e, d: tnb_shift(e, d, eta, gamma, refined, dist.log_gamma)
    c0 = float(shift_fn(np.array([0.0]), np.atleast_1d(base.delta(np.array([0.0]))))[0])
    # c(eps1) >= (eta+1) log(gamma + (1-gamma) e^eps1): beyond this eps1, c > c(0).
    # (Log space: c0 / (eta + 1) overflows exp for eta near -1.) A smaller search
    # range can only miss the optimum, which loosens but never invalidates c.
    x = c0 / (eta + 1.0)
    eps1_max = (x - math.log1p(-gamma) if x > 700.0
                else math.log(max((math.exp(x) - gamma) / (1.0 - gamma), 1.0)))
    eps1_max = min(eps1_max, 60.0)
    c, e1 = minimise_shift(base, shift_fn, eps1_max)
    name = {1.0: "geometric", 0.0: "logarithmic"}.get(eta, f"eta={eta:g}")
    theorem = f"KRW Thm 5.2{tag} (TNB {name}, eps1={e1:.4g})"
  elif isinstance(dist, dist_lib.Poisson):
    shift_fn = lambda e, d: poisson_shift(e, d, dist.mean, refined)
    d0 = float(base.delta(0.0))
    c, e1 = minimise_shift(base, shift_fn, math.log1p(d0))
    theorem = f"KRW Cor 5.8{tag} (Poisson, eps1={e1:.4g})"
  elif isinstance(dist, dist_lib.Binomial):
    n, p = dist.n, dist.p
    shift_fn = lambda e, d: binomial_shift(e, d, n, p, refined)
    if n == 1:
      c, e1 = 0.0, 0.0
    elif p == 1.0:
      if base.pure_epsilon is None:
        raise NotApplicableError(
            "KRW Thm 5.7 with p = 1 needs delta(eps1) = 0 for some eps1 (a pure-DP base)")
      e1 = base.pure_epsilon
      c = float(shift_fn(np.array([e1]), np.array([0.0]))[0])
    else:
      e1 = _smallest_feasible_eps1(base, n, p)
      c = float(shift_fn(np.array([e1]), np.atleast_1d(base.delta(np.array([e1]))))[0])
      if refined:  # no condition: the grid may find a slightly smaller value
        c2, e2 = minimise_shift(base, shift_fn, e1)
        if c2 < c:
          c, e1 = c2, e2
    if not math.isfinite(c):
      raise NotApplicableError("KRW Thm 5.7: no eps1 satisfies eps1 >= log(1 + p/(1-p) delta(eps1))")
    theorem = f"KRW Thm 5.7{tag} (binomial, eps1={e1:.4g})"
  else:
    raise NotApplicableError(
        f"no privacy-profile theorem for K ~ {dist!r} (KRW covers truncated negative "
        "binomial, Poisson and binomial)")
  return prof_lib.ScaledShiftedProfile(base, m, c, theorem, atom=dist.prob_zero), theorem, e1, c


def corollary_6_2(eps1: float, delta1: float, eps_hat: float, dist: dist_lib.TruncatedNegativeBinomial,
                  refined: bool = False) -> float:
  """KRW Cor 6.2: Q is (eps1, delta1)-DP and (eps_hat, delta/m)-DP, K ~ D_{eta,gamma}
  => A is (eps, delta)-DP with eps = eps_hat + (eta+1) log(e^eps1 + (1-gamma)/gamma delta1).

  Used when candidates' guarantees differ (e.g. tuning sigma): each candidate
  must meet both thresholds; see `profiles.MaxProfile` for the profile version.
  """
  c = float(tnb_shift(np.array([eps1]), np.array([delta1]), dist.eta, dist.gamma, refined,
                      dist.log_gamma)[0])
  return eps_hat + c
