"""Private splits padded to public row capacities: the only way private rows enter a program.

A compiled program is specialised to its arguments' shapes, and the
persistent compilation cache (`jaxdp.train.compilation_cache`) keeps it,
file name and all, outside any run directory. So the number of private rows
(under add/remove-one neighbours, what tells two data sets apart) must not
be a shape. Every private split therefore reaches the programs of
`jaxdp.train.program` as a `PaddedRows`: its rows first, then padding rows,
up to a capacity computed from public numbers only
(`jaxdp.data.row_capacity_for`), with a boolean mask of the real rows.

  * train: `Dataset.row_capacity` (from the declared N; a tuner's subset
    keeps its parent's). Padding rows are never sampled: the Poisson draw is
    masked (`jaxdp.train.sampling.poisson_batch_sum`), so each real row is
    still included independently with probability q.
  * private_validation, for a `NoisyMean` score: the capacity of its declared
    validation size `NoisyMean.num_examples`, the size its sensitivity and
    divisor already use; the padding rows' shares are selected away with
    `where`. A `DpScore` is the user's function of the rows it is given,
    with no mask to honour: its validation split is passed as it is, and
    its programs are never written to the persistent cache (`persistable`).
  * test: public, passed as it is.

Padding rows hold zeros, but nothing reads their values: every use is a
`where` on the mask (never a multiplication by 0), so NaN padding would give
the same bits (`tests/train/test_compilation_cache.py`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import numpy as np

from jaxdp.data import Dataset, row_capacity_for
from jaxdp.train.loop_spec import abstract, device_dtype
from jaxdp.train.task import NoisyMean, Task

PyTree = Any


class PaddedRows(NamedTuple):
  """A split padded to a public capacity: every leaf of `rows` has that many rows, the real ones
  first; `mask` (capacity,) bool is True on the real rows."""
  rows: PyTree
  mask: Any


def rows_of(split: PyTree) -> PyTree:
  """The rows of a split, padded or not (a `PaddedRows`'s padding rows included)."""
  return split.rows if isinstance(split, PaddedRows) else split


def mask_of(split: PyTree) -> Optional[Any]:
  """The real-row mask of a `PaddedRows`; None for a split passed as it is (every row real)."""
  return split.mask if isinstance(split, PaddedRows) else None


def pad(split: PyTree, capacity: int, fill: float = 0, int_fill: int = 0) -> PaddedRows:
  """`split` (host arrays) padded to `capacity` rows, in the dtypes the device will use, float
  padding rows holding `fill` and the others `int_fill` (tests fill NaN and garbage: nothing
  may read them). Host-side NumPy: nothing is compiled for the private row count.

  Raises:
    ValueError: the split holds more than `capacity` rows (the message names neither count).
  """
  leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(split)]
  rows = leaves[0].shape[0]
  if rows > capacity:
    raise ValueError(f"a split holds more rows than its public row capacity {capacity}")

  def padded(leaf):
    leaf = np.asarray(leaf)
    dtype = device_dtype(leaf)
    out = np.full((capacity,) + leaf.shape[1:], fill if np.issubdtype(dtype, np.inexact)
                  else int_fill, dtype)
    out[:rows] = leaf
    return out
  mask = np.zeros(capacity, bool)
  mask[:rows] = True
  return PaddedRows(jax.tree.map(padded, split), mask)


def validation_capacity(task: Task) -> Optional[int]:
  """The public capacity the task's private validation split is padded to; None when it is
  passed as it is (no DP score, or a `DpScore`)."""
  if isinstance(task.score, NoisyMean):
    return row_capacity_for(task.score.num_examples)
  return None


def persistable(task: Task) -> bool:
  """True when every private split of the task's programs is padded: only then may a program
  be written to the persistent compilation cache (a `DpScore`'s validation split is not)."""
  return not task.private_score or validation_capacity(task) is not None


def check_validation(task: Task, data: Dataset) -> None:
  """Raises ValueError unless the private validation split fits the capacity of its declared
  size (a `NoisyMean` score's `num_examples`); the message names no private count."""
  capacity = validation_capacity(task)
  if capacity is None or data.private_validation is None:
    return
  if jax.tree.leaves(data.private_validation)[0].shape[0] > capacity:
    raise ValueError(f"task {task.name!r}: private_validation holds more rows than the row capacity "
                     f"{capacity} of its declared size NoisyMean.num_examples="
                     f"{task.score.num_examples}: declare the validation size you may publish, "
                     "a public bound, never a count read from the data")


def host_splits(data: Dataset, task: Task, fill: float = 0, int_fill: int = 0) -> tuple:
  """(train, test, private validation) as a program takes them: train a `PaddedRows` of
  `data.row_capacity` rows, validation one too when `validation_capacity(task)` says so
  (None stays None; None too when the task has no DP score), test as it is. `fill`, `int_fill`: as in `pad` (tests only)."""
  # A split the task does not read is not passed: its shape stays out of the program too.
  validation = data.private_validation if task.private_score else None
  capacity = validation_capacity(task)
  if validation is not None and capacity is not None:
    validation = pad(validation, capacity, fill, int_fill)
  return pad(data.train, data.row_capacity, fill, int_fill), data.test, validation




def abstract_splits(data: Dataset, task: Task) -> tuple:
  """`host_splits`'s shapes and dtypes (`jax.ShapeDtypeStruct` leaves), without copying rows."""
  def padded(split, capacity):
    return PaddedRows(abstract(split, rows=capacity), jax.ShapeDtypeStruct((capacity,), np.bool_))
  validation = data.private_validation if task.private_score else None
  capacity = validation_capacity(task)
  if validation is not None:
    validation = abstract(validation) if capacity is None else padded(validation, capacity)
  return (padded(data.train, data.row_capacity), None if data.test is None else abstract(data.test),
          validation)
