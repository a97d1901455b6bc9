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

Under Poisson sampling a step computes only the microbatches holding sampled
rows, ceil(B / m) of them for a realised batch of B ~ Binomial(N, q) rows, so
the last one is padded by up to m - 1 rows. `poisson_microbatch_size` picks m
within the budget that minimises the expected work
E[ceil(B / m)] * (m * bytes_per_example + MICROBATCH_OVERHEAD_BYTES), from
the declared N and q only (public numbers: the size is a shape of the
compiled program, and the sample, hence the accounting, does not depend on it).
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any, Callable

import jax
import numpy as np
from scipy import stats

from jaxdp import _validate

PyTree = Any

#: CPU working set per core for one microbatch (see the module docstring).
CPU_BYTES_PER_CORE = 384 << 20
#: Fraction of an accelerator's memory one microbatch may use.
ACCELERATOR_MEMORY_FRACTION = 1 / 16
_FALLBACK_ACCELERATOR_BYTES = 16 << 30
#: CPU: what one more microbatch costs beyond its rows, in bytes of working set
#: (loop step, slicing, the gradient accumulation), for `poisson_microbatch_size`.
#: `python -m benchmarks.microbatch_overhead` measured 0.7 rows (7.7 MB) for the CNN's
#: smallest microbatches and none for the transformer; 4x that as a margin, since
#: microbatches below 4 rows were not measured (docs/benchmarks.md, issue 44 item 4).
MICROBATCH_OVERHEAD_BYTES = 32 << 20
#: Microbatch sizes compared at most (all of them up to this many, else a geometric grid).
_MAX_CANDIDATE_SIZES = 2048
#: Tail of Binomial(N, q) ignored when computing E[ceil(B / m)] (it moves the expectation by less).
_TAIL = 1e-12


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


@functools.lru_cache(maxsize=64)
def _survival(num_examples: int, sampling_prob: float) -> tuple:
  """(low, P(B > x) for x = low, ..., top) for B ~ Binomial(N, q): below low it is 1 and above
  top 0, to within `_TAIL` (so the array spans some standard deviations, not N)."""
  law = stats.binom(num_examples, sampling_prob)
  low = int(max(0, law.ppf(_TAIL) - 1))
  top = int(min(num_examples, law.isf(_TAIL)))
  survival = law.sf(np.arange(low, top + 1))
  survival.setflags(write=False)
  return low, survival


def _expected(low: int, survival: np.ndarray, m: int) -> float:
  """The sum over k >= 0 of P(B > k m): the k m below `low` count 1 each."""
  first = -(-low // m)
  return float(first + np.sum(survival[first * m - low::m]))


def expected_microbatches(num_examples: int, sampling_prob: float, microbatch_size: int) -> float:
  """E[ceil(B / m)] for B ~ Binomial(N, q): the microbatches a Poisson step computes on average
  (`jaxdp.train.sampling.poisson_batch_sum`), as the sum over k >= 0 of P(B > k m).

  Raises:
    ValueError: N or m is not a positive integer, or q is not in (0, 1].
  """
  n = _validate.integer("num_examples", num_examples, low=1)
  q = _validate.probability("sampling_prob", sampling_prob, one_ok=True)
  m = _validate.integer("microbatch_size", microbatch_size, low=1)
  return _expected(*_survival(n, float(q)), m)


def _candidate_sizes(most: int) -> np.ndarray:
  if most <= _MAX_CANDIDATE_SIZES:
    return np.arange(1, most + 1)
  return np.unique(np.geomspace(1, most, _MAX_CANDIDATE_SIZES).round().astype(int))


def poisson_microbatch_size(num_examples: int, sampling_prob: float, bytes_per_example: int,
                            budget: int, overhead_bytes: int = MICROBATCH_OVERHEAD_BYTES) -> int:
  """The microbatch size m for a Poisson batch: least expected work within the budget.

  Minimises E[ceil(B / m)] * (m * bytes_per_example + overhead_bytes) over
  m * bytes_per_example <= budget (m = 1 if nothing fits), for B ~
  Binomial(N, q): padding rows cost like sampled ones, and each microbatch
  costs `overhead_bytes` more. Ties go to the larger m. Above
  `_MAX_CANDIDATE_SIZES` possible sizes a geometric grid of them is compared.

  Args:
    num_examples: N >= 1, the declared (public) training set size.
    sampling_prob: q in (0, 1].
    bytes_per_example: see `per_example_bytes`.
    budget: bytes one microbatch may hold (see `budget_bytes`).
    overhead_bytes: a microbatch's cost beyond its rows, >= 0.

  Returns:
    m >= 1, a pure function of the arguments (all public).

  Raises:
    ValueError: an argument out of its range.
  """
  n = _validate.integer("num_examples", num_examples, low=1)
  q = float(_validate.probability("sampling_prob", sampling_prob, one_ok=True))
  per = _validate.integer("bytes_per_example", bytes_per_example, low=1)
  budget = _validate.integer("budget", budget, low=1)
  overhead = _validate.integer("overhead_bytes", overhead_bytes, low=0)
  return _poisson_microbatch_size(n, q, per, budget, overhead)


@functools.lru_cache(maxsize=64)
def _poisson_microbatch_size(n: int, q: float, per: int, budget: int, overhead: int) -> int:
  low, survival = _survival(n, q)
  # Beyond the largest B that has weight, a larger m only adds padding rows.
  most = max(1, min(budget // per, low + len(survival)))
  sizes = _candidate_sizes(most)[::-1]  # descending: argmin keeps the larger of equal costs
  work = [_expected(low, survival, int(m)) * (float(m) * per + overhead) for m in sizes]
  return int(sizes[int(np.argmin(work))])


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
