"""Trainable and frozen parameters: which leaves DP-SGD differentiates, clips, noises and updates.

A `Task(trainable=...)` names the parameters that train; the others are
frozen. The training loop splits the parameter tree into two trees of the
same structure, the trainable one holding None where a leaf is frozen and
the frozen one None where a leaf trains (`partition`), differentiates the
loss with respect to the trainable tree only (`combine` puts the frozen
leaves back inside the loss, as constants), and hands the optimizer the
trainable tree. So a frozen leaf gets no per-example gradient (none is
computed), counts toward no example's clipping norm, gets no noise and no
update, and leaves the run bit for bit as it entered.

Privacy is unchanged: each example's contribution to the clipped sum of the
trainable leaves still has norm at most C, and the same Gaussian noise is
added to every coordinate that is released; the frozen leaves are public
inputs (a random initialisation drawn from the key, or public pretrained
weights), so the DpEvent is that of the full model's run.

`trainable` is one of:
  * None: every leaf trains;
  * a predicate `path -> bool` on '/'-joined paths such as
    "params/Dense_0/kernel" (`jaxdp.models.lora.adapters` is one);
  * a pytree of bools with the parameters' structure.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax

PyTree = Any


def path_str(path) -> str:
  """A `jax.tree_util` key path as '/'-joined names: ('params', 'Dense_0', 'kernel') -> 'params/Dense_0/kernel'."""
  parts = []
  for entry in path:
    for attr in ("key", "name", "idx"):
      if hasattr(entry, attr):
        parts.append(str(getattr(entry, attr)))
        break
    else:
      parts.append(str(entry))
  return "/".join(parts)


def check_spec(trainable: Any) -> Any:
  """Validates a `Task(trainable=...)` value that needs no parameters to check."""
  if trainable is None or callable(trainable):
    return trainable
  leaves = jax.tree.leaves(trainable)
  if not leaves or not all(isinstance(x, bool) for x in leaves):
    raise ValueError("trainable must be None, a predicate path -> bool (e.g. "
                     "lambda path: path.startswith('params/head/')) or a pytree of bools with the "
                     f"parameters' structure, got {trainable!r}")
  return trainable


def mask(trainable: Any, params: PyTree) -> PyTree:
  """A pytree of Python bools shaped like `params`: True for the leaves that train.

  Raises:
    ValueError: a pytree of bools whose structure differs from the
      parameters', a predicate that does not return a bool, or no leaf left
      to train (each names what it found).
  """
  if trainable is None:
    return jax.tree.map(lambda _: True, params)
  if callable(trainable):
    def decide(path, _):
      value = trainable(path_str(path))
      if not isinstance(value, bool):
        raise ValueError(f"the trainable predicate must return a bool, got {value!r} for "
                         f"{path_str(path)!r}")
      return value
    out = jax.tree_util.tree_map_with_path(decide, params)
  else:
    if jax.tree.structure(params) != jax.tree.structure(trainable):
      def leaves(tree):
        return [path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
      raise ValueError(f"trainable must have the parameters' structure (leaves {leaves(params)}) "
                       f"or be a predicate on their '/'-joined paths; it has leaves "
                       f"{leaves(trainable)}")
    out = trainable
  if not any(jax.tree.leaves(out)):
    paths = [path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    raise ValueError(f"trainable leaves no parameter to train; the parameters are {paths}")
  return out


def partition(params: PyTree, leaf_mask: PyTree) -> tuple[PyTree, PyTree]:
  """(trainable, frozen): two trees shaped like `params`, None where the other holds the leaf."""
  trainable = jax.tree.map(lambda p, m: p if m else None, params, leaf_mask)
  frozen = jax.tree.map(lambda p, m: None if m else p, params, leaf_mask)
  return trainable, frozen


def combine(trainable: PyTree, frozen: PyTree) -> PyTree:
  """The full tree again: each leaf from whichever of the two holds it."""
  return jax.tree.map(lambda t, f: f if t is None else t, trainable, frozen,
                      is_leaf=lambda x: x is None)


def partial_loss(loss_fn: Callable[[PyTree, PyTree], jax.Array],
                 frozen: PyTree) -> Callable[[PyTree, PyTree], jax.Array]:
  """`loss_fn` as a function of the trainable tree: the frozen leaves enter as constants."""
  def loss(trainable, batch):
    return loss_fn(combine(trainable, frozen), batch)
  return loss


class Counts(NamedTuple):
  """How many parameters train and how many are frozen: scalars and leaves (what a dry run
  prints per compiled group)."""
  trainable_scalars: int
  trainable_leaves: int
  frozen_scalars: int
  frozen_leaves: int


def counts(params: PyTree, leaf_mask: PyTree) -> Counts:
  """The `Counts` of `params` (arrays or `jax.ShapeDtypeStruct`s) under `leaf_mask` (`mask`)."""
  sizes = [math.prod(leaf.shape) for leaf in jax.tree.leaves(params)]
  trains = jax.tree.leaves(leaf_mask)
  return Counts(trainable_scalars=sum(s for s, t in zip(sizes, trains) if t),
                trainable_leaves=sum(1 for t in trains if t),
                frozen_scalars=sum(s for s, t in zip(sizes, trains) if not t),
                frozen_leaves=sum(1 for t in trains if not t))


class Coverage(NamedTuple):
  """What a public start (`initial_params`) holds of a model's parameters.

  Attributes:
    given: leaves it holds.
    total: the model's leaves.
    whole, some, none: the model's top-level modules it holds all, some or none of the
      leaves of (their names, in tree order).
    frozen_from_key: frozen leaves it does not hold: they stay at their random
      initialisation for the whole run.
  """
  given: int
  total: int
  whole: tuple
  some: tuple
  none: tuple
  frozen_from_key: int


def coverage(initial: PyTree, params: PyTree, leaf_mask: PyTree) -> Coverage:
  """The `Coverage` of `initial` (shaped like `params`, None where it holds no leaf, as
  `jaxdp.train.checks.check_initial_params` returns it; None: no public start)."""
  paths = [path_str(p).split("/") for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  held = ([False] * len(paths) if initial is None else
          [leaf is not None for leaf in jax.tree.leaves(initial, is_leaf=lambda x: x is None)])
  # A Flax tree has one collection on top ('params'): its modules are one level down.
  depth = 1 if len({p[0] for p in paths}) == 1 and all(len(p) > 2 for p in paths) else 0
  modules: dict = {}
  for path, has in zip(paths, held):
    modules.setdefault(path[depth], []).append(has)
  kinds = {name: "whole" if all(h) else "some" if any(h) else "none" for name, h in modules.items()}
  return Coverage(given=sum(held), total=len(held),
                  whole=tuple(n for n, k in kinds.items() if k == "whole"),
                  some=tuple(n for n, k in kinds.items() if k == "some"),
                  none=tuple(n for n, k in kinds.items() if k == "none"),
                  frozen_from_key=sum(1 for h, t in zip(held, jax.tree.leaves(leaf_mask))
                                      if not h and not t))
