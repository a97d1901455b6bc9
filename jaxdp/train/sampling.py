"""Honest Poisson subsampling with static shapes.

Every step each of the N examples is included independently with probability
q (what `PoissonSampledDpEvent` assumes).  The realised batch size is
Binomial(N, q) and therefore unbounded by any fixed padding, so the selected
indices are processed in fixed-size microbatches: first the `padded_batch_size`
rows that almost always suffice, then, inside a `lax.while_loop`, as many
further microbatches as the realised count needs.  No sampled example is ever
dropped and padding rows are masked out, so what runs is exactly the sampled
mechanism, with shapes that `jit` can compile once.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp

from jaxdp import _validate

PyTree = Any


def poisson_mask(key: jax.Array, num_examples: int, sampling_prob) -> jax.Array:
  """Independent Bernoulli(q) inclusion of each example, shape (num_examples,)."""
  return jax.random.uniform(key, (num_examples,)) < sampling_prob


def sampled_indices(mask: jax.Array, length: int) -> tuple[jax.Array, jax.Array]:
  """Indices of the True entries first (ascending), then zeros, and their count.

  Args:
    mask: (N,) boolean inclusion mask.
    length: static output length, >= N.

  Returns:
    (indices of shape (length,) int32, count int32).
  """
  (idx,) = jnp.nonzero(mask, size=length, fill_value=0)
  return idx.astype(jnp.int32), jnp.sum(mask, dtype=jnp.int32)


def default_padded_batch_size(num_examples: int, sampling_prob: float,
                              microbatch_size: int | None = None) -> int:
  """qN plus 4 standard deviations of Binomial(N, q), rounded up.

  Larger realised batches are still fully processed (by extra microbatches);
  this only sizes the fast common path.

  Args:
    num_examples: N >= 1.
    sampling_prob: q in (0, 1].
    microbatch_size: if given, the result is rounded up to a multiple of it.

  Returns:
    The padded batch size, at least 1 and at most N (or one microbatch).
  """
  n = _validate.integer("num_examples", num_examples, low=1)
  q = _validate.probability("sampling_prob", sampling_prob, one_ok=True)
  size = min(n, max(1, math.ceil(q * n + 4.0 * math.sqrt(q * n * (1.0 - q)))))
  if microbatch_size is not None:
    m = _validate.integer("microbatch_size", microbatch_size, low=1)
    size = m * math.ceil(size / m)
  return size


def validate_batch_sizes(padded_batch_size: int, microbatch_size: int) -> None:
  """Raises ValueError unless both are >= 1 and microbatch divides padding."""
  p = _validate.integer("padded_batch_size", padded_batch_size, low=1)
  m = _validate.integer("microbatch_size", microbatch_size, low=1)
  if p % m:
    raise ValueError(f"padded_batch_size must be a multiple of microbatch_size={m}, got {p}")


def poisson_batch_sum(key: jax.Array, fn: Callable[[jax.Array, jax.Array], PyTree], *,
                      num_examples: int, sampling_prob, padded_batch_size: int,
                      microbatch_size: int) -> tuple[PyTree, jax.Array]:
  """Sums `fn(indices, valid)` over all microbatches of one Poisson sample.

  Args:
    key: PRNG key for this step's sample.
    fn: maps (indices (m,) int32, valid (m,) bool) to a tree of arrays; it
      must give rows with valid False zero weight.  The outputs are summed.
    num_examples: N, static.
    sampling_prob: q (a float or a traced scalar).
    padded_batch_size: P, static, multiple of `microbatch_size`.
    microbatch_size: m, static.

  Returns:
    (sum of fn over microbatches, realised batch size as int32).
  """
  validate_batch_sizes(padded_batch_size, microbatch_size)
  m = microbatch_size
  # Room for every example plus one microbatch so dynamic_slice never clamps.
  length = (math.ceil(num_examples / m) + 1) * m
  length = max(length, padded_batch_size)
  idx, count = sampled_indices(poisson_mask(key, num_examples, sampling_prob), length)
  positions = jnp.arange(m, dtype=jnp.int32)

  def chunk(k):
    start = k * m
    return fn(jax.lax.dynamic_slice_in_dim(idx, start, m), start + positions < count)

  n_fixed = padded_batch_size // m
  if n_fixed == 1:
    total = chunk(jnp.int32(0))
  else:
    def scan_body(acc, k):
      return jax.tree.map(jnp.add, acc, chunk(k)), None
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                         jax.eval_shape(chunk, jnp.int32(0)))
    total, _ = jax.lax.scan(scan_body, zeros, jnp.arange(n_fixed, dtype=jnp.int32))

  # Overflow beyond the padding: rare, but processed in full, never dropped.
  def cond(carry):
    k, _ = carry
    return k * m < count

  def body(carry):
    k, acc = carry
    return k + 1, jax.tree.map(jnp.add, acc, chunk(k))

  _, total = jax.lax.while_loop(cond, body, (jnp.int32(n_fixed), total))
  return total, count
