"""Simulate many private random searches from one pool of trained candidates.

Training is the expensive part of a search; selecting is cheap. Given a pool
holding several independently seeded runs of every grid point, a search with
K ~ D is simulated by drawing K grid points uniformly at random, taking a
*distinct* trained run of each draw (reusing runs only when a grid point is
drawn more often than it has seeds: the result says how often that happened),
and releasing the run with the highest score (NaN scores, i.e. diverged runs,
count as worst). Everything is vectorised over trials.

Fallback: when K = 0 (possible for Poisson or binomial K) the tuner releases a
fixed default, and when every drawn run diverged the released model is
useless; both count as `fallback` (e.g. chance accuracy, 0.1 on MNIST).
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from typing import Any, Mapping, Sequence

import numpy as np

from jaxdp import _validate
from jaxdp.accounting import distributions as dist_lib


@dataclasses.dataclass(frozen=True, eq=False)
class PoolTable:
  """Scores of a pool as a (grid point, seed) table.

  Attributes:
    points: the grid points (dicts), one per row.
    scores: (n_points, max_seeds) selection scores; NaN = diverged.
    values: (n_points, max_seeds) reported metric of each run (often = scores).
    counts: runs available per grid point (row i uses columns < counts[i]).
  """

  points: tuple
  scores: np.ndarray
  values: np.ndarray
  counts: np.ndarray

  def __post_init__(self):
    if self.scores.ndim != 2 or self.scores.shape != self.values.shape or self.scores.shape[0] == 0:
      raise ValueError(f"scores and values must be equal non-empty 2-D arrays, got "
                       f"{self.scores.shape} and {self.values.shape}")
    if np.any(self.counts < 1):
      raise ValueError("every grid point needs at least one trained run")


def table_from_records(records: Sequence[Mapping[str, Any]], score: str = "score",
                       value: str = "test_score") -> PoolTable:
  """Groups pool records by grid point, counting each candidate once.

  A candidate (same id, or same grid point and seed when records carry no id)
  that appears twice is one run, not two: a repeated record would otherwise
  pass for an independent trial. The first record is kept and a warning says
  how many repeats were dropped.
  """
  if not records:
    raise ValueError("records must not be empty: the pool holds no trained candidate")
  groups: dict = {}
  seen, repeats = set(), 0
  for r in records:
    point = json.dumps(r["point"], sort_keys=True)
    identity = r["id"] if "id" in r else (point, r["seed"])
    if identity in seen:
      repeats += 1
      continue
    seen.add(identity)
    groups.setdefault(point, []).append(r)
  if repeats:
    warnings.warn(f"records repeat {repeats} candidate(s); each is counted once (first record kept)",
                  stacklevel=2)
  keys = sorted(groups)
  width = max(len(g) for g in groups.values())
  scores = np.full((len(keys), width), np.nan)
  values = np.full((len(keys), width), np.nan)
  counts = np.zeros(len(keys), dtype=np.int64)
  for i, k in enumerate(keys):
    rows = sorted(groups[k], key=lambda r: r["seed"])
    counts[i] = len(rows)
    scores[i, :len(rows)] = [float(r[score]) for r in rows]
    values[i, :len(rows)] = [float(r[value]) for r in rows]
  return PoolTable(tuple(json.loads(k) for k in keys), scores, values, counts)


@dataclasses.dataclass(frozen=True, eq=False)
class SimulationResult:
  """Outcome of `n_trials` simulated searches.

  Attributes:
    mean: mean released value over trials.
    stderr: its standard error.
    values: released value per trial.
    k: number of runs per trial.
    trials_with_reuse: trials in which some run had to be used twice.
    fallback_trials: trials that released the fallback (K = 0 or all diverged).
  """

  mean: float
  stderr: float
  values: np.ndarray
  k: np.ndarray
  trials_with_reuse: int
  fallback_trials: int


def simulate(table: PoolTable, distribution: dist_lib.KDistribution, n_trials: int,
             rng: np.random.Generator, fallback: float = 0.0) -> SimulationResult:
  """Simulates `n_trials` random searches with K ~ `distribution`.

  Args:
    table: the pool (see `table_from_records`).
    distribution: law of K.
    n_trials: number of simulated searches, >= 1.
    rng: numpy Generator (explicit, no default seed).
    fallback: value released when K = 0 or every drawn run diverged.

  Returns:
    A `SimulationResult`.
  """
  dist_lib.check_distribution(distribution)
  n_trials = _validate.integer("n_trials", n_trials, low=1)
  fallback = _validate.real("fallback", fallback)
  if not isinstance(rng, np.random.Generator):
    raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
  n_points = table.scores.shape[0]
  k = np.asarray(distribution.sample(rng, size=n_trials), dtype=np.int64)
  total = int(k.sum())
  trial = np.repeat(np.arange(n_trials), k)
  point = rng.integers(n_points, size=total)
  # Rank of each draw among the earlier draws of the same point in the same trial.
  group = trial * n_points + point
  order = np.argsort(group, kind="stable")
  sorted_group = group[order]
  first = np.r_[True, sorted_group[1:] != sorted_group[:-1]]
  start = np.maximum.accumulate(np.where(first, np.arange(total), 0))
  rank = np.empty(total, dtype=np.int64)
  rank[order] = np.arange(total) - start
  # A random cyclic offset per (trial, point) makes the chosen runs a uniformly
  # placed block of distinct seeds; runs repeat only once rank >= count.
  offset_sorted = np.repeat(rng.integers(1 << 62, size=int(first.sum())), np.diff(np.r_[np.flatnonzero(first), total]))
  offset = np.empty(total, dtype=np.int64)
  offset[order] = offset_sorted
  count = table.counts[point]
  seed = (offset + rank) % count
  reused = rank >= count
  score = table.scores[point, seed]
  score = np.where(np.isnan(score), -np.inf, score)
  value = table.values[point, seed]

  released = np.full(n_trials, fallback, dtype=np.float64)
  if total:
    # Last element of each trial after sorting by (trial, score) is its best run.
    by = np.lexsort((score, trial))
    last = np.r_[trial[by][1:] != trial[by][:-1], True]
    best = by[last]
    ok = np.isfinite(score[best]) & np.isfinite(value[best])
    released[trial[best][ok]] = value[best][ok]
  reuse_trials = np.zeros(n_trials, dtype=bool)
  np.logical_or.at(reuse_trials, trial, reused)
  n_fallback = int(np.sum(k == 0)) + (int(np.sum(~ok)) if total else 0)
  return SimulationResult(
      mean=float(released.mean()),
      stderr=float(released.std(ddof=1) / math.sqrt(n_trials)) if n_trials > 1 else float("nan"),
      values=released, k=k, trials_with_reuse=int(reuse_trials.sum()), fallback_trials=n_fallback)
