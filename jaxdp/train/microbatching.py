"""Automatic microbatch size for the vectorised per-example-gradient path.

A DP step computes per-example gradients of m examples at once (`jax.vmap`),
so it holds m copies of every intermediate of the backward pass and of the
gradient itself. Too large an m spills caches (CPU) or memory (accelerators);
too small an m pays per-operation overhead m times more often. The size is
chosen so one microbatch holds about `budget_bytes(device)`:

  bytes per example  the sizes of every value in the traced gradient of one
                     example's loss (its backward intermediates and the
                     gradient itself; nested jaxprs included), an upper
                     estimate of what XLA keeps, since it fuses elementwise
                     chains;
  budget             CPU: `CPU_BYTES_PER_CORE` times the cores behind one
                     device; accelerators: 1/16 of the device memory.

The CPU constant is calibrated on `benchmarks/dpsgd_throughput.py` (2-core
Xeon, Papernot-Steinke CNN at batch 256: 4 microbatches of 64 run 1.2x
faster than one vmap of 256, and faster than the non-private step). The size
never changes what is computed, only the order of a sum (rounding); set
`ExecutionConfig(microbatch_size=...)` to override it.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable

import jax

from jaxdp import _validate

PyTree = Any

#: CPU working set per core for one microbatch (see the module docstring).
CPU_BYTES_PER_CORE = 384 << 20
#: Fraction of an accelerator's memory one microbatch may use.
ACCELERATOR_MEMORY_FRACTION = 1 / 16
_FALLBACK_ACCELERATOR_BYTES = 16 << 30


def _jaxpr_bytes(jaxpr) -> int:
  total = 0
  for eqn in jaxpr.eqns:
    for var in eqn.outvars:
      aval = var.aval
      if hasattr(aval, "shape") and hasattr(aval, "dtype"):
        total += math.prod(aval.shape) * aval.dtype.itemsize
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        inner = getattr(sub, "jaxpr", sub)  # ClosedJaxpr -> Jaxpr
        if hasattr(inner, "eqns"):
          total += _jaxpr_bytes(inner)
  return total


def per_example_bytes(loss_fn: Callable[..., jax.Array], params: PyTree, example: PyTree,
                      *constants: PyTree, without: tuple = (), extra: int = 0) -> int:
  """Bytes of every value in the gradient of one example's loss (traced, not run).

  Args:
    loss_fn: per-example loss `(params, batch, *constants) -> (b,)`.
    params: parameters or their `jax.ShapeDtypeStruct` values (differentiated).
    example: a batch of ONE example (leading axis 1), arrays or
      `jax.ShapeDtypeStruct` values.
    *constants: further inputs of the loss that are not differentiated
      (frozen parameters), arrays or `jax.ShapeDtypeStruct` values.
    without: leaves of `params` (`jax.tree_util.keystr` paths) whose
      per-example gradients are never materialised (ghost clipping's layers,
      `jaxdp.train.ghost_analysis.ghost_layers(...).ghost_leaves`): they are not
      differentiated, so neither their gradients nor the buffers that build
      them (an embedding's vocabulary-sized scatter) are counted.
    extra: bytes to add for what replaces those gradients
      (`GhostSplit.norm_bytes`: cotangents, patches, Gram matrices).

  Returns:
    A positive int.
  """
  skipped = set(without)
  flat, treedef = jax.tree_util.tree_flatten_with_path(params)
  differentiated = [jax.tree_util.keystr(path) not in skipped for path, _ in flat]

  def merged(diff, fixed):
    diff, fixed = iter(diff), iter(fixed)
    return treedef.unflatten([next(diff) if d else next(fixed) for d in differentiated])

  def gradient(diff, fixed, b, *c):
    return jax.grad(lambda d: loss_fn(merged(d, fixed), b, *c)[0])(diff)

  leaves = [leaf for _, leaf in flat]
  closed = jax.make_jaxpr(gradient)([x for x, d in zip(leaves, differentiated) if d],
                                    [x for x, d in zip(leaves, differentiated) if not d], example, *constants)
  return max(1, _jaxpr_bytes(closed.jaxpr) + int(extra))


def budget_bytes(device: jax.Device | None = None) -> int:
  """Bytes one microbatch may hold on `device` (default: the first device)."""
  device = device or jax.devices()[0]
  if device.platform == "cpu":
    # With --xla_force_host_platform_device_count the cores are shared out.
    devices = len(jax.devices("cpu"))
    cores = max(1, (os.cpu_count() or 1) // max(1, devices))
    return CPU_BYTES_PER_CORE * cores
  stats = device.memory_stats() or {}
  return int(stats.get("bytes_limit", _FALLBACK_ACCELERATOR_BYTES) * ACCELERATOR_MEMORY_FRACTION)


def auto_microbatch_size(padded_batch_size: int, bytes_per_example: int, budget: int, *,
                         divide: bool = False) -> int:
  """The microbatch size m for a padded batch of P rows.

  Args:
    padded_batch_size: P >= 1.
    bytes_per_example: see `per_example_bytes`.
    budget: bytes one microbatch may hold (see `budget_bytes`).
    divide: if True, m must divide P exactly (P was fixed by the user): the
      largest divisor of P within budget. Otherwise P is split into the
      fewest equal microbatches within budget, and the caller rounds P up to
      a multiple of m (at most one row per microbatch is added).

  Returns:
    m in [1, P].
  """
  p = _validate.integer("padded_batch_size", padded_batch_size, low=1)
  per = _validate.integer("bytes_per_example", bytes_per_example, low=1)
  most = max(1, min(p, _validate.integer("budget", budget, low=1) // per))
  if divide:
    return max(d for d in range(1, most + 1) if p % d == 0)
  chunks = math.ceil(p / most)
  return math.ceil(p / chunks)


def microbatch_size_for(loss_fn: Callable[[PyTree, PyTree], jax.Array], params: PyTree,
                        batch: PyTree, device: jax.Device | None = None, *, without: tuple = (),
                        extra: int = 0) -> int:
  """The automatic microbatch for a fixed batch of b rows: a divisor of b.

  What the trainer picks for `ExecutionConfig(padded_batch_size=b)`, for
  code that steps a fixed batch itself (the benchmarks); `without` and
  `extra` as for `per_example_bytes`.
  """
  b = jax.tree.leaves(batch)[0].shape[0]
  example = jax.tree.map(lambda leaf: leaf[:1], batch)
  return auto_microbatch_size(b, per_example_bytes(loss_fn, params, example, without=without, extra=extra),
                              budget_bytes(device), divide=True)
