"""Renyi-DP bounds for repeat-and-select (Papernot & Steinke, ICLR 2022).

All functions map a base RDP curve on a grid of orders to an RDP curve of the
tuning algorithm A (K runs of Q, release the best). Order-wise formulas follow
the paper; every curve is finally made non-decreasing in the order (Remark 5:
D_lambda is non-decreasing in lambda, so a bound at a larger order also holds at
a smaller one), which repairs the blow-up of log E[K]/(lambda-1) as lambda -> 1.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import numpy as np

from jaxdp.accounting import _dpa
from jaxdp.accounting import distributions as dist_lib



def monotone(rdp: np.ndarray) -> np.ndarray:
  """Running minimum from the right (orders sorted ascending)."""
  return np.minimum.accumulate(np.asarray(rdp, dtype=np.float64)[::-1])[::-1]


def theorem2(orders: np.ndarray, rdp: np.ndarray, dist: dist_lib.TruncatedNegativeBinomial) -> np.ndarray:
  """PS Theorem 2 (truncated negative binomial D_{eta,gamma}, incl. geometric, logarithmic).

  eps'(l) = eps(l) + (1+eta)(1 - 1/l^)eps(l^) + (1+eta) log(1/gamma)/l^ + log E[K]/(l-1),
  minimised over l^ in the grid, then made monotone: exactly dp-accounting's
  `RepeatAndSelectDpEvent` computation. (The theorem also allows l^ = 1, which
  only helps for very weak bases; it is left out to stay identical to
  dp-accounting, and `method="composition"` covers that regime.)
  """
  eta, log_inv_gamma = dist.eta, -dist.log_gamma
  with np.errstate(invalid="ignore"):
    terms = (1.0 - 1.0 / orders) * rdp + log_inv_gamma / orders
  c = (1.0 + eta) * float(np.nanmin(terms))
  return monotone(rdp + c + math.log(dist.mean) / (orders - 1.0))


def corollary4(orders: np.ndarray, rho: float, dist: dist_lib.TruncatedNegativeBinomial) -> np.ndarray:
  """PS Corollary 4: Theorem 2 for a rho-zCDP base with l^ and l optimised continuously.

  With L = log E[K] and l^* = max(1, sqrt(log(1/gamma)/rho)):
  c = (1+eta)(rho (l^*-1) + log(1/gamma)/l^*) and
  eps'(l) = c + rho + 2 sqrt(rho L) for l <= 1 + sqrt(L/rho), else c + rho l + L/(l-1).
  For rho <= log(1/gamma) this is exactly the printed corollary.
  """
  log_inv_gamma, big_l = -dist.log_gamma, math.log(dist.mean)
  if rho == 0.0:  # Q(x) = Q(x'), hence A(x) = A(x'): every divergence is 0.
    return np.zeros_like(orders)
  lam_hat = max(1.0, math.sqrt(log_inv_gamma / rho))
  c = (1.0 + dist.eta) * (rho * (lam_hat - 1.0) + log_inv_gamma / lam_hat)
  knee = 1.0 + math.sqrt(big_l / rho)
  return np.where(orders <= knee, c + rho + 2.0 * math.sqrt(rho * big_l),
                  c + rho * orders + big_l / (orders - 1.0))


def theorem6(orders: np.ndarray, rdp: np.ndarray, mean: float,
             hockey_stick: Optional[Callable[[float], float]] = None) -> np.ndarray:
  """PS Theorem 6 (Poisson K, K = 0 releases a fixed default), valid for mean >= 1.

  eps'(l) = eps(l) + mean * delta^ + log(mean)/(l-1), where delta^ is a DP delta
  of Q at eps^ = log(l/(l-1)) (the largest eps^ allowed by the theorem): the RDP
  conversion minimised over the whole grid, or an exact profile if known.

  Raises:
    ValueError: mean < 1. As printed the theorem is false there: for Q = Q' it
      gives log(mean)/(l-1) < 0 (e.g. mean 0.3, Gaussian sigma 8, l = 8). Use
      `poisson_any_mean` instead.
  """
  if mean < 1.0:
    raise ValueError(f"Theorem 6 needs mean >= 1, got mean={mean!r}; "
                     "use the K=0-atom-corrected bound (poisson_any_mean)")
  return monotone(rdp + mean * _delta_hat(orders, rdp, hockey_stick) + math.log(mean) / (orders - 1.0))


def poisson_any_mean(orders: np.ndarray, rdp: np.ndarray, mean: float,
                     hockey_stick: Optional[Callable[[float], float]] = None) -> np.ndarray:
  """Theorem 6 with the K = 0 atom kept (Lemma 7 corrected), valid for every mean > 0.

  e^{(l-1) eps'} = e^{-mean} + mean * e^{(l-1)(eps(l) + mean * delta^)}.
  """
  lam1 = orders - 1.0
  inner = math.log(mean) + lam1 * (rdp + mean * _delta_hat(orders, rdp, hockey_stick))
  return monotone(np.logaddexp(-mean, inner) / lam1)


def _delta_hat(orders, rdp, hockey_stick):
  eps_hat = np.log1p(1.0 / (orders - 1.0))
  out = rdp_to_delta(orders, rdp, eps_hat)
  if hockey_stick is not None:
    out = np.minimum(out, [hockey_stick(float(e)) for e in eps_hat])
  return out


def rdp_to_delta(orders: np.ndarray, rdp: np.ndarray, epsilons: np.ndarray) -> np.ndarray:
  """dp-accounting's `compute_delta`, vectorised over many epsilons.

  Same bound, same rules (the KL bound sqrt(1 - e^{-r}) at every order, the
  Canonne-Kamath-Steinke bound for orders > 1.01, minimum over orders);
  Theorem 6 needs one conversion per order, which dp-accounting's scalar loop
  makes quadratic in Python. Tested to agree with `compute_delta` exactly.
  """
  orders = np.asarray(orders, dtype=np.float64)[None, :]
  rdp = np.asarray(rdp, dtype=np.float64)[None, :]
  eps = np.asarray(epsilons, dtype=np.float64)[:, None]
  with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
    kl = np.where(rdp <= 0, -np.inf, 0.5 * np.log1p(-np.exp(-rdp)))
    ckb = (orders - 1) * (rdp - eps + np.log1p(-1 / orders)) - np.log(orders)
  log_delta = np.where((orders > 1.01) & (rdp > 0), np.minimum(kl, ckb), kl)
  return np.minimum(np.exp(np.min(log_delta, axis=1)), 1.0)


def composition(orders: np.ndarray, rdp: np.ndarray, dist: dist_lib.KDistribution) -> np.ndarray:
  """Composition over a random number of runs: e^{(l-1)eps'} <= f(e^{(l-1) eps(l)}).

  The K-run transcript is a mixture over k of k-fold compositions with weights
  P[K=k] that do not depend on the data; e^{(l-1) D_l} is jointly convex, so
  the mixture's divergence is at most E[e^{(l-1) K eps(l)}] = f(e^{(l-1)eps(l)}).
  For Fixed(k) this is plain k-fold composition. Infinite where f diverges.
  """
  lam1 = orders - 1.0
  out = np.full_like(orders, np.inf)
  if callable(getattr(dist, "pgf_or_nan", None)):
    return monotone(_composition_vectorised(lam1, rdp, dist, out))
  for i, (l1, e) in enumerate(zip(lam1, rdp)):
    if not math.isfinite(e):
      continue
    if isinstance(dist, dist_lib.Fixed):
      out[i] = dist.k * e
      continue
    if isinstance(dist, dist_lib.Poisson):  # log f(e^t) = mean (e^t - 1), exact in log space
      with np.errstate(over="ignore"):
        out[i] = dist.mean * np.expm1(l1 * e) / l1
      continue
    try:
      with np.errstate(over="ignore"):
        val = float(dist.pgf(math.exp(l1 * e)))
    except (ValueError, OverflowError):
      continue
    if math.isfinite(val) and val > 0:
      out[i] = math.log(val) / l1
  return monotone(out)


def _composition_vectorised(lam1, rdp, dist, out) -> np.ndarray:
  """`composition`'s loop with the PGF evaluated once on all orders (~150x fewer calls).

  The scalar steps stay scalar (math.exp of the exponent, OverflowError -> no
  bound; math.log of the value), and `pgf_or_nan` gives each order exactly
  the value a call on that order alone gives (NaN where that call raises), so
  every entry equals the loop's.
  """
  idx, xs = [], []
  for i, (l1, e) in enumerate(zip(lam1, rdp)):
    if not math.isfinite(e):
      continue
    try:
      xs.append(math.exp(l1 * e))
    except OverflowError:
      continue
    idx.append(i)
  if not idx:
    return out
  with np.errstate(over="ignore"):
    vals = np.asarray(dist.pgf_or_nan(np.asarray(xs, dtype=np.float64)), dtype=np.float64)
  for i, val in zip(idx, vals.tolist()):
    if math.isfinite(val) and val > 0:
      out[i] = math.log(val) / lam1[i]
  return out


# ----------------------------------------------------------------------------
# Lemma 7, evaluated numerically (distributions without a closed form).
# ----------------------------------------------------------------------------

_N_CELLS = 1200
_N_BISECT = 64
_MAX_CONSTRAINT_ORDERS = 48


def _log_pow_pair(a, b, mu):
  """log(a^mu b^(1-mu)) with 0^mu = 0 and a>0, b=0 -> +inf (mu > 1)."""
  with np.errstate(divide="ignore", invalid="ignore"):
    out = mu * np.log(a) + (1.0 - mu) * np.log(b)
  out = np.where(a == 0, -np.inf, out)
  return np.where((a > 0) & (b == 0), np.inf, out)


def _bernoulli_log_moment(q, qp, mu):
  """log sum over {0,1} of P^mu P'^(1-mu) for P = Bern(q), P' = Bern(qp)."""
  return np.logaddexp(_log_pow_pair(q, qp, mu), _log_pow_pair(1.0 - q, 1.0 - qp, mu))


def _feasible(q, qp, mus, bounds):
  """Whether the pair (Bern(q), Bern(qp)) obeys every RDP constraint of Q, both ways.

  q, qp: shape (n,); mus, bounds: shape (m,) with bounds = (mu - 1) eps(mu).
  """
  q, qp = q[:, None], qp[:, None]
  fwd = _bernoulli_log_moment(q, qp, mus) <= bounds
  bwd = _bernoulli_log_moment(qp, q, mus) <= bounds
  return np.all(fwd & bwd, axis=1)


def exp_times(eps: float, q: np.ndarray) -> np.ndarray:
  """e^eps q, exactly `math.exp(eps) * q` where e^eps is finite; past exp's
  range (a pure eps > ~709.78) inf, and 0 where q = 0 (never below e^eps q)."""
  growth = math.exp(eps) if eps <= _dpa.MAX_EXP_ARG else math.inf
  with np.errstate(invalid="ignore", over="ignore"):
    return np.where(q > 0.0, growth * q, 0.0)


def _q_max(qp, mus, bounds, pure_eps):
  """Largest q with (q, qp) feasible, rounded up (so the final bound stays valid).

  For fixed qp the feasible q form an interval containing qp: each constraint
  is convex in q (x^mu and x^(1-mu) are convex for mu > 1).
  """
  lo, hi = qp.copy(), np.ones_like(qp)
  if pure_eps is not None:  # q <= e^eps qp and 1 - qp <= e^eps (1 - q)
    cap = np.minimum(1.0, np.minimum(exp_times(pure_eps, qp), 1.0 - (1.0 - qp) * math.exp(-pure_eps)))
    hi = np.maximum(np.minimum(hi, cap * (1 + 1e-12) + 1e-300), lo)
  for _ in range(_N_BISECT):
    mid = 0.5 * (lo + hi)
    ok = _feasible(mid, qp, mus, bounds)
    lo = np.where(ok, mid, lo)
    hi = np.where(ok, hi, mid)
  return hi


# ~10 KB an entry (the grid's q_max and its key).
_q_max_cache = _dpa.LruCache(32)


def _cached_q_max(mus: np.ndarray, bounds: np.ndarray, pure_eps: Optional[float]) -> np.ndarray:
  """`_q_max` on the fixed grid, cached by the constraints' exact bytes.

  It depends on the base's RDP curve (and pure epsilon) only, not on K, and
  costs ~0.1 s: a search over K (Fixed(k) for k = 2, 4, 8, ...) asks for the
  same curve's every time. The array is shared: it is made read-only.
  """
  mus = np.ascontiguousarray(mus, dtype=np.float64)
  bounds = np.ascontiguousarray(bounds, dtype=np.float64)
  pure_eps = None if pure_eps is None else float(pure_eps)
  key = (mus.tobytes(), bounds.tobytes(), pure_eps)
  out = _q_max_cache.get(key)
  if out is None:
    out = _q_max(_q_grid(), mus, bounds, pure_eps)
    out.setflags(write=False)
    _q_max_cache.put(key, out)
  return out


def _q_grid() -> np.ndarray:
  tail = np.logspace(-16, math.log10(0.5), _N_CELLS // 2)
  return np.unique(np.concatenate([[0.0], tail, 1.0 - tail[::-1][1:], [1.0]]))


def _safe_log_fprime(dist, x):
  with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
    return np.log(dist.pgf_derivative(x))


def lemma7(orders: np.ndarray, rdp: np.ndarray, dist: dist_lib.KDistribution,
           pure_eps: Optional[float] = None) -> np.ndarray:
  """PS Lemma 7 with the K = 0 atom kept, maximised numerically and rigorously.

  e^{(l-1) D_l(A||A')} <= P[K=0] + e^{(l-1) eps(l)} sup f'(q)^l f'(q')^{1-l},

  the sup over pairs (q, q') = (E_Q g, E_Q' g) of one post-processing
  g: Y -> [0,1]; such a pair is the Bernoulli post-processing (Bern(q),
  Bern(q')) of (Q, Q') and so obeys every RDP constraint of Q in both
  directions (and the pure-DP constraints if `pure_eps`). The lemma as printed
  omits P[K=0] and is false when P[K=0] > 0 (e.g. K ~ Bin(1, 0.3), Gaussian
  sigma 2, l = 4: printed 0.0987 < exact 0.2384).

  The sup is bounded from above, not estimated: f' is non-decreasing, and the
  largest feasible q, q_max(q'), is non-decreasing in q', so on a cell
  [a, b] of q' the objective is at most l log f'(q_max(b)) + (1-l) log f'(a).
  The cell at q' = 0 also uses Hoelder's inequality for power series with
  non-negative coefficients: f'(q)^l f'(q')^{1-l} <= f'(q^l q'^{1-l}), where
  q^l q'^{1-l} <= e^{(l-1)eps(l)} - (1 - q)^l.
  """
  finite = np.isfinite(rdp)
  pick = np.flatnonzero(finite)
  if pick.size > _MAX_CONSTRAINT_ORDERS:  # fewer constraints: a larger set, still an upper bound
    pick = pick[np.unique(np.linspace(0, pick.size - 1, _MAX_CONSTRAINT_ORDERS).round().astype(int))]
  mus = orders[pick]
  bounds = (mus - 1.0) * rdp[pick]
  grid = _q_grid()
  qmax = _cached_q_max(mus, bounds, pure_eps) if pick.size else np.ones_like(grid)
  a, b_qmax = grid[:-1], qmax[1:]
  log_fa = _safe_log_fprime(dist, a)
  log_fb = _safe_log_fprime(dist, b_qmax)
  p0 = dist.prob_zero
  out = np.full_like(orders, np.inf)
  for i, (lam, eps) in enumerate(zip(orders, rdp)):
    if not math.isfinite(eps):
      continue
    with np.errstate(invalid="ignore"):
      cells = lam * log_fb + (1.0 - lam) * log_fa
    cells = np.where(np.isnan(cells), np.inf, cells)
    # First cell: Hoelder bound, where f' is a convergent power series at that point.
    r = math.exp((lam - 1.0) * eps) - (1.0 - qmax[1]) ** lam if (lam - 1.0) * eps < 700 else math.inf
    try:
      holder = float(_safe_log_fprime(dist, max(r, 0.0)))
    except ValueError:
      holder = math.inf
    cells[0] = min(cells[0], holder if not math.isnan(holder) else math.inf)
    log_sup = float(np.max(cells))
    out[i] = np.logaddexp(math.log(p0) if p0 > 0 else -np.inf, (lam - 1.0) * eps + log_sup) / (lam - 1.0)
  return monotone(out)
