"""Checks of a candidate against its data, before anything compiles or trains.

Each raises a `ValueError` that names the culprit: the data lacks the split
the score reads, the model cannot take the inputs, the loss is not one value
per example, a score is not a scalar, an optimizer factory needs a concrete
value, or warm-start parameters do not fit the model. Nothing here computes
on the private values: only shapes are traced.
"""

from __future__ import annotations

import functools
import numbers
import os
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxdp.data import Dataset
from jaxdp.train.plan import DpSgdPlan
from jaxdp.train import padding
from jaxdp.train import trainable as trainable_lib
from jaxdp.train.program import build_evaluate, build_outputs, build_private_score, build_train_loop
from jaxdp.train.loop_spec import LoopSpec, ProgramTraces, abstract, program_traces
from jaxdp.train.task import _CONCRETIZATION_ERRORS, DpScore, Model, NoisyMean, Task
from jaxdp.train.trainable import path_str

PyTree = Any


# -- what the messages say: the user's function, and what it returned ------------


class _Leaf:
  """A leaf of what a user's function returned, as a message shows it.

  An array (or tracer, or ShapeDtypeStruct) shows its shape as a plain tuple,
  a bool its value, anything else its type name. No array is kept: a leaf
  made while tracing outlives the trace.
  """

  def __init__(self, x: Any, dtypes: bool = False):
    if isinstance(x, _Leaf):
      self.shape, self.dtype, self.text = x.shape, x.dtype, x.text
    elif hasattr(x, "shape") and hasattr(x, "dtype"):
      self.shape, self.dtype = tuple(x.shape), str(x.dtype)
      self.text = str(self.shape)
    else:
      number = isinstance(x, numbers.Number)
      self.shape, self.dtype = ((), type(x).__name__) if number else (None, None)
      self.text = repr(x) if isinstance(x, bool) else type(x).__name__
    if dtypes and self.shape is not None:
      self.text = f"{self.dtype}[{','.join(map(str, self.shape))}]"

  def __repr__(self) -> str:
    return self.text


def describe_tree(tree: PyTree, dtypes: bool = False) -> str:
  """`tree` for a message: its nesting, each array as its shape, e.g. "{'logits': (2, 10)}".

  With `dtypes`, arrays show as 'float32[2,10]' (for where only a dtype differs).
  """
  return repr(jax.tree.map(lambda x: _Leaf(x, dtypes), tree))


def _kind(tree: PyTree) -> str:
  """'an array of shape (2,)', or 'a dict of shapes {...}', for a message."""
  if isinstance(tree, _Leaf) and tree.shape is not None:
    return f"an array of shape {tree}"
  if hasattr(tree, "shape") and hasattr(tree, "dtype"):
    return f"an array of shape {describe_tree(tree)}"
  if tree is None or isinstance(tree, _Leaf):
    return describe_tree(tree)
  return f"a {type(tree).__name__} of shapes {describe_tree(tree)}"


def _name(fn: Any) -> str:
  """A user's function as a message names it: its name, or where a lambda is written."""
  if isinstance(fn, functools.partial):
    return f"partial({_name(fn.func)})"
  if isinstance(fn, nn.Module):
    return type(fn).__name__
  name = getattr(fn, "__qualname__", None)
  if name is None:
    return type(fn).__name__  # a callable object
  code = getattr(fn, "__code__", None)
  if "<lambda>" in name and code is not None:
    return f"(lambda at {os.path.basename(code.co_filename)}:{code.co_firstlineno})"
  # 'test.<locals>.loss' says less than 'loss' to the one who wrote it.
  return getattr(fn, "__name__", name) if "<locals>" in name else name


def _model_name(task: Task, model: Model) -> str:
  owner = getattr(model.apply, "__self__", None)
  what = (type(owner).__name__ if isinstance(owner, nn.Module)
          else f"Model(init={_name(model.init)}, apply={_name(model.apply)})")
  if not isinstance(task.model, (nn.Module, Model)):
    what += f" from the factory {_name(task.model)}"
  return what


def _score_name(task: Task) -> str:
  if task.score is None:
    return f"(default: minus the mean of the loss {_name(task.loss)})"
  if isinstance(task.score, (NoisyMean, DpScore)):
    return f"{type(task.score).__name__}(fn={_name(task.score.fn)})"
  return _name(task.score)


def _inputs_name(task: Task) -> str:
  if task.inputs is None:
    return "the default Task.inputs"
  return f"Task.inputs={task.inputs!r}" if isinstance(task.inputs, (str, int)) else \
      f"Task.inputs={_name(task.inputs)}"


def _unwrap_treedefs(text: str) -> str:
  """Every 'PyTreeDef(X)' in `text` as X: the nesting is readable, the wrapper is JAX's."""
  out, i = [], 0
  while (j := text.find("PyTreeDef(", i)) >= 0:
    out.append(text[i:j])
    k = start = j + len("PyTreeDef(")
    depth = 1
    while k < len(text) and depth:
      depth += {"(": 1, ")": -1}.get(text[k], 0)
      k += 1
    out.append(text[start:k - 1] if depth == 0 else text[start:])
    i = k
  out.append(text[i:])
  return "".join(out)


def _raised(err: BaseException) -> str:
  """An inner error in one line, after jaxdp's own words (the whole of it stays chained)."""
  lines = str(err).strip().splitlines()
  text = _unwrap_treedefs(lines[0]).strip() if lines else ""
  if len(text) > 240:
    text = text[:240] + "..."
  elif len(lines) > 1:
    text += " ..."
  return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _returned(fn, *args) -> Any:
  """What `fn(*args)` returns, traced on abstract `args`, as a tree of `_Leaf` (any leaf type)."""
  box = []

  def traced(*a):
    box.append(jax.tree.map(_Leaf, fn(*a)))
    return 0
  jax.eval_shape(traced, *args)
  return box[0]


def _first_array(tree: PyTree) -> str:
  """Where the first array of a container sits, e.g. "['logits']" (for a hint)."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return jax.tree_util.keystr(leaves[0][0]) if leaves else ""


def _not_an_array(what: str, fn_name: str, model_name: str, outputs: PyTree) -> str:
  """The hint when a loss or score written for an array is handed the model's container."""
  at = _first_array(outputs)
  return (f"the model {model_name} returns {_kind(outputs)}, not an array, and {what} {fn_name} "
          f"fails on it: have {what} read the array it needs (e.g. outputs{at}) or have the model "
          "return that array")


def check_data(task: Task, data: Dataset) -> None:
  """Raises ValueError unless `data` has the split the task's score reads."""
  if not isinstance(data, Dataset):
    raise ValueError(f"data must be a jaxdp.data.Dataset (private train, public test, private "
                     f"validation), got {type(data).__name__}")
  if task.private_score and data.private_validation is None:
    raise ValueError(f"task {task.name!r} has a DP score, which reads data.private_validation, but "
                     "it is None; give Dataset(private_validation=...)")
  # Checked again (leaves agreeing on N, within the capacity): a Dataset may be changed after
  # its own checks, and nothing may fail later, after K is drawn.
  if data.num_train_rows > data.row_capacity:
    raise ValueError(f"train holds more rows than the row capacity {data.row_capacity} of "
                     f"num_examples={data.num_examples}")
  padding.check_validation(task, data)
  if not task.private_score and data.test is None:
    raise ValueError(f"task {task.name!r} scores on the public test split, but data.test is None. "
                     "jaxdp never scores on the private training data: give public data as "
                     "Dataset(test=...), or score privately with jaxdp.train.NoisyMean / DpScore "
                     "on Dataset(private_validation=...)")


def check_task(spec: LoopSpec, data: Dataset) -> None:
  """Checks `data` (`check_data`), then the program of `spec` on its shapes (`check_program`).

  Raises:
    ValueError: the model cannot take the inputs, the loss does not fit the
      model's outputs or is not one value per example, a score is not a
      scalar, or the optimizer fails on the parameters; each names the culprit.
  """
  check_data(spec.task, data)
  check_program(spec, data)


def check_program(spec: LoopSpec, data: Dataset, traces: Optional[ProgramTraces] = None) -> None:
  """Shape-checks the task's program of `spec` on `data`, which `check_data` accepted (no
  compilation, no training: every function is traced on abstract values).

  `traces`: the spec's `loop_spec.program_traces` on `data.train`, which traced the model's
  init, the gradient of one example's loss and the clipping analysis (a plan's; None: traced
  now). The DP step is checked from them and from the optimizer's init and update with the
  traced hyperparameters; only where one of these fails is the whole DP loop traced, so that
  the message names what the run itself would raise. What fails only inside the loop (a loss
  that cannot be vmapped, say) is then raised by JAX when the program compiles.

  Raises:
    ValueError: as `check_task`.
  """
  task = spec.task
  traces = program_traces(task, spec.static_hparams, data.train) if traces is None else traces
  two = abstract(data.train, rows=2)
  model = spec.model()
  params, outputs = _model_on(spec, model, _inputs(task, two), traces.params)
  try:
    losses = jax.eval_shape(lambda o, b: _losses(task, task.loss(o, b)), outputs, two)
  except Exception as err:  # pylint: disable=broad-except
    raise ValueError(_loss_fails(task, model, outputs, err)) from err
  if getattr(losses, "shape", None) != (2,):
    raise ValueError(_loss_not_per_example(task, model, params, two, losses))
  if not jnp.issubdtype(losses.dtype, jnp.floating):
    raise ValueError(f"task {task.name!r}: the loss {_name(task.loss)} returned {losses.dtype} values; "
                     "per-example losses must be floats (training differentiates them)")
  _check_score(spec, model, params, data)
  _check_step(spec, params, traces, data)


def _losses(task: Task, out: Any) -> Any:
  return out[0] if task.has_aux else out  # as `Task.per_example_loss`


def _inputs(task: Task, two: PyTree) -> PyTree:
  try:
    return jax.eval_shape(task.model_inputs, two)
  except Exception as err:  # pylint: disable=broad-except
    # The default selector raises jaxdp's own advice; a user's selector, anything.
    why = str(err) if task.inputs is None and isinstance(err, ValueError) else \
        f"{_inputs_name(task)} raised {_raised(err)}"
    raise ValueError(f"task {task.name!r}: inputs cannot select the model input from a batch of "
                     f"shapes {describe_tree(two)}: {why}") from err


def _model_on(spec: LoopSpec, model: Model, inputs: PyTree, params: PyTree) -> tuple:
  """(parameters, outputs on `inputs`) of the model; `params`: the traces' (None: initialised
  here, for its error)."""
  task = spec.task
  stage = "init"
  try:
    if params is None:
      params = jax.eval_shape(model.init, jax.random.key(0), inputs)
    stage = "apply"
    return params, jax.eval_shape(model.apply, params, inputs)
  except Exception as err:  # pylint: disable=broad-except
    raise ValueError(f"task {task.name!r}: the model {_model_name(task, model)} (static hyperparameters "
                     f"{dict(spec.static_hparams)}) cannot take inputs of shape {describe_tree(inputs)}: "
                     f"its {stage} raised {_raised(err)}") from err


def _check_score(spec: LoopSpec, model: Model, params: PyTree, data: Dataset) -> None:
  task = spec.task
  split = data.private_validation if task.private_score else data.test
  which = "private_validation" if task.private_score else "test"
  batch = abstract(split)
  try:
    if task.private_score:
      got = jax.eval_shape(build_private_score(spec), params, batch, jax.random.key(0))
    else:
      got = jax.eval_shape(build_evaluate(spec), params, batch)[0]
  except Exception as err:  # pylint: disable=broad-except
    raise ValueError(_score_problem(spec, model, params, batch, which, err)) from err
  if tuple(got.shape) != ():
    raise ValueError(_score_problem(spec, model, params, batch, which, None))


def _check_step(spec: LoopSpec, params: PyTree, traces: ProgramTraces, data: Dataset) -> None:
  """One DP step: from the traces and the optimizer where they all passed, else the whole loop."""
  scalar = jax.ShapeDtypeStruct((), jnp.float32)
  traced = {k: scalar for k in spec.traced_names}
  if traces.per_example_bytes is not None:
    trained, _ = trainable_lib.partition(traces.params, traces.mask)
    # Typed as `clipping.weighted_sum` returns per-example gradient sums (float32 or wider): every
    # sum of a float32 model, and the vmap path's of any model.
    summed = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, jnp.promote_types(p.dtype, jnp.float32)),
                          trained)
    if _optimizer_problem(spec, trained, traced, summed) is None:
      return

  def one_run(p, clip, sigma, t, train):
    plan = DpSgdPlan(l2_clip_norm=clip, noise_multiplier=sigma, sampling_prob=spec.sampling_prob,
                     num_steps=spec.num_steps, num_examples=spec.num_examples)
    return build_train_loop(spec)(p, plan, t, jax.random.key(0), train)

  try:
    jax.eval_shape(one_run, params, scalar, scalar, traced, abstract(data.train))
  except Exception as err:  # pylint: disable=broad-except
    raise ValueError(_step_fails(spec, params, traced, err)) from err


# The diagnoses below run only once a check has failed: they trace the user's
# functions one at a time to say which one returned what.


def _loss_fails(task: Task, model: Model, outputs: PyTree, err: BaseException) -> str:
  head = (f"task {task.name!r}: the loss does not fit the model's outputs {describe_tree(outputs)} "
          f"(a batch of 2)")
  if not isinstance(outputs, jax.ShapeDtypeStruct):
    return f"{head}: {_not_an_array('the loss', _name(task.loss), _model_name(task, model), outputs)}"
  return f"{head}: the loss {_name(task.loss)} raised {_raised(err)}"


def _loss_not_per_example(task: Task, model: Model, params: PyTree, two: PyTree, losses: Any) -> str:
  name = _name(task.loss)
  if task.has_aux:
    raw = _returned(lambda p, b: task.loss(model.apply(p, task.model_inputs(b)), b), params, two)
    if not (isinstance(raw, (tuple, list)) and len(raw) == 2):
      return (f"task {task.name!r}: with Task(has_aux=True) the loss {name} must return "
              f"(losses, aux), losses of shape (2,) for a batch of 2; it returned {_kind(raw)}")
  got = jax.tree.map(_Leaf, losses)
  hint = ""
  if isinstance(got, _Leaf) and got.shape == ():
    hint = " (a scalar: return each example's loss, not their mean or sum)"
  elif isinstance(got, tuple) and len(got) == 2 and not task.has_aux:
    hint = " (a pair: if the second item is auxiliary output, set Task(has_aux=True))"
  return (f"task {task.name!r}: the loss must return one value per example, shape (2,) for a batch "
          f"of 2; the loss {name} returned {describe_tree(got)}{hint}")


def _score_problem(spec: LoopSpec, model: Model, params: PyTree, batch: PyTree, which: str,
                   err: Optional[BaseException]) -> str:
  task = spec.task
  name, rows = _score_name(task), jax.tree.leaves(batch)[0].shape[0]
  fails = f"task {task.name!r}: the score fails on data.{which}"
  outputs_fn = build_outputs(spec)
  try:
    outputs = jax.eval_shape(outputs_fn, params, batch)
  except Exception as inner:  # pylint: disable=broad-except
    return (f"{fails}: the model {_model_name(task, model)} cannot take it ({rows} examples): "
            f"{_raised(inner)}")
  try:
    if task.private_score:
      got = _returned(lambda p, b, k: task.score(outputs_fn(p, b), b, k), params, batch,
                      jax.random.key(0))
    else:
      got = _returned(lambda p, b: task.public_score(outputs_fn(p, b), b), params, batch)
  except Exception as inner:  # pylint: disable=broad-except
    if not isinstance(outputs, jax.ShapeDtypeStruct):
      return f"{fails}: {_not_an_array('the score', name, _model_name(task, model), outputs)}"
    return (f"{fails}: on the model's outputs {describe_tree(outputs)}, the score {name} raised "
            f"{_raised(inner)}")
  if not (isinstance(got, _Leaf) and got.shape == ()):
    hint = ""
    if isinstance(got, _Leaf) and got.shape == (rows,):
      hint = "; that is one value per example: return their mean (e.g. jnp.mean(...))"
    return (f"task {task.name!r}: the score must return a scalar, got {describe_tree(got)} from the "
            f"score {name} on data.{which} ({rows} examples; higher is better){hint}")
  # The score is a scalar: what failed is the mean loss reported beside it.
  return (f"{fails}: the loss {_name(task.loss)}, whose mean is reported beside the score, raised "
          f"{_raised(err) if err is not None else 'nothing'}")


def _step_fails(spec: LoopSpec, params: PyTree, traced: dict, err: BaseException) -> str:
  task = spec.task
  if (task.trainable is not None and not callable(task.trainable)
      and jax.tree.structure(task.trainable) != jax.tree.structure(params)):
    return (f"task {task.name!r}: Task.trainable must be shaped like the model's parameters "
            f"{describe_tree(params)} (or be a predicate on their '/'-joined paths); it is "
            f"{describe_tree(task.trainable)}")
  try:
    trained, _ = trainable_lib.partition(params, task.trainable_mask(params))
  except ValueError as inner:  # the predicate's own words (not a bool, or nothing to train)
    return f"task {task.name!r}: {inner}"
  why = _optimizer_problem(spec, trained, traced) or _raised(err)
  static = ""
  if isinstance(err, _CONCRETIZATION_ERRORS):
    static = (". A factory that needs a concrete value (Python control flow) the automatic detection "
              "missed must declare it Task(static=(...))")
  return (f"task {task.name!r}: one DP step fails with static hyperparameters "
          f"{dict(spec.static_hparams)} and traced {list(spec.traced_names)}: {why}{static}")


def _optimizer_problem(spec: LoopSpec, trained: PyTree, traced: dict,
                       grads: Optional[PyTree] = None) -> Optional[str]:
  """What the optimizer does wrong on the trainable parameters, or None if it steps on `grads`
  (None: gradients shaped and typed like the parameters)."""
  task = spec.task
  grads = trained if grads is None else grads
  name = f"the optimizer from the factory {_name(task.optimizer)}"

  def init(t, p):
    return task.optimizer_for(spec.hparams(t)).init(p)

  def update(t, s, g, p):  # a gradient shaped like the parameters, as DP-SGD's noisy mean is
    return task.optimizer_for(spec.hparams(t)).update(g, s, p)

  try:
    state = jax.eval_shape(init, traced, trained)
  except Exception as inner:  # pylint: disable=broad-except
    return f"{name}: its init raised {_raised(inner)} on the parameters {describe_tree(trained)}"
  try:
    updates, new_state = jax.eval_shape(update, traced, state, grads, trained)
  except Exception as inner:  # pylint: disable=broad-except
    return (f"{name}: its update raised {_raised(inner)} on gradients shaped like the parameters "
            f"{describe_tree(trained)}")
  if describe_tree(updates) != describe_tree(trained):
    return (f"{name}: its update returned updates {describe_tree(updates)}; they must be shaped "
            f"like the parameters {describe_tree(trained)}")
  if describe_tree(new_state, dtypes=True) != describe_tree(state, dtypes=True):
    return (f"{name}: its update returned the state {describe_tree(new_state, dtypes=True)}, its "
            f"init {describe_tree(state, dtypes=True)}; the state is carried from step to step and "
            "must keep its structure, shapes and dtypes")
  return None


def check_initial_params(given: PyTree, expected: PyTree) -> PyTree:
  """`given` as a tree shaped like the model's parameters `expected`, None where it holds no leaf.

  `given` may hold every parameter (a checkpoint of this model) or only some
  (a pretrained backbone without the new head, or without LoRA adapters): a
  nested mapping whose paths are paths of the model's parameters. The leaves
  it holds are cast to the model's dtypes; the others stay None, to be
  initialised as usual (`jaxdp.train.trainable.combine(result, init)`).

  Raises:
    ValueError: a path that is not a parameter of the model, or a leaf whose
      shape differs from the model's (each named).
  """
  want = {path_str(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(expected)[0]}
  got = {path_str(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(given)[0]}
  unknown = sorted(set(got) - set(want))
  if unknown or not got:
    raise ValueError(f"initial_params must have the model's parameter structure, or part of it: "
                     f"the model has no {unknown or 'array'} (its parameters are {sorted(want)})")
  for path, leaf in got.items():
    if tuple(jnp.shape(leaf)) != tuple(want[path].shape):
      raise ValueError(f"initial_params leaf {path!r} has shape {tuple(jnp.shape(leaf))}, the model "
                       f"needs {tuple(want[path].shape)}")

  # Through the host, so arrays placed or sharded elsewhere (e.g. by the sweep
  # engine) do not make the jitted loop recompile for a new input sharding.
  def pick(path, e):
    leaf = got.get(path_str(path))
    return None if leaf is None else jnp.asarray(np.asarray(leaf), e.dtype)
  return jax.tree_util.tree_map_with_path(pick, expected)
