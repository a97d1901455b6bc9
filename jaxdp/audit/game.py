"""The distinguishing game over a whole private search.

`audit_search` runs the complete Papernot-Steinke search (draw K from its
law, draw K candidates, train them with DP, release only the best) `trials`
times on D and `trials` times on D', through the very functions
`jaxdp.tuning.random_search` uses (`draw_search`, the sweep engine,
`best_index`). All trials of one side are drawn at once (`draw_searches`,
the same draws one by one) and all their candidates trained in one batched
engine call, so 10^5 searches per side of a one-step search take minutes. A statistic maps what a search releases (`Release`) to a
number, and `epsilon_lower_bound` turns the two samples into a lower bound
on epsilon, to be set against the accounted epsilon of the same search.

Neighbouring data sets are add/remove, as accounted, with N public: build D'
as D plus the canary and D as D plus a *null* example whose gradient is
zero for every parameter (e.g. weight 0 in the loss), so both have the same
N and the normalisation by q*N (a function of the public N) is the same.
`jaxdp.audit.attacks` builds such pairs.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import jax
import numpy as np
from tqdm.auto import tqdm

from jaxdp import _validate
from jaxdp import accounting as acc
from jaxdp.audit.estimate import EpsilonLowerBound, epsilon_lower_bound, max_certifiable
from jaxdp.data import Dataset
from jaxdp.sweep.build import as_space
from jaxdp.sweep.plan import candidate_event
from jaxdp.sweep.space import SearchSpace
from jaxdp.sweep.trainers import check as check_trainer
from jaxdp.sweep.store import CandidateStore
from jaxdp.sweep.task_plan import TaskPlan
from jaxdp.train import TrainConfig
from jaxdp.tuning import _args, draws
from jaxdp.tuning.run_config import RunConfig, run_config as checked_run_config


@dataclasses.dataclass(frozen=True)
class Release:
  """What one private search released (what a statistic may look at).

  Attributes:
    hyperparameters: the released grid point, None if nothing was released.
    score: its score, NaN if nothing was released.
    params: its trained parameters, None likewise.
  """
  hyperparameters: Optional[Mapping[str, Any]]
  score: float
  params: Any


Statistic = Callable[[Release], float]


def released_score(default: float = -1e9) -> Statistic:
  """The released score (`default` when nothing is released)."""
  def statistic(release: Release) -> float:
    return default if release.hyperparameters is None else float(release.score)
  return statistic


def released_value(name: str, default: float = -1e9) -> Statistic:
  """The released value of hyperparameter `name` (`default` when nothing is released)."""
  def statistic(release: Release) -> float:
    return default if release.hyperparameters is None else float(release.hyperparameters[name])
  return statistic


@dataclasses.dataclass(frozen=True)
class AuditResult:
  """One audited search.

  Attributes:
    bound: the empirical `EpsilonLowerBound`.
    accounted: method -> accounted epsilon of the same search at `bound.delta`
      (inf for a search that adds no noise, NaN where the method has no
      theorem for it).
    event: the accounted DpEvent.
    statistics_without, statistics_with: the statistic per trial on D and D'.
    trials: searches run per data set.
    candidates_trained: total candidates trained (both data sets).
    wall_time_s: seconds for the whole audit.
  """
  bound: EpsilonLowerBound
  accounted: Mapping[str, float]
  event: Any
  statistics_without: np.ndarray
  statistics_with: np.ndarray
  trials: int
  candidates_trained: int
  wall_time_s: float

  @property
  def violated(self) -> bool:
    """True if the lower bound exceeds an accounted epsilon: a bug to report, loudly."""
    return any(self.bound.epsilon > eps * (1 + 1e-9) for eps in self.accounted.values()
               if not math.isnan(eps))


def _statistic_value(statistic: Statistic, release: Release) -> float:
  try:
    value = statistic(release)
  except Exception as err:  # a user's statistic may raise anything
    what = "a search that released nothing (hyperparameters None)" if release.hyperparameters is None \
        else f"the release {dict(release.hyperparameters)}"
    raise ValueError(f"statistic fails on {what}: {type(err).__name__}: {err}") from err
  if np.ndim(value) != 0:
    raise ValueError(f"statistic must return a scalar per release, got shape {np.shape(value)}")
  value = float(value)
  if not math.isfinite(value):
    raise ValueError(f"statistic must return a finite number, got {value!r} (map 'nothing released' "
                     "to a finite default)")
  return value


def _check_statistic(statistic, trials: int, delta: float, confidence: float) -> None:
  if not callable(statistic):
    raise ValueError(f"statistic must be a callable Release -> float, got {statistic!r}")
  if max_certifiable(trials, trials, delta, confidence) <= 0:
    raise ValueError(f"trials={trials} are too few for confidence={confidence!r} at delta={delta!r}: "
                     "even a perfect test could not certify epsilon > 0; run more trials")
  # The same statistic on an empty release first: a non-scalar fails now, not after training.
  _statistic_value(statistic, Release(None, float("nan"), None))


def _run_side(plan: TaskPlan, distribution, side: int, key: jax.Array, trials: int,
              statistic, store: CandidateStore, bar) -> tuple[np.ndarray, int]:
  """The statistics of `trials` whole searches on `data`; trial t draws with fold_in(key, 2t + side).

  The searches are drawn at once (`draw_searches`: each gets the candidates
  `draw_search` gives it alone) and all their candidates train in one engine
  call; then each search releases its best, as `random_search` does.
  """
  keys = jax.vmap(lambda t: jax.random.fold_in(key, t))(2 * np.arange(trials) + side)
  drawn = draws.draw_searches(plan, distribution, keys)
  flat = [c for cands in drawn for c in cands]
  results = store.train(flat)
  values, start = [], 0
  for cands in drawn:
    mine = results[start:start + len(cands)]
    start += len(cands)
    best = draws.best_index(mine)
    release = (Release(None, float("nan"), None) if best is None else
               Release(dict(cands[best].point), float(mine[best].score), mine[best].params))
    values.append(_statistic_value(statistic, release))
    bar.update(1)
  return np.asarray(values), len(flat)


def _accounted(events: list, delta: float, methods: Sequence[str]) -> dict:
  """method -> the largest epsilon over the (distinct) events, NaN where the method cannot."""
  distinct = [e for i, e in enumerate(events) if e not in events[:i]]  # equal unless N matters
  accounted = {}
  for m in methods:
    try:
      accounted[m] = max(acc.epsilon(e, delta, method=m) for e in distinct)
    except acc.NotApplicableError:
      accounted[m] = math.nan  # e.g. no privacy-profile theorem for this law of K
  return accounted


def audit_search(config: Union[TrainConfig, SearchSpace], search_space: Optional[Mapping[str, Sequence]],
                 without: Dataset, with_: Dataset, *, distribution: acc.KDistribution,
                 statistic: Statistic, trials: int, key: jax.Array, target_delta: float = 1e-5,
                 confidence: float = 0.95, methods: Sequence[str] = ("rdp", "profile", "best"),
                 progress: bool = False, initial_params: Any = None,
                 run_config: Optional[RunConfig] = None) -> AuditResult:
  """Audits `random_search(config, search_space, ·, distribution=...)` on D = `without`, D' = `with_`.

  Args:
    config, search_space: as in `jaxdp.tuning.random_search`.
    without: D (see the module docstring for keeping N public).
    with_: D' = D plus the canary.
    distribution: K's law.
    statistic: `Release -> float`; large values should mean "D'" (the
      estimator also tries the other direction).
    trials: searches per data set, >= 2.
    key: PRNG key; trial t on D uses fold_in(key, 2t), on D' fold_in(key, 2t + 1).
    target_delta: delta in (0, 1) of the lower bound and the accounted epsilons.
    confidence: level of the lower bound, in (0, 1).
    methods: accounting methods to report.
    progress: progress bar over trials.
    initial_params, run_config: as in `jaxdp.tuning.random_search`; the sides keep their
      candidates in `<run_dir>/D` and `<run_dir>/D_prime`.

  Returns:
    An `AuditResult`.

  Raises:
    ValueError: any bad argument (too few trials for `confidence`, a delta outside (0, 1), a
      non-scalar statistic, data the task cannot use), by the first release at the latest.
  """
  started = time.perf_counter()
  space = as_space(config, search_space)
  plans = [TaskPlan.build(space, d, initial_params=initial_params) for d in (without, with_)]
  distribution = _args.distribution(distribution)
  key = _validate.prng_key("key", key)
  delta = _args.target_delta(target_delta)
  confidence = _validate.probability("confidence", confidence)
  trials = _validate.integer("trials", trials, low=2)
  run = checked_run_config(run_config)
  for plan in plans:
    check_trainer(run.trainer, plan)
  _check_statistic(statistic, trials, delta, confidence)

  events = [acc.RepeatAndSelect(candidate_event(plan), distribution) for plan in plans]
  accounted = _accounted(events, delta, methods)
  sides, trained = [], 0
  with tqdm(total=2 * trials, disable=not progress, desc="audit trials", unit="search") as bar:
    for side, (plan, name) in enumerate(zip(plans, ("D", "D_prime"))):
      fingerprint = plan.search_fields("audit_search", key, side=name, trials=trials,
                                       distribution=distribution)
      with CandidateStore(plan, run_dir=run.run_dir and os.path.join(run.run_dir, name),
                          fingerprint=fingerprint, trainer=run.trainer) as store:
        values, n = _run_side(plan, distribution, side, key, trials, statistic, store, bar)
      sides.append(values)
      trained += n
  bound = epsilon_lower_bound(sides[0], sides[1], delta=delta, confidence=confidence)
  return AuditResult(bound=bound, accounted=accounted, event=events[1], statistics_without=sides[0],
                     statistics_with=sides[1], trials=trials, candidates_trained=trained,
                     wall_time_s=time.perf_counter() - started)
