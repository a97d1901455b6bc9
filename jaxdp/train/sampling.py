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
import numbers
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from jaxdp import _validate

PyTree = Any


_TWO_32 = 2**32


def sampling_threshold(sampling_prob) -> int:
  """floor(q * 2**32): an example is included when its uint32 draw is below it.

  Args:
    sampling_prob: q in [0, 1], a concrete (host) number.

  Returns:
    An int in [0, 2**32]; 2**32 only for q = 1 (everyone).

  Raises:
    ValueError: q is not a real number in [0, 1].

  Guarantees:
    The realised inclusion probability threshold / 2**32 lies in
    (q - 2**-32, q]: never above the q that is accounted for.  q is widened
    to float64 first, and q * 2**32 is exact in float64 (a power-of-two
    scaling), so the floor is exact integer rounding down.  For 0 < q < 2**-32
    the threshold is 0 and no example is ever sampled; that is still the
    private side, since the accountant assumed the larger q.
  """
  q = _validate.probability("sampling_prob", sampling_prob, zero_ok=True, one_ok=True)
  return math.floor(q * _TWO_32)


def _array_threshold_mask(bits: jax.Array, sampling_prob) -> jax.Array:
  q = jnp.asarray(sampling_prob)
  if not jnp.issubdtype(q.dtype, jnp.floating):
    q = q.astype(jnp.float32)
  # An array q reached us already rounded to its dtype (float32 without x64),
  # possibly *up* from the float64 the accountant used, by at most half an ulp.
  # One ulp towards zero is therefore never above the accounted q.
  q_low = jnp.nextafter(q, jnp.zeros_like(q))
  # Widening to float32 is exact and keeps 2**32 in range (float16 ends at 65504).
  q_low = q_low.astype(jnp.promote_types(q_low.dtype, jnp.float32))
  # q_low < 1, so q_low * 2**32 < 2**32 is an exact power-of-two scaling and its
  # floor fits uint32.  NaN and q <= 0 compare False: nobody is sampled.
  threshold = jnp.where(q_low > 0, jnp.floor(q_low * float(_TWO_32)), 0).astype(jnp.uint32)
  if q.dtype != jnp.float64:
    # A narrower q of 1 may be a q < 1 rounded up (float32 from 1 - 3e-8,
    # bfloat16 from 0.9993): it samples at the next value below 1, not everyone.
    return bits < threshold
  return jnp.where(q >= 1, True, bits < threshold)


def poisson_mask(key: jax.Array, num_examples: int, sampling_prob) -> jax.Array:
  """Independent Bernoulli inclusion of each example, shape (num_examples,).

  Each example draws 32 uniform bits and is included when they are below
  `sampling_threshold(q)`, an exact integer comparison.  (A float32 uniform
  compared with q would round the probability *up* to the 2**-23 grid: q = 1e-9
  would realise ~1.2e-7, more sampling than accounted.)

  Args:
    key: PRNG key.
    num_examples: N, static.
    sampling_prob: q: a Python number or NumPy float64 in [0, 1], or a scalar
      array (traced, e.g. vmapped over candidates, or concrete).

  Returns:
    A boolean mask of shape (N,).

  Raises:
    ValueError: a concrete q outside [0, 1].

  Guarantees:
    The realised inclusion probability never exceeds q.  A Python number
    realises floor(q * 2**32) / 2**32 exactly (see `sampling_threshold`).  An
    array q realises floor(q' * 2**32) / 2**32 with q' the next value below q
    in q's dtype, because the float64 q that was accounted may have been
    rounded up when it was cast; the shortfall is at most one ulp of q plus
    2**-32.  q = 1 includes everyone as a Python number or a float64 array;
    a narrower array q of 1 (which may be a smaller q rounded up) realises the
    next value of its dtype below 1.  q = 0 samples nobody on both paths, and
    so does an array q that is NaN or negative.
  """
  bits = jax.random.bits(key, (num_examples,), jnp.uint32)
  # Python numbers and NumPy float64 (a subclass of float) carry the accounted
  # value itself; anything else may have been rounded on its way here.
  if isinstance(sampling_prob, bool) or not isinstance(sampling_prob, (float, numbers.Integral)):
    return _array_threshold_mask(bits, sampling_prob)
  threshold = sampling_threshold(sampling_prob)
  if threshold == _TWO_32:
    return jnp.ones((num_examples,), dtype=bool)
  return bits < jnp.uint32(threshold)


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
  this only sizes the microbatches (a step computes those holding sampled rows).

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
                      microbatch_size: int, axis_name: Optional[str] = None,
                      real_rows: Optional[jax.Array] = None) -> tuple[PyTree, jax.Array]:
  """Sums `fn(indices, valid)` over all microbatches of one Poisson sample.

  The sampled indices (ascending, then padding) are cut into microbatches
  k = 0, 1, ... of m rows, and only the microbatches holding a sampled row
  are computed: ceil(B / m) of them for a realised batch of B rows, so a
  padded batch P above B costs at most m - 1 rows of padding, not P - B. With
  `axis_name` (inside `jax.shard_map`, data parallelism over that mesh axis of
  D devices) device d sums microbatches k = d, d + D, d + 2D, ..., so the
  devices' shares are disjoint and together cover every sampled row. The
  shares are then added with one `psum`, before anything else happens to the
  sum (in DP-SGD: before the noise).

  Args:
    key: PRNG key for this step's sample. With `axis_name` it must be the same
      key on every device of the axis: each device draws the same mask.
    fn: maps (indices (m,) int32, valid (m,) bool) to a tree of arrays; it
      must give rows with valid False zero weight.  The outputs are summed.
    num_examples: N, static.
    sampling_prob: q (a float or a traced scalar).
    padded_batch_size: P, static, multiple of `microbatch_size`: sizes the
      index buffer (its microbatches are what every device can take).
    microbatch_size: m, static.
    axis_name: None (default): one device sums every microbatch. Otherwise
      the name of a `shard_map` mesh axis over which the microbatches are
      shared out, as above.
    real_rows: None (every one of the N rows is an example), or an (N,)
      bool mask of the rows that are (`jaxdp.train.padding`): the others
      are padding and are never sampled.

  Returns:
    (sum of fn over microbatches, realised batch size as int32). With
    `axis_name`, both are the same on every device of the axis.

  Raises:
    ValueError: P or m is not a positive integer, or m does not divide P.

  Guarantees:
    Every sampled example is in exactly one microbatch, and every microbatch
    holding a sampled example is summed exactly once (on exactly one device):
    nothing is dropped or counted twice, however far the sample overflows the
    padding. A microbatch of padding only is skipped: `fn` gives its rows
    zero weight, so it would add exact zeros. The sample is
    `poisson_mask(key, N, q)` (and `real_rows`), whatever the number of devices. Data
    parallelism changes only the order in which float sums are added (per
    device, then across devices), never which terms are added. How many
    microbatches run depends on B, so a step's duration does too: like the
    job's duration, it is not covered by epsilon (docs/guides/privacy.md,
    "Timing is not covered").
  """
  validate_batch_sizes(padded_batch_size, microbatch_size)
  m = microbatch_size
  # D devices share the microbatches; device d takes k = j * D + d for j = 0, 1, ...
  shards = 1 if axis_name is None else jax.lax.axis_size(axis_name)
  shard = 0 if axis_name is None else jax.lax.axis_index(axis_name)
  per_shard = math.ceil(padded_batch_size // m / shards)  # common-path microbatches per device
  # Room for every example plus one microbatch so dynamic_slice never clamps,
  # and for the last common-path microbatch of the last device.
  length = max((math.ceil(num_examples / m) + 1) * m, per_shard * shards * m)
  included = poisson_mask(key, num_examples, sampling_prob)
  if real_rows is not None:
    # Each real row keeps its own independent draw; a padding row is never included.
    included = included & real_rows
  idx, count = sampled_indices(included, length)
  positions = jnp.arange(m, dtype=jnp.int32)

  def start_of(j):
    return (j * shards + shard) * m

  def chunk(j):
    start = start_of(j)
    return fn(jax.lax.dynamic_slice_in_dim(idx, start, m), start + positions < count)

  # The microbatches holding sampled rows, common path and overflow beyond the
  # padding alike; each device loops over its own (no collective inside).
  def cond(carry):
    j, _ = carry
    return start_of(j) < count

  def body(carry):
    j, acc = carry
    return j + 1, jax.tree.map(jnp.add, acc, chunk(j))

  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(chunk, jnp.int32(0)))
  _, total = jax.lax.while_loop(cond, body, (jnp.int32(0), zeros))
  if axis_name is not None:
    total = jax.lax.psum(total, axis_name)
  return total, count
