"""Trial simulator: exact expectations, NaN handling, run reuse, validation."""

import numpy as np
import pytest

from jaxdp import accounting as acc
from jaxdp.sweep import PoolTable, simulate, table_from_records


def _table(n_points, n_seeds, values=None):
  vals = values if values is not None else np.arange(1, n_points * n_seeds + 1, dtype=float).reshape(
      n_points, n_seeds) / (n_points * n_seeds)
  return PoolTable(tuple({"i": i} for i in range(n_points)), vals, vals.copy(),
                   np.full(n_points, n_seeds))


@pytest.mark.parametrize("dist", [acc.Poisson(mean=3), acc.Geometric(mean=4), acc.Binomial(5, 0.5),
                                  acc.Fixed(2)], ids=repr)
def test_mean_matches_exact_expectation_with_one_run_per_point(dist):
  # One seed per point, N points with values m/N: draws are with replacement, so
  # E[released] = f(0) * fallback + (1/N) sum_m (1 - f((m-1)/N)).
  n, fallback = 10, 0.05
  table = _table(n, 1)
  sim = simulate(table, dist, 40_000, np.random.default_rng(0), fallback=fallback)
  m = np.arange(1, n + 1)
  exact = float(dist.pgf(0.0)) * fallback + np.sum(1 - dist.pgf((m - 1) / n)) / n
  assert sim.mean == pytest.approx(exact, abs=4 * sim.stderr)
  assert sim.stderr < 0.01


def test_distinct_runs_without_replacement_when_seeds_suffice():
  # 1 point with 5 seeds, K = 5: all 5 distinct runs are used, so the best is always the max.
  table = _table(1, 5)
  sim = simulate(table, acc.Fixed(5), 2000, np.random.default_rng(1))
  assert np.all(sim.values == table.values.max())
  assert sim.trials_with_reuse == 0
  over = simulate(table, acc.Fixed(6), 100, np.random.default_rng(1))
  assert over.trials_with_reuse == 100  # 6 draws of a 5-run point must reuse one


def test_nan_scores_count_as_worst_and_all_nan_gives_fallback():
  vals = np.array([[np.nan, 0.3], [0.9, np.nan]])
  table = PoolTable(({"a": 0}, {"a": 1}), vals, vals.copy(), np.array([2, 2]))
  sim = simulate(table, acc.Fixed(4), 3000, np.random.default_rng(2), fallback=0.1)
  assert set(np.unique(sim.values)) <= {0.1, 0.3, 0.9}
  all_nan = PoolTable(({"a": 0},), np.full((1, 2), np.nan), np.full((1, 2), np.nan), np.array([2]))
  sim = simulate(all_nan, acc.Fixed(3), 50, np.random.default_rng(2), fallback=0.1)
  assert np.all(sim.values == 0.1) and sim.fallback_trials == 50


def test_k_zero_releases_fallback():
  sim = simulate(_table(3, 2), acc.Poisson(mean=1e-6), 200, np.random.default_rng(3), fallback=-1.0)
  assert np.all(sim.values == -1.0) and np.all(sim.k == 0) and sim.fallback_trials == 200


def test_table_from_records_groups_by_point():
  records = [{"point": {"lr": 1}, "seed": 1, "score": 0.5, "test_score": 0.5},
             {"point": {"lr": 1}, "seed": 0, "score": 0.4, "test_score": 0.4},
             {"point": {"lr": 2}, "seed": 0, "score": float("nan"), "test_score": float("nan")}]
  table = table_from_records(records)
  assert table.points == ({"lr": 1}, {"lr": 2})
  np.testing.assert_array_equal(table.counts, [2, 1])
  assert table.scores[0, 0] == 0.4 and np.isnan(table.scores[1, 0])
  with pytest.raises(ValueError, match="no trained candidate"):
    table_from_records([])


@pytest.mark.parametrize("kwargs,match", [
    (dict(n_trials=0), "n_trials"), (dict(rng=0), "rng must be"), (dict(fallback=float("nan")), "fallback")])
def test_bad_arguments(kwargs, match):
  args = dict(table=_table(2, 2), distribution=acc.Poisson(2), n_trials=10, rng=np.random.default_rng(0))
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    simulate(**args)


def test_each_candidate_counts_once():
  # Two seeds per point, every record written twice (e.g. by two writers): the
  # table must still see 2 runs per point, not 4 "independent" ones.
  records = [{"id": f"{lr}-{s}", "point": {"lr": lr}, "seed": s, "score": lr + s / 10,
              "test_score": lr + s / 10} for lr in (1, 2, 3) for s in (0, 1)]
  with pytest.warns(UserWarning, match="repeat 6 candidate"):
    table = table_from_records(records + [dict(r, score=-1.0) for r in records])
  np.testing.assert_array_equal(table.counts, [2, 2, 2])
  np.testing.assert_array_equal(table.scores, [[1.0, 1.1], [2.0, 2.1], [3.0, 3.1]])  # first kept
  # Records without ids are identified by (point, seed).
  bare = [{k: v for k, v in r.items() if k != "id"} for r in records]
  with pytest.warns(UserWarning, match="repeat 1 candidate"):
    np.testing.assert_array_equal(table_from_records(bare + bare[:1]).counts, [2, 2, 2])
