"""Checks of a candidate against its data, before anything compiles or trains.

Each raises a `ValueError` that names the culprit: the data lacks the split
the score reads, the model cannot take the inputs, the loss is not one value
per example, a score is not a scalar, an optimizer factory needs a concrete
value, warm-start parameters do not fit the model, or a key is not a PRNG
key. Nothing here computes on the private values: only shapes are traced.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp._cache import LruCache
from jaxdp.data import Dataset
from jaxdp.train.plan import DpSgdPlan
from jaxdp.train.program import (LoopSpec, abstract, build_evaluate, build_private_score,
                                 build_train_loop, device_dtype)
from jaxdp.train.task import Task, check_scalar
from jaxdp.train.trainable import path_str

PyTree = Any


def check_data(task: Task, data: Dataset) -> None:
  """Raises ValueError unless `data` has the split the task's score reads."""
  if not isinstance(data, Dataset):
    raise ValueError(f"data must be a jaxdp.data.Dataset (private train, public test, private "
                     f"validation), got {type(data).__name__}")
  if task.private_score and data.private_validation is None:
    raise ValueError(f"task {task.name!r} has a DP score, which reads data.private_validation, but "
                     "it is None; give Dataset(private_validation=...)")
  if not task.private_score and data.test is None:
    raise ValueError(f"task {task.name!r} scores on the public test split, but data.test is None. "
                     "jaxdp never scores on the private training data: give public data as "
                     "Dataset(test=...), or score privately with jaxdp.train.NoisyMean / DpScore "
                     "on Dataset(private_validation=...)")


_CHECKED = LruCache(256)


def check_task(spec: LoopSpec, data: Dataset) -> None:
  """Shape-checks the task on `data` (no compilation, no training).

  A spec that passed on splits of the same shapes is not traced again.

  Raises:
    ValueError: the model cannot take the inputs, the loss does not fit the
      model's outputs or is not one value per example, a score is not a
      scalar, or the optimizer fails on the parameters; each names the culprit.
  """
  task = spec.task
  check_data(task, data)
  split = data.private_validation if task.private_score else data.test
  memo = (spec, jax.tree.structure(split),
          tuple((np.shape(x), str(device_dtype(x))) for x in jax.tree.leaves(split)))
  if _CHECKED.get(memo) is None:
    _check_task(spec, data)
    _CHECKED.put(memo, True)


def _check_task(spec: LoopSpec, data: Dataset) -> None:
  task = spec.task
  two = abstract(data.train, rows=2)
  try:
    inputs = jax.eval_shape(task.model_inputs, two)
  except Exception as err:  # pylint: disable=broad-except
    raise ValueError(f"task {task.name!r}: inputs cannot select the model input from a batch "
                     f"{jax.tree.map(lambda s: s.shape, two)}: {type(err).__name__}: {err}") from err
  model = spec.model()
  try:
    params = jax.eval_shape(model.init, jax.random.key(0), inputs)
    outputs = jax.eval_shape(model.apply, params, inputs)
  except Exception as err:  # pylint: disable=broad-except
    raise ValueError(f"task {task.name!r}: the model (static hyperparameters "
                     f"{dict(spec.static_hparams)}) cannot take inputs of shape "
                     f"{jax.tree.map(lambda s: s.shape, inputs)}: {type(err).__name__}: {err}") from err
  try:
    losses = jax.eval_shape(task.per_example_loss(model), params, two)
  except Exception as err:  # pylint: disable=broad-except
    raise ValueError(f"task {task.name!r}: the loss does not fit the model's outputs "
                     f"{jax.tree.map(lambda s: s.shape, outputs)}: {type(err).__name__}: {err}") from err
  if getattr(losses, "shape", None) != (2,):
    raise ValueError(f"task {task.name!r}: the loss must return one value per example, shape (b,); "
                     f"for a batch of 2 it returned {jax.tree.map(lambda s: s.shape, losses)}")
  split = data.private_validation if task.private_score else data.test
  which = "private_validation" if task.private_score else "test"
  batch = abstract(split)
  try:
    if task.private_score:
      got = jax.eval_shape(build_private_score(spec), params, batch, jax.random.key(0))
    else:
      got = jax.eval_shape(build_evaluate(spec), params, batch)[0]
  except Exception as err:  # pylint: disable=broad-except
    raise ValueError(f"task {task.name!r}: the score fails on data.{which}: "
                     f"{type(err).__name__}: {err}") from err
  check_scalar(f"task {task.name!r}: the score", got)
  scalar = jax.ShapeDtypeStruct((), jnp.float32)
  traced = {k: scalar for k in spec.traced_names}

  def one_run(p, clip, sigma, t, train):
    plan = DpSgdPlan(l2_clip_norm=clip, noise_multiplier=sigma, sampling_prob=spec.sampling_prob,
                     num_steps=spec.num_steps, num_examples=spec.num_examples)
    return build_train_loop(spec)(p, plan, t, jax.random.key(0), train)

  train = abstract(data.train)
  try:
    jax.eval_shape(one_run, params, scalar, scalar, traced, train)
  except Exception as err:  # pylint: disable=broad-except
    raise ValueError(f"task {task.name!r}: one DP step fails with static hyperparameters "
                     f"{dict(spec.static_hparams)} and traced {list(spec.traced_names)}: "
                     f"{type(err).__name__}: {err}. A factory that needs a concrete value "
                     f"(Python control flow) the automatic detection missed must declare it "
                     f"Task(static=(...))") from err


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


def check_key(key: Any) -> jax.Array:
  if not isinstance(key, jax.Array) or not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    raise ValueError(f"key must be a typed PRNG key from jax.random.key(seed), got {key!r}")
  return key
