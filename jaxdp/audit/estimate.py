"""Empirical lower bounds on epsilon from a distinguishing game.

An (epsilon, delta)-DP mechanism M and neighbouring data sets D, D' satisfy,
for every test ("guess D' when the statistic is >= t"),

  TPR <= e^eps FPR + delta   and   TNR <= e^eps FNR + delta,

where TPR = P[stat(M(D')) >= t], FPR = P[stat(M(D)) >= t], TNR = 1 - FPR and
FNR = 1 - TPR. So any test whose rates are known gives

  eps >= log((TPR - delta) / FPR)   and   eps >= log((TNR - delta) / FNR).

From finite trials the rates are only estimated: `epsilon_lower_bound` picks
tests (a threshold and a direction each) on the first half of the trials,
then evaluates them on the second half with exact one-sided Clopper-Pearson
bounds (a lower bound on each numerator rate and an upper bound on each
denominator rate, each at level (1 - confidence) / (2 m) for m tests) and
reports the largest. Choosing on data the bound is not computed from, and a
union bound over the 2 m intervals, make the result a lower bound on the
true epsilon with probability at least `confidence`, whatever the mechanism.

With `tests=m > 1` the bound reads the tradeoff curve (FPR, FNR) of the
statistic at m points instead of one: the first half's best test at each of
m false-positive rates spread over the curve's useful range. Where the best
threshold is uncertain (few trials in the tail that decides a small delta)
the evaluation half then picks among neighbours, at the price of a union
bound over m; every point is a valid bound, so the maximum is one.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import stats

from jaxdp import _validate


def clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
  """Exact one-sided (lower, upper) bounds on a binomial rate, each at level `alpha`.

  P[rate < lower] <= alpha and P[rate > upper] <= alpha over the draws.
  """
  k = _validate.integer("successes", successes, low=0)
  n = _validate.integer("trials", trials, low=1)
  if k > n:
    raise ValueError(f"successes must be in [0, trials={n}], got {k}")
  alpha = _validate.probability("alpha", alpha)
  lower = 0.0 if k == 0 else float(stats.beta.ppf(alpha, k, n - k + 1))
  upper = 1.0 if k == n else float(stats.beta.ppf(1.0 - alpha, k + 1, n - k))
  return lower, upper


def _bound(num, den, delta):
  """log((num - delta) / den), 0 where it is not positive, inf where den = 0 (vectorised)."""
  num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
  with np.errstate(divide="ignore", invalid="ignore"):
    value = np.log((num - delta) / den)
  value = np.where(den <= 0, np.inf, value)
  out = np.where(num - delta <= 0, 0.0, np.maximum(value, 0.0))
  return float(out) if out.ndim == 0 else out


def _cp_lower(k, n, alpha):
  k = np.asarray(k, np.float64)
  with np.errstate(invalid="ignore"):
    return np.where(k <= 0, 0.0, stats.beta.ppf(alpha, np.maximum(k, 1), n - k + 1))


def _cp_upper(k, n, alpha):
  k = np.asarray(k, np.float64)
  with np.errstate(invalid="ignore"):
    return np.where(k >= n, 1.0, stats.beta.ppf(1.0 - alpha, k + 1, np.maximum(n - k, 1)))


def _best_tests(without: np.ndarray, with_: np.ndarray, delta: float, alpha: float, m: int) -> list:
  """Up to m (threshold, direction) tests with the best confidence bounds on these trials,
  the best one first, the others the best at m - 1 other levels of their denominator rate."""
  thresholds = np.unique(np.concatenate([without, with_]))
  n0, n1 = without.size, with_.size
  fp = n0 - np.searchsorted(np.sort(without), thresholds, side="left")   # without >= t
  tp = n1 - np.searchsorted(np.sort(with_), thresholds, side="left")     # with >= t
  candidates = []
  for direction, value, rate in (
      ("tpr", _bound(_cp_lower(tp, n1, alpha), _cp_upper(fp, n0, alpha), delta), fp / n0),
      ("tnr", _bound(_cp_lower(n0 - fp, n0, alpha), _cp_upper(n1 - tp, n1, alpha), delta), (n1 - tp) / n1)):
    candidates += [(float(v), direction, float(t), float(r)) for v, t, r in zip(value, thresholds, rate)]
  candidates.sort(key=lambda c: -c[0])
  chosen = [candidates[0]]
  if m > 1:
    # Levels of the denominator rate, geometric between one trial and the best test's rate x 100.
    best_rate = max(chosen[0][3], 1.0 / max(n0, n1))
    levels = np.geomspace(1.0 / max(n0, n1), min(1.0, 100.0 * best_rate), m - 1)
    for level in levels:
      near = [c for c in candidates if c[0] > 0 and level / 2 <= max(c[3], 0.5 / max(n0, n1)) <= level * 2
              and (c[2], c[1]) not in {(x[2], x[1]) for x in chosen}]
      if near:
        chosen.append(max(near, key=lambda c: c[0]))
  return [(threshold, direction) for _, direction, threshold, _ in chosen]


@dataclasses.dataclass(frozen=True)
class EpsilonLowerBound:
  """An empirical lower bound on epsilon at `delta`.

  Attributes:
    epsilon: the lower bound (>= 0); the true epsilon is at least this with
      probability >= `confidence`.
    delta: the delta it is for.
    confidence: the level, e.g. 0.95.
    threshold: the test "statistic >= threshold means D'" that gave the
      bound (chosen on the first half of the trials).
    direction: 'tpr' (bound from TPR/FPR) or 'tnr' (from TNR/FNR).
    tpr, fpr: that test's empirical rates on the second half.
    trials_without, trials_with: trials on D and on D' (both halves).
    tests: how many tests the evaluation half compared (union bound).
  """
  epsilon: float
  delta: float
  confidence: float
  threshold: float
  direction: str
  tpr: float
  fpr: float
  trials_without: int
  trials_with: int
  tests: int = 1


def max_certifiable(trials_without: int, trials_with: int, delta: float, confidence: float,
                    tests: int = 1) -> float:
  """The largest lower bound these trial counts can give (perfect separation)."""
  alpha = (1.0 - confidence) / (2.0 * tests)
  n0, n1 = trials_without - trials_without // 2, trials_with - trials_with // 2
  lo = clopper_pearson(n1, n1, alpha)[0]
  hi = clopper_pearson(0, n0, alpha)[1]
  return _bound(lo, hi, delta)


def epsilon_lower_bound(without, with_, *, delta: float, confidence: float = 0.95,
                        tests: int = 1) -> EpsilonLowerBound:
  """Lower bound on epsilon from a statistic's values on D (`without`) and D' (`with_`).

  Args:
    without: the statistic of the released output in trials on D, 1-d.
    with_: the same on D' (D plus the canary), 1-d.
    delta: in (0, 1).
    confidence: in (0, 1): the bound holds with at least this probability.
    tests: points of the tradeoff curve evaluated (see the module docstring),
      >= 1; 1 is the single best test of the first half.

  Returns:
    An `EpsilonLowerBound`.

  Raises:
    ValueError: delta or confidence outside (0, 1), statistics that are not
      1-d finite arrays, or too few trials for the confidence: even a perfect
      test on them could not certify any epsilon > 0.
  """
  delta = _validate.probability("delta", delta)
  confidence = _validate.probability("confidence", confidence)
  tests = _validate.integer("tests", tests, low=1)
  arrays = []
  for name, values in (("without", without), ("with_", with_)):
    a = np.asarray(values, dtype=np.float64)
    if a.ndim != 1:
      raise ValueError(f"{name} must be a 1-d array of scalar statistics (one per trial), got shape {a.shape}")
    if not np.all(np.isfinite(a)):
      raise ValueError(f"{name} must be finite (map 'nothing released' to a finite value)")
    if a.size < 2:
      raise ValueError(f"{name} needs at least 2 trials (half choose the test, half evaluate it), got {a.size}")
    arrays.append(a)
  without, with_ = arrays
  ceiling = max_certifiable(without.size, with_.size, delta, confidence, tests)
  if ceiling <= 0:
    raise ValueError(
        f"trials={without.size}+{with_.size} are too few for confidence={confidence!r} at delta={delta!r} "
        f"with tests={tests}: even a perfect test on the evaluation half could not certify epsilon > 0; "
        "run more trials")
  alpha = (1.0 - confidence) / (2.0 * tests)
  h0, h1 = without.size // 2, with_.size // 2
  e0, e1 = without[h0:], with_[h1:]
  n0, n1 = e0.size, e1.size
  best = None
  for threshold, direction in _best_tests(without[:h0], with_[:h1], delta, alpha, tests):
    fp, tp = int(np.sum(e0 >= threshold)), int(np.sum(e1 >= threshold))
    if direction == "tpr":
      value = _bound(clopper_pearson(tp, n1, alpha)[0], clopper_pearson(fp, n0, alpha)[1], delta)
    else:
      value = _bound(clopper_pearson(n0 - fp, n0, alpha)[0], clopper_pearson(n1 - tp, n1, alpha)[1], delta)
    if best is None or value > best[0]:
      best = (value, threshold, direction, tp / n1, fp / n0)
  value, threshold, direction, tpr, fpr = best
  return EpsilonLowerBound(epsilon=value, delta=delta, confidence=confidence, threshold=threshold,
                           direction=direction, tpr=tpr, fpr=fpr, trials_without=without.size,
                           trials_with=with_.size, tests=tests)
