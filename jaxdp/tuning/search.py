"""Private random search: draw K, train K candidates, release only the best.

`random_search` is Papernot & Steinke's algorithm: the number of candidates K
is random (K ~ `repetitions`), candidates are drawn uniformly from the grid
and trained with the batched engine, and only the best one is released with
the epsilon of the whole search (`acc.epsilon(..., method="best")`). The
scores of the other candidates are *not* covered by that guarantee, so they
are left out unless the caller opts in (and is warned).

`threshold_search` is Liu & Talwar's Algorithm 1 with random stopping:
release the first candidate whose score reaches a threshold; after each
failure stop with probability `stop_prob` and release nothing.

Both tune a jaxdp `TrainConfig` (its task trained by the engine) or any DP
training function `train_fn(hparams, seed) -> (score, artifact)` with its
`dp_event(hparams) -> DpEvent` (`jaxdp.sweep.functions`): the same draws,
selection, accounting, durable store and backends, through a `SearchPlan`
or a `FunctionPlan`.
"""

from __future__ import annotations

import copy
import functools
import math
import sys
import warnings
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from jaxdp import _validate
from jaxdp._cache import LruCache
from jaxdp import accounting as acc
from jaxdp.accounting import kdistribution
from jaxdp.data import Dataset
from jaxdp.sweep import engine
from jaxdp.sweep.functions import FunctionPlan
from jaxdp.sweep.plan import SearchPlan
from jaxdp.sweep.space import Candidate, SearchSpace
from jaxdp.sweep.store import CandidateStore, Trainer, check_run_dir
from jaxdp.train import TrainConfig
from jaxdp.train.config import NotPrivateWarning
from jaxdp.train.trainer import score_source
from jaxdp.tuning import _args
from jaxdp.tuning import planning
from jaxdp.tuning.results import TunedFunctionResult, TunedResult, Unreleased


def prepare(config: Union[TrainConfig, SearchSpace, Callable], search_space: Optional[Mapping[str, Sequence]],
            data: Optional[Dataset], *, delta: float, target_epsilon: Optional[float],
            outer: Callable[[Any], Any], initial_params: Any = None,
            dp_event: Optional[Callable] = None, noise_parameter: Optional[str] = None) -> Any:
  """The search's plan (a `SearchPlan`, or a `FunctionPlan` for a training function), before
  anything is drawn or trained: every argument checked once, the noise calibrated if asked,
  the whole search accounted.

  Args:
    config, search_space, data, delta, target_epsilon, initial_params, dp_event,
      noise_parameter: as in `random_search`.
    outer: candidate event -> the search's event (e.g. `acc.RepeatAndSelect(_, K)`).
  """
  delta = _args.delta(delta)
  target_epsilon = _args.target_epsilon(target_epsilon)
  if _args.is_function(config):
    return _prepare_function(config, search_space, dp_event, delta=delta,
                             target_epsilon=target_epsilon, outer=outer,
                             noise_parameter=_args.noise_parameter(noise_parameter, target_epsilon))
  for name, value in (("dp_event", dp_event), ("noise_parameter", noise_parameter)):
    if value is not None:
      raise ValueError(f"{name} is for a training function (random_search(train_fn, grid, ..., "
                       f"dp_event=event_fn)); a TrainConfig's event is derived from it, and its "
                       f"target_epsilon sets noise_multiplier: got {name}={value!r:.100}")
  space = _args.space(config, search_space)
  plan = SearchPlan.build(space, data, initial_params=initial_params)
  sigma = None
  if target_epsilon is not None:  # sigma is traced: the plan's programs and checks stay
    sigma = planning.calibrate_noise(space, data.num_examples, outer, target_epsilon=target_epsilon,
                                     delta=delta)
    plan = plan.with_noise(planning.with_noise(space, sigma))
    ignored = sorted({r.config.noise_multiplier for r in plan.runs} - {sigma})
    if ignored:  # e.g. a SearchSpace `derive` that sets it: the calibrated sigma would not run
      raise ValueError(f"target_epsilon calibrated noise_multiplier={sigma!r}, but the search's "
                       f"configurations run with {ignored} (a SearchSpace derive sets it?): give "
                       "either target_epsilon or the noise multipliers, not both")
  return _accounted(plan, outer, delta, target_epsilon, sigma)


def _accounted(plan, outer, delta: float, target_epsilon: Optional[float], sigma: Optional[float]):
  """`plan` with the whole search's event and epsilon, accounted from the runs that will run,
  never from the target (which it must meet)."""
  event = outer(planning.plan_event(plan))
  try:
    epsilon = acc.epsilon(event, delta, method="best")
  except (ArithmeticError, TypeError) as err:  # e.g. LaplaceDpEvent(0.0), a string noise
    raise ValueError(f"the search's events cannot be accounted ({type(err).__name__}: {err}): "
                     f"{acc.describe(event):.300}") from err
  if target_epsilon is not None and epsilon > target_epsilon:
    raise ValueError(f"the calibrated search accounts to epsilon={epsilon!r} > "
                     f"target_epsilon={target_epsilon!r}; nothing was trained")
  return plan.accounted(event=event, epsilon=epsilon, delta=delta, noise_multiplier=sigma)


def _prepare_function(train_fn, grid, event_fn, *, delta, target_epsilon, outer,
                      noise_parameter) -> FunctionPlan:
  """`prepare` for a training function: every grid point's event checked, the declared noise
  hyperparameter calibrated through `event_fn` if asked, the whole search accounted."""
  if event_fn is None:
    raise ValueError("dp_event is required when tuning a training function: a callable "
                     "hyperparameters -> dp_accounting.DpEvent of one run of train_fn")
  noise = None
  if target_epsilon is not None:
    noise = (noise_parameter, planning.calibrate_function_noise(
        train_fn, grid, event_fn, noise_parameter, outer, target_epsilon=target_epsilon,
        delta=delta))
  plan = FunctionPlan.build(train_fn, grid, event_fn, noise=noise, argument="search_space")
  plan = _accounted(plan, outer, delta, target_epsilon, None if noise is None else noise[1])
  if math.isinf(plan.epsilon):
    warnings.warn(f"this search is not differentially private: its event "
                  f"({acc.describe(plan.event):.200}) accounts to epsilon = inf", NotPrivateWarning,
                  stacklevel=4)
  return plan


def draw_search(space: SearchSpace, repetitions: acc.KDistribution, key: jax.Array) -> list:
  """The candidates of one Papernot-Steinke search: K ~ `repetitions`, then K uniform draws.

  Depends only on the public K law, the grid and the key, never on data;
  `random_search`, `subsampled_search` and the audit (`jaxdp.audit`) all draw
  through it (`draw_searches`), so an audit runs exactly the searches users run.
  """
  return draw_searches(space, repetitions, key[None])[0]


def draw_searches(space: SearchSpace, repetitions: acc.KDistribution, keys: jax.Array) -> list:
  """`draw_search` for each key of `keys` (typed keys, shape (n,)): the same candidates, drawn at once.

  Every JAX random function is defined key by key, so vmapping over the keys
  (and, for the grid draws, over the searches with the same K) gives each
  search the bits it gets alone; an audit draws 10^5 searches this way in
  seconds.
  """
  impl = jax.random.key_impl(keys)
  pairs = _in_chunks("split", jax.random.split, np.asarray(jax.random.key_data(keys)), impl)
  k_keys = jax.random.wrap_key_data(pairs[:, 0], impl=impl)
  ks = [int(repetitions.sample(g)) for g in kdistribution.generators_for_keys(k_keys)]
  out: list = [[] for _ in ks]
  by_k: dict = {}
  for i, k in enumerate(ks):
    if k:
      by_k.setdefault(k, []).append(i)
  for k, rows in by_k.items():
    draw = functools.partial(_indices, n=k, size=len(space))
    picks, keys = _in_chunks(("indices", k, len(space)), draw, pairs[np.asarray(rows), 1], impl)
    for row, i in enumerate(rows):
      out[i] = _candidates(space, picks[row], keys[row], impl)
  return out


_CHUNK = 4096


def _in_chunks(name, fn, key_data: np.ndarray, impl) -> Any:
  """`jax.vmap(fn)` over the keys whose raw data is `key_data`, as NumPy (keys as their data).

  Compiled once per `name` for chunks of `_CHUNK` keys, the padding rows
  copies, computed and dropped; a lone key (one search) runs op by op, as
  compiling would cost it more than it saves. Only threefry's random
  functions are defined key by key under `vmap`; other implementations (rbg)
  run key by key, so every search gets the bits it gets alone.
  """
  n = key_data.shape[0]
  if n == 1 or str(impl) != "threefry2x32":
    outs = [_as_data(fn(jax.random.wrap_key_data(row, impl=impl)), lambda a: np.asarray(a)[None])
            for row in key_data]
    leaves = [np.concatenate(a) for a in zip(*[o if isinstance(o, tuple) else (o,) for o in outs])]
    return leaves[0] if len(leaves) == 1 else tuple(leaves)
  run = _chunk_program(name, fn, impl, _CHUNK)
  parts = []
  for start in range(0, n, _CHUNK):
    chunk = key_data[start:start + _CHUNK]
    padded = np.concatenate([chunk, np.repeat(chunk[:1], _CHUNK - len(chunk), axis=0)])
    parts.append([np.asarray(a)[:len(chunk)] for a in jax.tree.leaves(run(padded))])
  leaves = [np.concatenate(a) for a in zip(*parts)]
  return leaves[0] if len(leaves) == 1 else tuple(leaves)


def _as_data(out, finish=lambda a: a):
  """`out`'s leaves with keys replaced by their raw data, each passed through `finish`;
  one array, or a tuple of them."""
  leaves = [finish(jax.random.key_data(a) if jnp.issubdtype(a.dtype, jax.dtypes.prng_key) else a)
            for a in jax.tree.leaves(out)]
  return leaves[0] if len(leaves) == 1 else tuple(leaves)


_PROGRAMS = LruCache(256)


def _chunk_program(name, fn, impl, size: int):
  memo = (name, str(impl), size)
  run = _PROGRAMS.get(memo)
  if run is None:
    run = jax.jit(lambda data: _as_data(jax.vmap(fn)(jax.random.wrap_key_data(data, impl=impl))))
    _PROGRAMS.put(memo, run)
  return run


def best_index(results: Sequence[Any]) -> Optional[int]:
  """Index of the highest finite score (first on ties), None if none is finite: what a search
  releases. A non-finite score (NaN, +-inf: a diverged run, an overflowing DP score) counts
  as the worst, whatever its sign."""
  scores = np.array([r.score for r in results], dtype=np.float64)
  finite = np.isfinite(scores)
  if not finite.any():
    return None
  return int(np.argmax(np.where(finite, scores, -np.inf)))


def _stops(stop_key: jax.Array, stop_prob: float) -> bool:
  """The stop coin of `threshold_search`: True with probability in [stop_prob, stop_prob + 2^-32).

  Never below the accounted rate, since the bounds of `acc.ThresholdSelect`
  (Liu & Talwar's 2 eps1 + 2 exp(-gamma T), Lemma 7 for a capped geometric
  K) decrease in gamma. An exact integer comparison of 32 uniform bits: a
  float32 uniform would round gamma to the 2^-23 grid.
  """
  return int(jax.random.bits(stop_key, dtype=jnp.uint32)) < math.ceil(stop_prob * 2.0 ** 32)


def _threshold_keys(key: jax.Array, max_candidates: Optional[int]):
  """(draw key, stop key) of candidate 1, 2, ... of Liu-Talwar's loop (at most `max_candidates`)."""
  j = 0
  while max_candidates is None or j < max_candidates:
    key, draw_key, stop_key = jax.random.split(key, 3)
    yield draw_key, stop_key
    j += 1


def _indices(key, n: int, size: int) -> tuple:
  """(grid indices, keys) of n candidates drawn uniformly with replacement from a grid of `size`:
  each candidate's key is split from `key`, so it carries the search key's every bit."""
  pick_key, keys_key = jax.random.split(key)
  return jax.random.randint(pick_key, (n,), 0, size), jax.random.split(keys_key, n)


def _candidates(space: SearchSpace, picks, key_data, impl) -> list:
  return [Candidate(space.points[i], space.configs[i], key_data=tuple(row), key_impl=str(impl))
          for i, row in zip(picks, np.asarray(key_data))]


def _draw_candidates(space: SearchSpace, n: int, key) -> list:
  picks, keys = _indices(key, n, len(space))
  return _candidates(space, np.asarray(picks), np.asarray(jax.random.key_data(keys)),
                     jax.random.key_impl(key))


def _release_scores(cands, results, release_all_scores):
  if not release_all_scores:
    return None
  warnings.warn("release_all_scores=True: the scores of non-selected candidates are NOT covered "
                "by the reported epsilon; publishing them leaks more than the guarantee states",
                stacklevel=3)
  return tuple((dict(c.point), r.score) for c, r in zip(cands, results))


def random_search(config: Union[TrainConfig, SearchSpace, Callable],
                  search_space: Optional[Mapping[str, Sequence]], data: Optional[Dataset] = None, *,
                  repetitions: acc.KDistribution, key: jax.Array,
                  dp_event: Optional[Callable] = None, delta: float = 1e-5,
                  target_epsilon: Optional[float] = None, noise_parameter: Optional[str] = None,
                  release_all_scores: bool = False, release_num_candidates: bool = False,
                  run_dir: Optional[str] = None, trainer: Optional[Trainer] = None,
                  initial_params: Any = None,
                  **engine_kwargs) -> Union[TunedResult, TunedFunctionResult]:
  """Papernot-Steinke private random search, of a jaxdp task or of any DP training function.

  Two ways to call it:

    random_search(config, search_space, data, repetitions=K, key=key)
    random_search(train_fn, grid, repetitions=K, key=key, dp_event=event_fn)

  The first trains a `TrainConfig`'s task with jaxdp's engine and accounts
  it from the configurations; the second calls `train_fn(hparams, seed) ->
  (score, artifact)` once per candidate and accounts each with
  `event_fn(hparams) -> DpEvent` (README, "Tune any trainer"; the contract
  is below). Both draw K and the candidates the same way, release the
  best, store candidates durably in `run_dir` and run on Ray with
  `trainer=`.

  Args:
    config: the base `TrainConfig` (or a ready `SearchSpace`, then
      `search_space` must be None), or a training function `train_fn`.
    search_space: grid name -> non-empty sequence of values (see
      `jaxdp.sweep.SearchSpace`); for a training function, the
      hyperparameters it is called with (every combination, a dict).
    data: a `jaxdp.data.Dataset`: private training split; the score reads
      the public test split, or, for a DP score, the private validation split.
      None for a training function (it reads its own data).
    repetitions: law of the number of candidates K, e.g. `acc.Poisson(10)`.
    key: PRNG key for K, the draws and every candidate's training (a
      function's `seed`).
    dp_event: for a training function only, and required there:
      hyperparameters -> the `dp_accounting.DpEvent` of one run with them
      (its DP score's included). Called on every grid point before K is
      drawn: each must be a DpEvent, the same on two calls; one no
      accounting method supports is refused then (`NotApplicableError`).
    delta: delta in (0, 1) at which the search's epsilon is reported.
    target_epsilon: if given, the noise of every candidate is calibrated so
      that the whole search (K's law, the grid, the DP score) meets
      (target_epsilon, delta); the grid must not vary it. For a task, the
      noise multiplier; for a training function, the hyperparameter named
      by `noise_parameter`, through `dp_event`. The reported epsilon is
      re-accounted from the calibrated configurations.
    noise_parameter: with `target_epsilon` and a training function: the name
      of the hyperparameter `train_fn` and `dp_event` read as the noise.
    release_all_scores: also return every candidate's score (warns: not
      covered by the guarantee).
    release_num_candidates: also release K (`result.num_candidates`), and
      account for it: the search's event is then
      `acc.SelectionWithCount(acc.RepeatAndSelect(...))`, which only the
      methods bounding the K-run transcript cover ("composition", "pld"), at
      a much larger epsilon (K ~ Poisson(10) over a Gaussian run of
      mu = 1: 26 instead of 8.7 at delta = 1e-5). Without it K is internal
      randomness, in `result.unreleased`, not for publication.
    run_dir: None, or a directory that keeps every finished candidate
      (`jaxdp.sweep.CandidateStore`): rerun the same call after a crash and it
      trains only what is missing and releases what an uninterrupted run
      releases. It holds unreleased candidates: keep it as secret as the data.
      A training function's artifacts are stored as arrays where they are
      arrays, by pickle otherwise (`jaxdp.sweep.artifacts`).
    trainer: the training backend: None (this host: `jaxdp.sweep.train_candidates`,
      or `jaxdp.sweep.functions.train_functions` for a training function) or
      one with its signature, e.g.
      `functools.partial(jaxdp.sweep.ray_backend.train_candidates_ray, chunk_size=2)`
      for a Ray cluster (a training function is shipped to the workers).
    initial_params: None (each candidate initialised from its key), or
      public parameters every candidate starts from: all of the model's (a
      checkpoint) or some (a pretrained backbone; a new head or LoRA
      adapters are initialised from the key). Checked against every
      configuration's model before K is drawn. They must be public (e.g.
      pretrained on public data): they are not accounted. None for a
      training function.
    **engine_kwargs: `devices`, `max_candidates_per_device`, `progress`,
      `on_chunk`, passed to the trainer (a training function's: `progress`,
      `on_chunk`).

  Returns:
    A `TunedResult` holding the selected candidate only; for a training
    function, a `TunedFunctionResult` (its artifact in place of parameters).

  The contract of a training function (what jaxdp cannot check):
    - `train_fn(hparams, seed)` takes all of its randomness from `seed`, an
      integer in [0, 2**63) derived from `key` and the candidate, the same on
      every resume (`jaxdp.sweep.functions.call_seed`). A resume calls it
      again with the same seed: a function that ignores it breaks "same
      draw, same release". (An API that takes 32 bits, like
      `np.random.seed` or `jax.random.key` without x64, must fold the high
      bits in, e.g. `jax.random.fold_in(jax.random.key(seed % 2**32), seed >> 32)`.)
    - `dp_event(hparams)` is the event of what `train_fn` runs with those
      hyperparameters; the score reads only public data, or is itself DP
      with its event inside `dp_event`.
    - It raises only for reasons the data do not decide: an exception stops
      the search (`jaxdp.sweep.functions.TrainFunctionError`, naming the
      candidate), which would reveal them. A numerical failure should return
      a non-finite score: it counts as the worst.
  What is checked: both are callables; every grid point's event (above);
  each return is a (score, artifact) tuple with a real score (a one-element
  array or tensor included); a `run_dir` is refused for another key, grid,
  law of K, either function's name, source or what it holds (closure cells, a
  partial's bound values, the globals it reads:
  `jaxdp.sweep.functions.function_identity`), or any grid point's event.

  Raises:
    ValueError: for any bad argument, always before K is drawn: whether the
      call fails never depends on K (a bad `data` raises even when K = 0);
      `jaxdp.sweep.SearchMismatchError` if `run_dir` holds another search.

  Example:
    result = random_search(config, {"learning_rate": [0.1, 0.3, 1.0]}, data,
                           repetitions=acc.Poisson(mean=5), key=jax.random.key(0))
  """
  release_all_scores = _args.flag("release_all_scores", release_all_scores)
  plan, opened = _random_search_plan(config, search_space, data, repetitions=repetitions, key=key,
                                     delta=delta, target_epsilon=target_epsilon, run_dir=run_dir,
                                     trainer=trainer, initial_params=initial_params,
                                     engine_kwargs=engine_kwargs, dp_event=dp_event,
                                     noise_parameter=noise_parameter,
                                     release_num_candidates=release_num_candidates)
  with CandidateStore(plan, **opened) as store:
    cands = draw_search(plan.space, repetitions, key)
    results = store.train(cands)
  return _released(plan, store, cands, results, best_index(results), release_all_scores,
                   bool(store.engine_kwargs.get("progress")))


def _opened(config, data, initial_params, run_dir, trainer, engine_kwargs) -> tuple:
  """(run_dir, trainer, engine kwargs), checked: what every tuner's store is opened with."""
  if _args.is_function(config):
    _args.function_search(data, initial_params, engine_kwargs)
  return _args.run_dir(run_dir), _args.trainer(trainer), _args.engine_kwargs(engine_kwargs)


def _random_search_plan(config, search_space, data, *, repetitions, key, delta, target_epsilon,
                        run_dir, trainer, initial_params, engine_kwargs, dp_event,
                        noise_parameter, release_num_candidates) -> tuple:
  """(plan, the `CandidateStore`'s other arguments) of `random_search`'s arguments, every one
  checked once: what the search and its dry run share."""
  repetitions = _args.repetitions(repetitions)
  with_count = _args.flag("release_num_candidates", release_num_candidates)

  def outer(cand):
    selection = acc.RepeatAndSelect(cand, repetitions)
    return acc.SelectionWithCount(selection) if with_count else selection
  key = _validate.prng_key("key", key)
  run_dir, trainer, engine_kwargs = _opened(config, data, initial_params, run_dir, trainer,
                                            engine_kwargs)
  plan = prepare(config, search_space, data, delta=delta, target_epsilon=target_epsilon,
                 outer=outer, initial_params=initial_params, dp_event=dp_event,
                 noise_parameter=noise_parameter)
  if trainer is None and isinstance(plan, SearchPlan):  # another backend lays out its own
    engine.check_layout(plan, engine_kwargs.get("devices"))
  fingerprint = plan.search_fields("random_search", key, repetitions=repetitions,
                                   delta=plan.delta, target_epsilon=target_epsilon,
                                   **({"release_num_candidates": True} if with_count else {}),
                                   **_function_fields(plan))
  return plan, dict(run_dir=run_dir, fingerprint=fingerprint, trainer=trainer,
                    engine_kwargs=engine_kwargs)


def _function_fields(plan) -> dict:
  """What a training function's search adds to its fingerprint: the calibrated hyperparameter."""
  return {"noise_parameter": plan.noise_parameter} if isinstance(plan, FunctionPlan) else {}


def _released(plan, store: CandidateStore, cands: list, results: list,
              chosen: Optional[int], release_all_scores: bool, progress: bool):
  """What a search releases: candidate `chosen` (None: nothing) of the `cands` it trained, and
  apart from it (`Unreleased`) what its epsilon does not cover."""
  some = chosen is not None
  if progress:
    report_resumes(store)
  # K is released only where the accounted event says so.
  counted = len(cands) if isinstance(plan.event, acc.SelectionWithCount) else None
  common = dict(score=float(results[chosen].score) if some else float("nan"),
                epsilon=plan.epsilon, delta=plan.delta, event=plan.event,
                noise_multiplier=plan.noise_multiplier, num_candidates=counted)
  unreleased = dict(num_candidates=len(cands), resumed=store.resumed,
                    all_scores=_release_scores(cands, results, release_all_scores))
  if isinstance(plan, FunctionPlan):
    return TunedFunctionResult(
        hyperparameters=copy.deepcopy(dict(cands[chosen].config.hparams)) if some else None,
        artifact=results[chosen].artifact if some else None,
        score_source=planning.FUNCTION_SCORE_SOURCE,
        unreleased=Unreleased(seed=results[chosen].seed if some else None, **unreleased), **common)
  return TunedResult(
      hyperparameters=dict(cands[chosen].point) if some else None,
      config=cands[chosen].config if some else None,
      params=results[chosen].params if some else None,
      score_source=(score_source(cands[chosen].config.task) if some
                    else planning.plan_score_source(plan)),
      unreleased=Unreleased(auto_static=planning.auto_static(plan),
                            resumed_steps=dict(store.resumed_steps), **unreleased), **common)


def report_resumes(store: CandidateStore) -> None:
  """The progress line of a durable search: whether it read candidates back from `run_dir`.

  It names no count and no candidate: how many candidates a search trains is K (or, for
  `threshold_search`, a number the data decide) and ids hash the candidates' keys, neither
  covered by epsilon.
  """
  if store.pool is None or not (store.resumed or store.resumed_steps):
    return
  what = [part for part, held in (("read back candidates it had stored", store.resumed),
                                  ("continued candidates from their checkpoints",
                                   store.resumed_steps)) if held]
  tqdm.write(f"{store.pool.run_dir}: resumed an earlier run of this search ({' and '.join(what)}"
             "; the rest trained now)", file=sys.stderr)


def dry_run(config: Union[TrainConfig, SearchSpace, Callable],
            search_space: Optional[Mapping[str, Sequence]], data: Optional[Dataset] = None, *,
            repetitions: acc.KDistribution, key: Optional[jax.Array] = None,
            dp_event: Optional[Callable] = None, delta: float = 1e-5,
            target_epsilon: Optional[float] = None, noise_parameter: Optional[str] = None,
            release_all_scores: bool = False, release_num_candidates: bool = False,
            run_dir: Optional[str] = None, trainer: Optional[Trainer] = None,
            initial_params: Any = None, **engine_kwargs) -> planning.DryRun:
  """What `random_search` with these arguments would do, without training anything.

  Takes every argument `random_search` takes (`key` may be left out: the
  plan does not depend on it) and checks them the same way, so the exact
  call can be dry-run: the task on the data's shapes, `initial_params`
  against every model, the engine's options, and a `run_dir` that holds
  another search (`SearchMismatchError`, read only: nothing is written
  there). Calibrates the noise for `target_epsilon` if given. Returns a
  `planning.DryRun` of the search's plan: epsilon of the whole search, K's
  law (mean, P(K=0), quantiles), the groups that will compile and each
  layer's clipping path, and the expected compute (E[K] x steps, E[K] x
  steps x q N per-example gradients). A training function is never called:
  its every grid point's `dp_event` is, and the report names the function
  (E[calls] = E[K]). `print` it.
  """
  _args.flag("release_all_scores", release_all_scores)
  plan, opened = _random_search_plan(
      config, search_space, data, repetitions=repetitions,
      key=jax.random.key(0) if key is None else key, delta=delta, target_epsilon=target_epsilon,
      run_dir=run_dir, trainer=trainer, initial_params=initial_params, engine_kwargs=engine_kwargs,
      dp_event=dp_event, noise_parameter=noise_parameter,
      release_num_candidates=release_num_candidates)
  if opened["run_dir"] is not None:  # what the search would refuse there (read only)
    check_run_dir(plan, opened["run_dir"], opened["fingerprint"])
  return planning.dry_run_report(plan, repetitions)


def threshold_search(config: Union[TrainConfig, SearchSpace, Callable],
                     search_space: Optional[Mapping[str, Sequence]], data: Optional[Dataset] = None,
                     *, threshold: float, stop_prob: float, key: jax.Array,
                     max_candidates: Optional[int] = None, dp_event: Optional[Callable] = None,
                     delta: float = 1e-5, target_epsilon: Optional[float] = None,
                     noise_parameter: Optional[str] = None, release_all_scores: bool = False,
                     run_dir: Optional[str] = None, trainer: Optional[Trainer] = None,
                     initial_params: Any = None, **engine_kwargs
                     ) -> Union[TunedResult, TunedFunctionResult]:
  """Liu-Talwar Algorithm 1 with random stopping, of a jaxdp task or of a training function.

  For j = 1, 2, ...: train a random candidate; if its score >= `threshold`,
  release it; otherwise stop with probability `stop_prob` and release nothing
  (also after `max_candidates` candidates). A non-finite score never
  reaches the threshold.

  Candidates are trained one at a time, so no extra work is spent; epsilon is
  `acc.epsilon(acc.ThresholdSelect(...), delta, "best")`. It covers the
  released candidate (or "nothing"), not `num_candidates` (see `TunedResult`).

  Args:
    config, search_space, data, key, dp_event, delta, target_epsilon,
    noise_parameter, release_all_scores, trainer, initial_params,
    **engine_kwargs: as in `random_search` (a training function's contract
      included).
    run_dir: as in `random_search`; a rerun replays the same candidates and
      stop decisions and resumes at the first candidate not yet stored.
    threshold: a finite score to reach (the task's or the function's score).
    stop_prob: probability in (0, 1] of stopping after a failed candidate.
    max_candidates: None or an integer >= 1: a hard cap on candidates.

  Raises:
    ValueError: for any bad argument (a NaN threshold included), before any
      training.
  """
  threshold = _args.threshold(threshold)
  stop_prob = _validate.probability("stop_prob", stop_prob, one_ok=True)
  if max_candidates is not None:
    max_candidates = _validate.integer("max_candidates", max_candidates, low=1)
  key = _validate.prng_key("key", key)
  release_all_scores = _args.flag("release_all_scores", release_all_scores)
  run_dir, trainer, engine_kwargs = _opened(config, data, initial_params, run_dir, trainer,
                                            engine_kwargs)
  plan = prepare(config, search_space, data, delta=delta, target_epsilon=target_epsilon,
                 outer=lambda cand: acc.ThresholdSelect(cand, stop_prob, max_candidates),
                 initial_params=initial_params, dp_event=dp_event, noise_parameter=noise_parameter)
  if trainer is None and isinstance(plan, SearchPlan):
    engine.check_layout(plan, engine_kwargs.get("devices"))
  fingerprint = plan.search_fields("threshold_search", key, threshold=threshold,
                                   stop_prob=stop_prob, max_candidates=max_candidates,
                                   delta=plan.delta, target_epsilon=target_epsilon,
                                   **_function_fields(plan))
  cands, results, chosen = [], [], None
  # How many candidates it tries is for the data to decide: one bar for the whole search, drawn
  # when it starts and when it ends, with the time only (a bar per candidate, or a redraw per
  # candidate in a log, would count them).
  progress = bool(engine_kwargs.pop("progress", False))
  with CandidateStore(plan, run_dir=run_dir, fingerprint=fingerprint, trainer=trainer,
                      engine_kwargs=engine_kwargs) as store, \
      tqdm(total=None, disable=not progress, desc="threshold_search",
           bar_format="{desc}: training [{elapsed}]") as bar:
    for draw_key, stop_key in _threshold_keys(key, max_candidates):
      cands.append(_draw_candidates(plan.space, 1, draw_key)[0])
      results.append(store.train(cands[-1:])[0])  # a stored candidate is read back, not trained
      # Non-finite counts as the worst (best_index): it never reaches the threshold.
      if math.isfinite(results[-1].score) and results[-1].score >= threshold:
        chosen = len(cands) - 1
        break
      if _stops(stop_key, stop_prob):
        break
  return _released(plan, store, cands, results, chosen, release_all_scores, progress)
