"""Private random search and threshold search: draw candidates, train them, release one.

`random_search` is Papernot & Steinke's algorithm: the number of candidates K
is random (K ~ `distribution`), candidates are drawn uniformly from the grid
and trained, and only the best one is released with the epsilon of the whole
search (`acc.epsilon(..., method="best")`).

`threshold_search` is Liu & Talwar's Algorithm 1 with random stopping:
release the first candidate whose score reaches a threshold; after each
failure stop with probability gamma and release nothing.

Both take a trainable (Ray Tune's first argument): a jaxdp `TrainConfig` with
a grid (its task trained by the batched engine), a `SearchSpace`, or any DP
training function as a `jaxdp.tuning.TrainFunction(train_fn, dp_event_fn)`;
the same draws, selection, accounting, durable store and trainers serve all
of them through the plan (`jaxdp.sweep.plan.SearchPlan`). How a search runs
(its `run_dir` and trainer) is one `RunConfig`.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import warnings
from typing import Any, Mapping, Optional, Sequence

import jax
import numpy as np
from tqdm.auto import tqdm

from jaxdp import _validate
from jaxdp import accounting as acc
from jaxdp.data import Dataset
from jaxdp.sweep.build import Trainable
from jaxdp.sweep.plan import SearchPlan
from jaxdp.sweep.trainers import check as check_trainer
from jaxdp.sweep.store import CandidateStore, check_run_dir
from jaxdp.sweep.task_plan import TaskPlan
from jaxdp.tuning import _args
from jaxdp.tuning import draws
from jaxdp.tuning import planning
from jaxdp.tuning import probe as probe_lib
from jaxdp.tuning.results import NothingReleasedWarning, TunedResult, Unreleased, nothing_released
from jaxdp.tuning.run_config import RunConfig, run_config as checked_run_config


def random_search(trainable: Trainable, search_space: Optional[Mapping[str, Sequence]] = None,
                  data: Optional[Dataset] = None, *, distribution: acc.KDistribution,
                  key: jax.Array, target_delta: float = 1e-5,
                  target_epsilon: Optional[float] = None, initial_params: Any = None,
                  run_config: Optional[RunConfig] = None) -> TunedResult:
  """Papernot-Steinke private random search, of a jaxdp task or of any DP training function.

    random_search(config, {"learning_rate": [0.1, 0.3]}, data, distribution=acc.Poisson(5), key=key)
    random_search(TrainFunction(train_fn, dp_event_fn), grid, distribution=K, key=key)

  Args:
    trainable: the base `TrainConfig` (its task trained with jaxdp's engine and accounted from
      its configurations), a ready `SearchSpace` (then `search_space` is None), or a
      `TrainFunction`: `train_fn(hparams, seed) -> (score, artifact)` called once per
      candidate, accounted by its `dp_event_fn(hparams) -> DpEvent`
      (docs/guides/tune_any_trainer.md; the contract is below).
    search_space: grid name -> non-empty sequence of values (`jaxdp.sweep.SearchSpace`); for a
      `TrainFunction`, the hyperparameters it is called with (every combination, a dict).
    data: a `jaxdp.data.Dataset`: private training split; the score reads the public test split,
      or, for a DP score, the private validation split. None for a `TrainFunction`.
    distribution: the law of the number of candidates K, e.g. `acc.Poisson(mean=10)`.
    key: PRNG key for K, the draws and every candidate's training (each candidate's key is split
      from it). Secret: it regenerates the noise.
    target_delta: delta in (0, 1) at which the search's epsilon is reported.
    target_epsilon: if given, the noise of every candidate is calibrated so that the whole
      search (K's law, the grid, the DP score) meets (target_epsilon, target_delta); the grid
      must not vary it. For a task, the noise multiplier; for a `TrainFunction`, its
      `noise_parameter`, through `dp_event_fn`. The reported epsilon is re-accounted from the
      calibrated runs.
    initial_params: None (each candidate initialised from its key), or public parameters every
      candidate starts from: all of the model's (a checkpoint) or some (a pretrained backbone;
      a new head or LoRA adapters are initialised from the key). Checked against every
      configuration's model before K is drawn. They must be public: they are not accounted.
      None for a `TrainFunction`.
    run_config: how the search runs: `RunConfig(run_dir=..., trainer=...)` (a durable
      directory, `LocalTrainer` options or a `RayTrainer`); None: in memory, on this host.

  Returns:
    A `TunedResult`: the selected candidate only, and apart from it (`unreleased`) K, the seed
    and what was resumed, none of which epsilon covers.

  The contract of a training function (what jaxdp cannot check):
    - `train_fn(hparams, seed)` takes all of its randomness from `seed`, an integer in
      [0, 2**63) hashed from the key the search's key drew for the candidate, the same on every
      resume (`jaxdp.sweep.functions.call_seed`). A function that ignores it breaks "same draw,
      same release". (An API that takes 32 bits, like `np.random.seed` or `jax.random.key`
      without x64, must fold the high bits in, e.g.
      `jax.random.fold_in(jax.random.key(seed % 2**32), seed >> 32)`.)
    - `dp_event_fn(hparams)` is the event of what `train_fn` runs with those hyperparameters;
      the score reads only public data, or is itself DP with its event inside.
    - It raises only for reasons the data do not decide: an exception stops the search
      (`jaxdp.sweep.TrainFunctionError`), which would reveal them. A numerical failure should
      return a non-finite score: it counts as the worst.

  What is checked: every grid point's event (a DpEvent, the same on two calls, that some
  accounting method supports); each return is a (score, artifact) tuple with a real score; a
  `run_dir` is refused for another key, grid, law of K, either function (its code and what it
  holds: `jaxdp.sweep.identity`), or any grid point's event.

  Raises:
    ValueError: for any bad argument, always before K is drawn: whether the call fails never
      depends on K (a bad `data` raises even when K = 0); `jaxdp.sweep.SearchMismatchError` if
      `run_dir` holds another search.
  """
  plan, accounting, run, fingerprint = _random_search_plan(
      trainable, search_space, data, distribution=distribution, key=key, target_delta=target_delta,
      target_epsilon=target_epsilon, initial_params=initial_params, run_config=run_config)
  with CandidateStore(plan, run_dir=run.run_dir, fingerprint=fingerprint,
                      trainer=run.trainer) as store:
    cands = draws.draw_search(plan, distribution, key)
    if not cands:  # nothing trains, yet the cache gets the entries a search of K >= 1 leaves
      store.compile_unrun(draws.draw_candidates(plan, 1, key)[0])
    results = store.train(cands)
  chosen = draws.best_index(results)
  if chosen is None:
    warn_nothing_released("random_search", distribution)
  return released(plan, accounting, store, cands, results, chosen)


def warn_nothing_released(tuner: str, distribution: acc.KDistribution) -> None:
  """Warns that a Papernot-Steinke search (`tuner`) released nothing.

  The empty release is public (it is what epsilon covers), and the warning says no more than
  it: the same words whether K = 0 was drawn or no candidate's score was finite (which of the
  two happened is not covered by epsilon), and P(K=0) is a property of the public law of K.
  """
  remedy = ("A law of K with no mass at 0 (acc.Geometric, acc.Logarithmic: truncated negative "
            "binomials, or acc.Fixed) never draws K = 0." if distribution.prob_zero > 0 else "")
  warnings.warn(nothing_released(
      tuner, f"either K = 0 candidates were drawn (P(K=0) = {distribution.prob_zero:.3g} under "
      f"{distribution}) or no candidate's score was finite", remedy),
      NothingReleasedWarning, stacklevel=3)


def _random_search_plan(trainable, search_space, data, *, distribution, key, target_delta,
                        target_epsilon, initial_params, run_config) -> tuple:
  """(plan, accounting, run config, fingerprint) of `random_search`'s arguments, every one
  checked once: what the search and its dry run share."""
  distribution = _args.distribution(distribution)
  key = _validate.prng_key("key", key)
  run = checked_run_config(run_config)
  target_epsilon = _args.target_epsilon(target_epsilon)
  plan, accounting = planning.prepare(
      trainable, search_space, data, outer=lambda cand: acc.RepeatAndSelect(cand, distribution),
      target_delta=_args.target_delta(target_delta), target_epsilon=target_epsilon,
      initial_params=initial_params)
  check_trainer(run.trainer, plan)
  fingerprint = plan.search_fields("random_search", key, distribution=distribution,
                                   delta=accounting.delta, target_epsilon=target_epsilon)
  return plan, accounting, run, fingerprint


def released(plan: SearchPlan, accounting: planning.Accounting, store: CandidateStore,
             cands: list, results: list, chosen: Optional[int]) -> TunedResult:
  """What a search releases: candidate `chosen` (None: nothing) of the `cands` it trained, and
  apart from it (`Unreleased`) what its epsilon does not cover."""
  some = chosen is not None
  report_resumes(store)
  release = plan.release(cands[chosen], results[chosen]) if some else plan.release(None, None)
  unreleased = Unreleased(
      num_candidates=len(cands), resumed=store.resumed, resumed_steps=dict(store.resumed_steps),
      all_scores=tuple((dict(c.point), float(r.score)) for c, r in zip(cands, results, strict=True)),
      **(plan.unreleased(cands[chosen], results[chosen]) if some else plan.unreleased(None, None)))
  return TunedResult(**release, score=float(results[chosen].score) if some else float("nan"),
                     epsilon=accounting.epsilon, delta=accounting.delta, event=accounting.event,
                     noise_multiplier=accounting.noise_multiplier, unreleased=unreleased)


def report_resumes(store: CandidateStore) -> None:
  """The line a durable search prints when its `run_dir` held an earlier run of it.

  One fixed line whenever the run directory already held this search, whatever was read back:
  how many candidates a search trains is K (or, for `threshold_search`, a number the data
  decide), and whether any was stored, or had a checkpoint, tells K = 0 from K >= 1 (the same
  empty release otherwise); none of it is covered by epsilon.
  """
  if store.pool is None or not store.pool.existed:
    return
  tqdm.write(f"{store.pool.run_dir}: this search ran here before: what it stored was read back, "
             "the rest trained now", file=sys.stderr)


def dry_run(trainable: Trainable, search_space: Optional[Mapping[str, Sequence]] = None,
            data: Optional[Dataset] = None, *, distribution: acc.KDistribution,
            key: Optional[jax.Array] = None, target_delta: float = 1e-5,
            target_epsilon: Optional[float] = None, initial_params: Any = None,
            run_config: Optional[RunConfig] = None, probe: bool = False) -> planning.DryRun:
  """What `random_search` with these arguments would do, without training anything.

  Takes every argument `random_search` takes (`key` may be left out: the plan does not depend
  on it) and checks them the same way, so the exact call can be dry-run: the task on the data's
  shapes, `initial_params` against every model, the trainer, and a `run_dir` that holds another
  search (`SearchMismatchError`, read only: nothing is written there). Calibrates the noise for
  `target_epsilon` if given. Returns a `planning.DryRun`: epsilon of the whole search, K's law
  (mean, P(K=0), quantiles), the expected compute (E[K] x steps, E[K] x steps x q N
  per-example gradients), and per compiled group its trainable and frozen parameters, what
  `initial_params` holds and how many leaves take each clipping path (`format(verbose=True)`
  names each). A training function is never called: its every grid point's `dp_event_fn` is,
  and the report names the function (E[calls] = E[K]). `print` it.

  Time: by default the report states no wall time, only how to measure it: the dry run
  compiles nothing (it stays a matter of seconds on a large model), and a time not measured
  on this machine would be a guess. `probe=True` compiles each group's program and times a
  few of its DP steps on public stand-in data (`jaxdp.tuning.probe`: the test split's rows,
  never the private ones), then states the expected wall time from K's public law (E[K], and
  the chance each group is drawn), never from a drawn K; this costs each group's compilation.

  Raises:
    ValueError: any argument `random_search` refuses; `probe` not a bool, or True for a
      training function (which a dry run never calls).
  """
  if not isinstance(probe, (bool, np.bool_)):
    raise ValueError(f"probe must be a bool (True or False), got {probe!r}")
  key = jax.random.key(0) if key is None else key
  plan, accounting, run, fingerprint = _random_search_plan(
      trainable, search_space, data, distribution=distribution, key=key,
      target_delta=target_delta, target_epsilon=target_epsilon, initial_params=initial_params,
      run_config=run_config)
  if run.run_dir is not None:  # what the search would refuse there (read only)
    check_run_dir(plan, run.run_dir, fingerprint)
  timings = ()
  if probe:
    if not isinstance(plan, TaskPlan):
      raise ValueError("probe=True times a task's compiled groups; a dry run never calls a "
                       "training function, so it has nothing to time (give probe=False)")
    # The probe's noise and batches are discarded (only its wall time is kept): any key of the
    # search's implementation, whose cost per step is the search's, will do.
    probe_key = jax.random.key(0, impl=jax.random.key_impl(key))
    timings = probe_lib.probe(plan.group_runs(), plan.data, probe_key)
  return planning.dry_run_report(plan, accounting, distribution, timings)


def threshold_search(trainable: Trainable, search_space: Optional[Mapping[str, Sequence]] = None,
                     data: Optional[Dataset] = None, *, threshold: float,
                     distribution: acc.KDistribution, key: jax.Array, target_delta: float = 1e-5,
                     target_epsilon: Optional[float] = None, initial_params: Any = None,
                     run_config: Optional[RunConfig] = None) -> TunedResult:
  """Liu-Talwar Algorithm 1 with random stopping, of a jaxdp task or of a training function.

  For j = 1, 2, ...: train a random candidate; if its score >= `threshold`, release it;
  otherwise stop with probability gamma and release nothing (also after T candidates). A
  non-finite score never reaches the threshold. Candidates are trained one at a time, so no
  extra work is spent; epsilon is `acc.epsilon(acc.ThresholdSelect(...), target_delta,
  "best")`. It covers the released candidate (or "nothing"), not how many were tried (which
  depends on the data: `result.unreleased.num_candidates`).

  Args:
    trainable: as in `random_search` (a training function's contract included), and so are
      `search_space`, `data`, `key`, `target_delta`, `target_epsilon`, `initial_params` and
      `run_config`; a rerun on a `run_dir` replays the same candidates and stop decisions and
      resumes at the first candidate not yet stored.
    threshold: a finite score to reach (the task's or the function's score).
    distribution: the law of the number of candidates when none reaches the threshold:
      `acc.Geometric(gamma=stop_prob)` (stop with probability gamma in (0, 1) after each failed
      candidate), `acc.CappedGeometric(stop_prob, T)` (and after at most T candidates), or
      `acc.Fixed(1)` (one candidate: stop_prob 1).

  Raises:
    ValueError: for any bad argument (a NaN threshold included), before any training.
  """
  threshold = _args.threshold(threshold)
  stop_prob, max_candidates = _args.stopping(distribution)
  key = _validate.prng_key("key", key)
  run = checked_run_config(run_config)
  target_epsilon = _args.target_epsilon(target_epsilon)
  plan, accounting = planning.prepare(
      trainable, search_space, data,
      outer=lambda cand: acc.ThresholdSelect(cand, stop_prob, max_candidates),
      target_delta=_args.target_delta(target_delta), target_epsilon=target_epsilon,
      initial_params=initial_params)
  check_trainer(run.trainer, plan)
  fingerprint = plan.search_fields("threshold_search", key, threshold=threshold,
                                   stop_prob=stop_prob, max_candidates=max_candidates,
                                   delta=accounting.delta, target_epsilon=target_epsilon)
  cands, results, chosen = [], [], None
  # How many candidates it tries is for the data to decide: one line for the whole search,
  # drawn when it starts and when it ends, with the time only (a bar per candidate, or a redraw
  # per candidate in a log, would count them). The trainer's own bar is off for the same reason.
  quiet = _quiet(run.trainer)
  with CandidateStore(plan, run_dir=run.run_dir, fingerprint=fingerprint, trainer=quiet) as store, \
      tqdm(total=None, disable=quiet is run.trainer, desc="threshold_search",
           bar_format="{desc}: training [{elapsed}]"):
    for draw_key, stop_key in draws.threshold_keys(key, max_candidates):
      cands.append(draws.draw_candidates(plan, 1, draw_key)[0])
      results.append(store.train(cands[-1:])[0])  # a stored candidate is read back, not trained
      # Non-finite counts as the worst (best_index): it never reaches the threshold.
      if math.isfinite(results[-1].score) and results[-1].score >= threshold:
        chosen = len(cands) - 1
        break
      if draws.stops(stop_key, stop_prob):
        break
  if chosen is None:
    # The empty release is public; the same words whether the stop coin or the cap stopped it.
    warnings.warn(nothing_released(
        "threshold_search", f"no candidate's score reached the threshold {threshold:g} before "
        f"the search stopped ({distribution})", "A lower threshold, or a law of K that stops "
        "later (a smaller stop probability), makes that rarer."),
        NothingReleasedWarning, stacklevel=2)
  return released(plan, accounting, store, cands, results, chosen)


def _quiet(trainer):
  """`trainer` without its progress bar (itself when it has none)."""
  if getattr(trainer, "progress", False) and dataclasses.is_dataclass(trainer):
    return dataclasses.replace(trainer, progress=False)
  return trainer
