"""`LoopSpec`: everything static about one candidate's run (task, static hyperparameters, data
structure, q, T, padding, microbatch), derived once from its configuration and the data's
shapes. Equal specs share one compiled program (`jaxdp.train.program`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validate
from jaxdp.data import Dataset
from jaxdp.train import ghost_analysis
from jaxdp.train import microbatching
from jaxdp.train import trainable as trainable_lib
from jaxdp.train.config import TrainConfig
from jaxdp.train.sampling import default_padded_batch_size, validate_batch_sizes
from jaxdp.train.task import HParams, Task

PyTree = Any


def device_dtype(leaf) -> np.dtype:
  """The dtype `jnp.asarray(leaf)` will have (float64 -> float32 without x64)."""
  return jax.dtypes.canonicalize_dtype(leaf.dtype)


def abstract(tree: PyTree, rows: Optional[int] = None) -> PyTree:
  """ShapeDtypeStructs of `tree` as it will be on device (leading axis `rows` if given)."""
  return jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(
      np.shape(leaf) if rows is None else (rows,) + np.shape(leaf)[1:], device_dtype(leaf)), tree)


def structure(tree: PyTree) -> tuple:
  return (jax.tree.structure(tree),
          tuple((tuple(np.shape(x)[1:]), str(device_dtype(x))) for x in jax.tree.leaves(tree)))


def _hashable_items(task: Task, values: Mapping[str, Any]) -> tuple:
  items = tuple(sorted(values.items()))
  try:
    hash(items)
  except TypeError:
    bad = [k for k, v in items if not _is_hashable(v)]
    raise ValueError(f"static hyperparameter(s) {bad} of task {task.name!r} must be hashable (they "
                     "key the compiled programs)") from None
  return items


def _is_hashable(value) -> bool:
  try:
    hash(value)
    return True
  except TypeError:
    return False


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopSpec:
  """Everything static about the inner loop: equal specs share one compilation.

  Attributes:
    task: the `Task` (compared by identity).
    static_hparams: sorted (name, value) pairs of the static hyperparameters.
    auto_static: sorted (name, why) pairs of the floats made static because the
      optimizer factory needs their values (`Task.concrete_hparams`).
    traced_names: names of the traced hyperparameters (vmapped arrays).
    train_structure: pytree structure, per-example shapes and dtypes of the
      training data.
    num_examples: N, the declared (public) training set size.
    sampling_prob: q.
    num_steps: planned steps.
    padded_batch_size: rows on the common path.
    microbatch_size: rows per per-example-gradient call.
    eval_batch_size: rows per model call when scoring.
  """
  task: Task
  static_hparams: tuple
  traced_names: tuple
  auto_static: tuple = ()
  train_structure: tuple
  num_examples: int
  sampling_prob: float
  num_steps: int
  padded_batch_size: int
  microbatch_size: int
  eval_batch_size: int

  @classmethod
  def from_config(cls, config: TrainConfig, data: Dataset, *,
                  analyses: Optional[dict] = None) -> "LoopSpec":
    """Resolves q, T and the padding/microbatch defaults for `data`.

    `analyses`: a dict a caller planning many configurations at once passes
    to every call (`jaxdp.train.run_plan.plan_runs`), so the traces that
    decide what is static, the clipping analysis and the per-example bytes
    (`program_traces`) run once per program, not once per configuration.
    """
    analyses = {} if analyses is None else analyses
    n = data.num_examples
    q = config.sampling_prob_for(n)
    ex = config.execution
    micro = ex.microbatch_size
    padded = ex.padded_batch_size
    static, traced = config.task.split_hparams(config.hparams)
    memo = ("auto_static", config.task, _hashable_items(config.task, dict(static)),
            tuple(sorted(traced)), structure(data.train), config.num_steps_for(n))
    if memo not in analyses:
      analyses[memo] = _auto_static(config.task, static, tuple(sorted(traced)), data.train,
                                    num_steps=config.num_steps_for(n), analyses=analyses)
    auto = analyses[memo]
    static.update({name: traced.pop(name) for name in auto})
    static = _hashable_items(config.task, static)
    # Padding is sized from the declared N too, never from the rows present: it is a static
    # shape of the program, which the persistent compilation cache keeps (jaxdp.train.padding).
    rows = n
    if micro is None:
      fixed = padded is not None
      padded = padded if fixed else default_padded_batch_size(rows, q)
      per_example = program_traces(config.task, static, data.train, analyses).per_example_bytes
      if per_example is None:  # the task does not fit the data: check_task will say why
        micro = padded
      elif fixed:
        micro = microbatching.auto_microbatch_size(padded, per_example, microbatching.budget_bytes(),
                                                   divide=True)
      else:
        micro = _poisson_microbatch(n, q, per_example, padded)
        padded = micro * math.ceil(padded / micro)
    elif padded is None:
      padded = default_padded_batch_size(rows, q, micro)
    validate_batch_sizes(padded, micro)
    return cls(task=config.task, static_hparams=static, auto_static=tuple(sorted(auto.items())),
               traced_names=tuple(sorted(traced)), train_structure=structure(data.train),
               num_examples=n, sampling_prob=q, num_steps=config.num_steps_for(n),
               padded_batch_size=padded, microbatch_size=micro, eval_batch_size=ex.eval_batch_size)

  def for_data_parallel(self, degree: int) -> "LoopSpec":
    """This spec with its common path cut into a multiple of `degree` microbatches.

    Under data parallelism over `degree` devices (`build_train_loop`'s
    `axis_name`) device d sums microbatches d, d + degree, ...; with n
    microbatches on the common path and `degree` not dividing n some devices
    would idle there. The n' = degree * ceil(n / degree) microbatches of
    m' = ceil(padded / n') rows are never larger than before (memory stays
    bounded) and never hold fewer rows in all. Performance only: every
    sampled row is processed whatever the padding and microbatch size.

    Raises:
      ValueError: `degree` is not a positive integer.
    """
    degree = _validate.integer("degree", degree, low=1)
    parts = self.padded_batch_size // self.microbatch_size
    if parts % degree == 0:
      return self
    parts = degree * math.ceil(parts / degree)
    micro = math.ceil(self.padded_batch_size / parts)
    return dataclasses.replace(self, padded_batch_size=micro * parts, microbatch_size=micro)

  def model(self):
    """The task's `Model` for this spec's static hyperparameters."""
    return self.task.model_for(dict(self.static_hparams))

  def hparams(self, traced: Mapping[str, Any]) -> HParams:
    """All hyperparameters: the static values and the (traced) arrays, with `num_steps` the
    spec's T (what the optimizer factory gets inside the loop)."""
    return HParams({**dict(self.static_hparams), **traced}, num_steps=self.num_steps)


def _poisson_microbatch(n: int, q: float, per_example: int, padded: int) -> int:
  """The automatic microbatch of a Poisson batch: least expected work within the budget on a CPU
  (`microbatching.poisson_microbatch_size`, from the declared N and q); on accelerators, where it
  is not measured, the fewest equal microbatches of the padded batch (`auto_microbatch_size`)."""
  budget = microbatching.budget_bytes()
  if jax.devices()[0].platform != "cpu":
    return microbatching.auto_microbatch_size(padded, per_example, budget)
  return microbatching.poisson_microbatch_size(n, q, per_example, budget)


def _abstract_params(task: Task, model, example: PyTree) -> PyTree:
  """The parameters' shapes, for an abstract batch (the task's inputs function runs traced)."""
  return jax.eval_shape(lambda b: model.init(jax.random.key(0), task.model_inputs(b)), example)


def _params_once(task: Task, static_hparams: tuple, train: PyTree, analyses: dict):
  """`_abstract_params` for one example, traced once per (task, static values, data structure)
  in `analyses`; None if the model cannot be built or initialised (check_task says why)."""
  memo = ("params", task, static_hparams, structure(train))
  if memo not in analyses:
    try:
      analyses[memo] = _abstract_params(task, task.model_for(dict(static_hparams)),
                                        abstract(train, rows=1))
    except Exception:  # pylint: disable=broad-except
      analyses[memo] = None
  return analyses[memo]


def _auto_static(task: Task, static: dict, traced_names: tuple, train: PyTree,
                 num_steps: Optional[int] = None, analyses: Optional[dict] = None) -> dict:
  """`task.concrete_hparams` for these traced names, on the trainable parameters' shapes:
  name -> why, in plain words. `num_steps`: the run's T, what the optimizer factory reads as
  `hp.num_steps` (None: a stand-in). `analyses`: as in `LoopSpec.from_config`."""
  if not traced_names:
    return {}
  params = _params_once(task, _hashable_items(task, static), train, {} if analyses is None else analyses)
  if params is None:
    return {}  # the task does not fit the data: check_task says why
  try:
    trained, _ = trainable_lib.partition(params, task.trainable_mask(params))
  except Exception:  # pylint: disable=broad-except
    return {}  # the task does not fit the data: check_task says why
  hparams = {**static, **{name: 0.0 for name in traced_names}}
  return dict(task.concrete_hparams(hparams, traced_names, trained, num_steps=num_steps))


@dataclasses.dataclass(frozen=True, eq=False)
class ProgramTraces:
  """What tracing one program's loss on one abstract example found, once per program
  (`program_traces`): read by the microbatch's memory estimate, by `checks.check_program` and
  by a dry run's clipping paths, so none of them traces the loss again.

  Attributes:
    params: the model's parameters as `jax.ShapeDtypeStruct`s (one example's init); None if
      the model cannot be initialised on the data.
    mask: `Task.trainable_mask(params)`; None if params is None or the mask fails.
    split: the trainable parameters' `ghost_analysis.GhostSplit` under `Task.clipping`;
      None for 'vmap' or if the loss cannot be traced.
    per_example_bytes: `microbatching.per_example_bytes` of one example's gradient (the ghost
      leaves left out); None if any trace above failed, which `check_program` then names.
  """
  params: PyTree
  mask: PyTree
  split: Optional[ghost_analysis.GhostSplit]
  per_example_bytes: Optional[int]


def program_traces(task: Task, static_hparams: tuple, train: PyTree,
                   analyses: Optional[dict] = None) -> ProgramTraces:
  """The `ProgramTraces` of the task's program for `static_hparams` (sorted (name, value)
  pairs, `LoopSpec.static_hparams`) on the structure of `train`, traced once per dict
  `analyses` (a plan's; None: traced now)."""
  analyses = {} if analyses is None else analyses
  memo = ("traces", task, static_hparams, structure(train))
  if memo not in analyses:
    analyses[memo] = _trace(task, static_hparams, train, analyses)
  return analyses[memo]


def _trace(task: Task, static_hparams: tuple, train: PyTree, analyses: dict) -> ProgramTraces:
  params = _params_once(task, static_hparams, train, analyses)
  if params is None:
    return ProgramTraces(params=None, mask=None, split=None, per_example_bytes=None)
  mask = split = None
  example = abstract(train, rows=1)
  try:
    model = task.model_for(dict(static_hparams))
    mask = task.trainable_mask(params)
    trained, frozen = trainable_lib.partition(params, mask)
    loss = task.per_example_loss(model)
    split = _ghost_split(task, model, trained, frozen, example)
    per_example = microbatching.per_example_bytes(
        lambda t, b, f: trainable_lib.partial_loss(loss, f)(t, b), trained, example, frozen,
        without=() if split is None else split.ghost_leaves,
        extra=0 if split is None else split.norm_bytes)
  except Exception:  # pylint: disable=broad-except
    return ProgramTraces(params=params, mask=mask, split=split, per_example_bytes=None)
  return ProgramTraces(params=params, mask=mask, split=split, per_example_bytes=per_example)


def _ghost_split(task: Task, model, trained: PyTree, frozen: PyTree, example: PyTree):
  """`ghost_analysis.ghost_layers` for the task's clipping on these (abstract) values; None for 'vmap'."""
  if task.clipping == "vmap":
    return None
  found = []

  def analyse(frozen):  # traced, so the frozen leaves need no memory
    loss = trainable_lib.partial_loss(task.per_example_loss(model), frozen)
    found.append(ghost_analysis.ghost_layers(loss, trained, example, auto=task.clipping == "auto"))
    return 0
  jax.eval_shape(analyse, frozen)
  return found[0]


def _clipping_inputs(spec: LoopSpec, train: PyTree, traces: Optional[ProgramTraces]) -> tuple:
  """(params, trainable mask, ghost split) of the spec's model: the traces' where they got that
  far, else traced again (for a plan never checked), raising what fails."""
  if traces is None:
    traces = program_traces(spec.task, spec.static_hparams, train)
  if traces.mask is not None and (traces.split is not None or spec.task.clipping == "vmap"):
    return traces.params, traces.mask, traces.split
  example = abstract(train, rows=1)
  model = spec.model()
  params = _abstract_params(spec.task, model, example)
  leaf_mask = spec.task.trainable_mask(params)
  trained, frozen = trainable_lib.partition(params, leaf_mask)
  return params, leaf_mask, _ghost_split(spec.task, model, trained, frozen, example)


def clipping_paths(spec: LoopSpec, train: PyTree, traces: Optional[ProgramTraces] = None) -> tuple:
  """(parameter path, 'ghost', 'per-example' or 'frozen', why) for every parameter of the spec's
  model, in tree order, under its `Task.clipping` and `Task.trainable` (what a dry run prints).
  `traces`: the spec's `program_traces` on `train`'s structure (None: traced now)."""
  params, leaf_mask, split = _clipping_inputs(spec, train, traces)
  calls = {}  # a trained leaf's keystr -> the Embed/Dense/DenseGeneral/Conv call reading it
  for layer in () if split is None else split.layers:
    call = f"{layer.kind} {layer.module!r}" + (f" (call {layer.call})" if layer.call else "")
    for leaf in layer.leaves:  # a leaf read by two calls is named by its first
      calls.setdefault(leaf, ("ghost", call) if layer.reason is None else ("per-example",
                                                                           f"{call}: {layer.reason}"))
  out = []
  for (path, _), trains in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(leaf_mask)):
    if not trains:
      out.append((trainable_lib.path_str(path), "frozen", "Task.trainable leaves it out"))
    elif split is None:
      out.append((trainable_lib.path_str(path), "per-example", "Task(clipping='vmap')"))
    else:
      out.append((trainable_lib.path_str(path), *calls.get(
          jax.tree_util.keystr(path), ("per-example",
                                       "no Embed/Dense/DenseGeneral/Conv call reads it alone"))))
  return tuple(out)


def per_example_bytes(spec: LoopSpec, train: PyTree) -> Optional[int]:
  """Working set of one example's gradient for this spec's task (see `jaxdp.train.microbatching`)."""
  return program_traces(spec.task, spec.static_hparams, train).per_example_bytes


def traced_hparams(spec: LoopSpec, config: TrainConfig) -> dict:
  """The config's traced hyperparameters as float32 scalars (vmappable)."""
  return {name: jnp.asarray(config.hparams[name], jnp.float32) for name in spec.traced_names}
