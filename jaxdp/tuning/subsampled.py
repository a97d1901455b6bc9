"""Private tuning on a random subset, then one final run (Koskela & Kulkarni, NeurIPS 2023).

`subsampled_search` is their Algorithm 1:

  1. Poisson-sample the tuning subset X1 from the training set X with rate q
     (the exact sampler of `jaxdp.train.sampling`: never above q; X1 or the
     final set may come out empty, and the runs on it are then noise only);
  2. run the Papernot-Steinke private random search (K ~ `distribution`) on X1
     with the batched sweep engine;
  3. extrapolate the selected hyperparameters to the final training set with
     the task's `extrapolate(hparams, m, n)`, where m = round(q N) and n
     (N - m for variant 1, N for variant 2) are the *declared* sizes of X1
     and of the final set, computed from the public N
     (`Dataset.num_examples`), never counted from the private rows; every
     run on X1 divides by gamma*m and the final run by gamma*n. DP-SGD: learning rate x n/m
     (`jaxdp.train.scale_learning_rate`), because the update is the
     clipped-gradient sum divided by the expected batch gamma*N and KK Sec. 4
     keep the per-step noise-to-signal ratio; Adam-type optimizers are scale
     invariant (`jaxdp.train.keep_hparams`). The classifier preset picks by
     its optimizer; a user task must say. C, sigma, gamma and T are kept;
  4. train the final model once on X \\ X1 (variant 1) or X (variant 2),
     optionally warm-started from the tuned model.

The released outputs (the tuned candidate and the final model) satisfy
`acc.epsilon(acc.SubsampledTuning(...), delta, "best")`: KK Thm 1 for variant
1, Zhu-Wang subsampling composed with the final run for variant 2. When the
grid changes a candidate's privacy (gamma, epochs, sigma) the candidate and
the final run are accounted as `acc.UniformCandidates` over the grid's events
(KK Lemma 1), since which one runs depends on the data.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, NamedTuple, Optional, Sequence, Union

import jax
import numpy as np

from jaxdp import _validate
from jaxdp import accounting as acc
from jaxdp.data import Dataset
from jaxdp.sweep.build import as_space
from jaxdp.sweep.plan import candidate_event
from jaxdp.sweep.space import SearchSpace
from jaxdp.sweep.trainers import check as check_trainer
from jaxdp.sweep.store import CandidateStore, check_run_dir
from jaxdp.sweep.task_plan import TaskPlan
from jaxdp.train import TrainConfig
from jaxdp.train.sampling import poisson_mask
from jaxdp.train.trainer import run_planned
from jaxdp.tuning import _args
from jaxdp.tuning import draws
from jaxdp.tuning import search as search_lib
from jaxdp.tuning.results import SubsampledResult, Unreleased
from jaxdp.tuning.run_config import RunConfig, run_config as checked_run_config


@dataclasses.dataclass(frozen=True)
class SubsetTuning:
  """Koskela & Kulkarni's tuning on a subset: `subsampled_search`'s `subset=`.

  Args:
    q: the rate in (0, 1) at which each training example joins the tuning subset X1.
    variant: 1 (the final model trains on X \\ X1; KK Thm 1) or 2 (on X; Zhu-Wang).
    warm_start: start the final run from the tuned model's parameters.

  Raises:
    ValueError: q outside (0, 1), a variant other than 1 or 2, a non-bool warm_start.
  """
  q: float
  variant: int
  warm_start: bool = False

  def __post_init__(self):
    object.__setattr__(self, "q", _validate.probability("q", self.q))
    object.__setattr__(self, "variant", _check_variant(self.variant))
    object.__setattr__(self, "warm_start", _args.flag("warm_start", self.warm_start))


def _check_variant(variant) -> int:
  if isinstance(variant, bool) or variant not in (1, 2):
    raise ValueError(f"variant must be 1 (final run on X \\ X1) or 2 (final run on X), got {variant!r}")
  return int(variant)


def _split(data: Dataset, mask: np.ndarray, name: str, num_examples: int) -> Dataset:
  """The rows of `mask`, declared to hold the public `num_examples` (never the count drawn).

  `mask` may select no row (an empty Poisson draw): the split then holds zero
  rows, and every DP-SGD step on it sums no gradient and adds the noise.
  """
  return data.with_train_rows(mask, num_examples=num_examples, name=f"{data.name}[{name}]")


def declared_sizes(num_examples: int, q: float, variant: int) -> tuple[int, int]:
  """(m, n): the public sizes of X1 and of the final training set, from N and q alone.

  m = round(q N) is X1's expected size; n = N - m (variant 1) or N (variant 2).

  Raises:
    ValueError: m or n would be 0 (q N too small, or too close to N).
  """
  m = int(round(q * num_examples))
  n = num_examples - m if variant == 1 else num_examples
  if m < 1 or n < 1:
    raise ValueError(f"q={q!r} on N={num_examples} declared training examples gives a tuning subset "
                     f"of expected size m={m} and a final set of n={n}; both must be >= 1 (use a "
                     "larger data set or a q further from 0 and 1)")
  return m, n


def _cost(config: TrainConfig, num_examples: int) -> float:
  """Planned steps x expected batch size: per-example gradients of one run."""
  return float(config.num_steps * config.sampling_prob * num_examples)


def extrapolate(config: TrainConfig, subset_size: int, final_size: int) -> tuple[TrainConfig, float]:
  """KK Sec. 4 extrapolation from m tuning examples to n final examples.

  Args:
    config: the configuration selected on the subset.
    subset_size: m >= 1.
    final_size: n >= 1.

  Returns:
    (final config, learning-rate factor): the task's `extrapolate` maps the
    hyperparameters (DP-SGD: learning rate x n / m; Adam: kept). Clip norm,
    sigma, sampling rate and steps are kept, so the final run's DpEvent
    equals the candidate's.

  Raises:
    ValueError: the task has no `extrapolate`, or it changed something else
      than hyperparameters.
  """
  if not isinstance(config, TrainConfig):
    raise ValueError(f"config must be a TrainConfig, got {type(config).__name__}")
  m = _validate.integer("subset_size", subset_size, low=1)
  n = _validate.integer("final_size", final_size, low=1)
  task = config.task
  if task.extrapolate is None:
    raise ValueError(f"task {task.name!r} has no extrapolate: subsampled_search must carry the "
                     "hyperparameters tuned on m examples to n. Set Task(extrapolate="
                     "jaxdp.train.scale_learning_rate()) for SGD-type updates (learning rate x n/m, "
                     "KK Sec. 4) or Task(extrapolate=jaxdp.train.keep_hparams) for Adam-type ones")
  hparams = task.extrapolate(dict(config.hparams), m, n)
  if not isinstance(hparams, Mapping) or set(hparams) != set(config.hparams):
    raise ValueError(f"task {task.name!r}: extrapolate must return the same hyperparameter names "
                     f"{sorted(config.hparams)}, got {hparams!r}")
  lr = config.hparams.get("learning_rate")
  factor = float(hparams["learning_rate"]) / float(lr) if isinstance(lr, (int, float)) and lr else 1.0
  return dataclasses.replace(config, hparams=dict(hparams)), factor


def subsampled_search(config: Union[TrainConfig, SearchSpace],
                      search_space: Optional[Mapping[str, Sequence]], data: Dataset, *,
                      subset: SubsetTuning, distribution: acc.KDistribution, key: jax.Array,
                      target_delta: float = 1e-5, initial_params: Any = None,
                      run_config: Optional[RunConfig] = None) -> SubsampledResult:
  """Koskela-Kulkarni private tuning on a Poisson subset, then one final run.

  Args:
    config: base `TrainConfig` (or a ready `SearchSpace`; then `search_space` must be None).
    search_space: grid name -> values (see `jaxdp.sweep.SearchSpace`).
    data: private training data X and public test data (the score).
    subset: `SubsetTuning(q, variant, warm_start=False)`.
    distribution: law of K, e.g. `acc.Poisson(mean=10)` (KK use Poisson).
    key: PRNG key for the subset, K, the draws and every training run.
    target_delta: delta at which epsilon is reported.
    initial_params: as in `jaxdp.tuning.random_search`: public parameters every tuning
      candidate and the final run start from (with `subset.warm_start`, the final run starts
      from the tuned model instead).
    run_config: as in `jaxdp.tuning.random_search` (the tuning runs through its trainer; the
      final run, on this host, is stored in its `run_dir` too, under "final").

  Returns:
    A `SubsampledResult`.

  Raises:
    ValueError: bad arguments, or q N too small or too large for declared sizes m, n >= 1
      (from the public N and q alone). Never after the subset is drawn: an empty subset or
      final set is a valid outcome.

  Example:
    ::

      res = subsampled_search(config, {"learning_rate": [0.1, 1.0]}, data,
                              subset=SubsetTuning(q=0.2, variant=1), distribution=acc.Poisson(5),
                              key=jax.random.key(0))
      res.epsilon, res.score, res.unreleased.compute_ratio  # the last not for publication
  """
  # Every argument is checked before the subset is drawn, K is drawn or
  # anything trains, so whether the call fails never depends on the draws.
  run = checked_run_config(run_config)
  args = _checked(config, search_space, data, subset=subset, distribution=distribution, key=key,
                  target_delta=target_delta, initial_params=initial_params)
  check_trainer(run.trainer, args.plan)
  # The subset's plan fingerprints the full data (its origin): the final run reads the rest.
  fingerprint = args.plan.search_fields(
      "subsampled_search", args.key, q=args.subset.q, variant=args.subset.variant,
      distribution=args.distribution, delta=args.delta, warm_start=args.subset.warm_start)
  if run.run_dir is not None:  # another search there is refused before the subset is drawn
    check_run_dir(args.plan, run.run_dir, fingerprint, mechanism=False)
  subset_key, search_key, final_key = jax.random.split(args.key, 3)
  mask, final_mask = _draw_subset(args, subset_key)
  plan = args.plan.on_rows(_split(args.data, mask, f"X1, q={args.subset.q:g}", args.m))
  with CandidateStore(plan, run_dir=run.run_dir, fingerprint=fingerprint,
                      trainer=run.trainer) as store:
    # Papernot-Steinke random search on X1, with the same key use as `random_search`.
    cands = draws.draw_search(args.plan, args.distribution, search_key)
    if not cands:  # nothing trains, yet the cache gets the entries a search of K >= 1 leaves
      store.compile_unrun(draws.draw_candidates(args.plan, 1, search_key)[0])
    results = store.train(cands)
    best = draws.best_index(results)
    if best is None:  # the final run still trains, at the first grid point (data-independent)
      search_lib.warn_nothing_released("subsampled_search's random search on the subset",
                                        args.distribution)
    chosen = args.plan.run_of(cands[best].config if best is not None else args.plan.configs[0])
    final_config, factor = extrapolate(chosen.config, args.m, args.n)
    final_data = _split(args.data, final_mask, "X \\ X1" if args.subset.variant == 1 else "X",
                        args.n)
    warm = results[best].params if (args.subset.warm_start and best is not None) else None
    final_run = chosen.derive(final_config, final_data, initial=chosen.initial if warm is None else warm)
    _check_final_event(final_run, args.plan)
    final = store.train_lone("final", final_run, lambda: run_planned(final_run, final_data, final_key))
    search_lib.report_resumes(store)
  return _result(args, cands, results, best, final_config, factor, final, mask, store)


def _result(args, cands, results, best, final_config, factor, final, mask,
            store: CandidateStore) -> SubsampledResult:
  released = best is not None
  chosen_point = dict(cands[best].point) if released else dict(args.plan.points[0])
  spent = sum(_cost(c.config, args.m) for c in cands) + _cost(final_config, args.n)
  mean_cost = float(np.mean([_cost(c, args.data.num_examples) for c in args.plan.configs]))
  return SubsampledResult(
      hyperparameters={name: final_config.value(name) for name in chosen_point},
      config=final_config, params=final.params, score=float(final.test_score),
      epsilon=args.epsilon, delta=args.delta, event=args.event,
      score_source=final.score_source,
      tuned_hyperparameters=chosen_point if released else None,
      tuned_score=float(results[best].score) if released else float("nan"),
      learning_rate_factor=factor, subset_size=args.m, final_train_size=args.n,
      variant=args.subset.variant, q=args.subset.q,
      unreleased=Unreleased(num_candidates=len(cands), resumed=store.resumed,
                            resumed_steps=dict(store.resumed_steps), subset_mask=mask,
                            gradient_evaluations=spent,
                            baseline_gradient_evaluations=args.distribution.mean * mean_cost))


class _Checked(NamedTuple):
  """`subsampled_search`'s arguments after every check, and the accounted event."""
  plan: TaskPlan
  data: Dataset
  subset: SubsetTuning
  m: int
  n: int
  distribution: acc.KDistribution
  key: jax.Array
  delta: float
  event: Any
  epsilon: float


def _checked(config, search_space, data, *, subset, distribution, key, target_delta,
             initial_params) -> _Checked:
  if not isinstance(subset, SubsetTuning):
    raise ValueError(f"subset must be a jaxdp.tuning.SubsetTuning(q, variant), got {subset!r:.200}")
  if not isinstance(config, (TrainConfig, SearchSpace)):
    # A training function reads its own data: the search cannot split it into X1 and the rest.
    raise ValueError(f"config must be a TrainConfig or SearchSpace (subsampled_search splits the "
                     f"Dataset it is given; a TrainFunction reads its own), got {type(config).__name__}")
  plan = TaskPlan.build(as_space(config, search_space), data, initial_params=initial_params)
  # Every configuration's task, not only the base's: a `derive` may swap in another.
  if any(run.config.task.private_score for run in plan.runs):
    raise ValueError("subsampled_search does not support DP scores on private validation data: "
                     "KK's amplification by subsampling covers the training set only. Score on a "
                     "public test split")
  if any(c.sampling_prob is None for c in plan.configs):
    raise ValueError("subsampled_search needs sampling_prob, not batch_size: the candidates run on "
                     "a subset and the final model on another set, so q = batch_size / N would be "
                     "the rate of neither")
  m, n = declared_sizes(data.num_examples, subset.q, subset.variant)
  distribution = _args.distribution(distribution)
  key = _validate.prng_key("key", key)
  delta = _args.target_delta(target_delta)
  candidate = candidate_event(plan)
  # Every final run the search could make, planned now: a task without `extrapolate`, or an
  # extrapolation the model or the public start cannot take, fails before any work.
  analyses: dict = {}
  for run in plan.runs:
    final_config, _ = extrapolate(run.config, m, n)
    _check_final_event(run.derive(final_config, data, initial=run.initial, analyses=analyses), plan)
  # The final run's DpEvent is the selected candidate's (extrapolation keeps
  # gamma, sigma, T); which candidate is data-dependent, so account the worst.
  event = acc.SubsampledTuning(tune=acc.RepeatAndSelect(candidate, distribution), final=candidate,
                               q=subset.q, variant=subset.variant)
  eps = acc.epsilon(event, delta, method="best")  # also fails early on a bad delta
  return _Checked(plan, data, subset, m, n, distribution, key, float(delta), event, eps)


def _check_final_event(final_run, plan: TaskPlan) -> None:
  """Raises ValueError unless the final run's DpEvent is one a candidate has: what
  `SubsampledTuning(final=...)` accounts (extrapolation keeps C, sigma, q and T)."""
  if all(final_run.dp_event != run.dp_event for run in plan.runs):
    raise ValueError(f"the final run's DpEvent {final_run.dp_event} is no candidate's: the task's "
                     "extrapolate must change hyperparameters only, never C, sigma, q or steps")


def _draw_subset(args: _Checked, subset_key: jax.Array) -> tuple[np.ndarray, np.ndarray]:
  """(X1's mask, the final set's mask): each example joins X1 independently (KK Alg. 1).

  Guarantees:
    Each row joins X1 independently with probability floor(q 2**32) / 2**32,
    in (q - 2**-32, q]: never above the q that is accounted
    (`jaxdp.train.sampling.poisson_mask` with the Python float q: an exact
    integer comparison of 32 uniform bits). A float32 uniform compared with q
    would realise q rounded *up* to the 2**-23 grid: 0.30000007 for q = 0.3,
    1.19e-7 for q = 1e-7. Either set may be empty (probability (1 - q)^rows
    and, for variant 1, q^rows): that is an outcome of the mechanism, whose
    runs on the empty set are noise only, and nothing here raises, so
    whether the call fails never depends on the draw.
  """
  # Drawn over the public row capacity, then cut to the rows present on the host: row i keeps
  # its own draw, and no program is compiled for the private row count.
  draws = np.asarray(poisson_mask(subset_key, args.data.row_capacity, args.subset.q))
  mask = draws[:args.data.num_train_rows]
  final_mask = ~mask if args.subset.variant == 1 else np.ones_like(mask)
  return mask, final_mask
