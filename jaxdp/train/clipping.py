"""Per-example gradients and per-example L2 clipping, with a bound that holds after rounding.

Clipping bounds each example's contribution to the summed gradient by
`l2_clip_norm`, the sensitivity the Gaussian mechanism is calibrated to. The
neighbouring example may be *any* float32 bit pattern (chosen to cancel, to
overflow or underflow a squared norm, subnormal, NaN, +-inf), so the bound is
stated for what the float computation adds, not for exact arithmetic:

  An example's *contribution* is its summands as the rounding of the sum
  leaves them: a float sum of terms a_j returns sum_j a_j (1 + theta_j) with
  |theta_j| <= gamma_n = n u / (1 - n u), u = 2^-24, for any order of the n
  additions (Higham, *Accuracy and Stability of Numerical Algorithms*, Sec.
  3.1, 3.5). Example i's contribution is sum over its terms of a_j (1 + theta_j).

Every path (`clipped_grad_sum`, `clip_per_example`, `clip_per_example_l2`,
and `jaxdp.train.ghost.ghost_clipped_grad_sum`) clips each example against a
`NormBound`: an upper bound U_i of the norm of its exact summands plus the
norm of its share of the sum's rounding, computed from the very float arrays
that are summed, rounding of the bound's own arithmetic included. The
example's weight is w_i = min(1, C / U_i), so its contribution has norm at
most C. An example contributes exactly 0 (selected away with `where`, never
multiplied by 0) when any of its values is not finite, when its bound
overflows float32 (a squared norm above ~3.4e38), or when w_i < 2^-100.

What stays idealised is stated in the privacy assumptions (docs/guides/privacy.md): the float
additions that combine the per-microbatch and per-device sums (each a sum of
vectors of norm <= C), and the floating-point Gaussian noise.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

PyTree = Any
# loss_fn(params, batch) -> per-example losses of shape (b,); `batch` is any
# pytree whose leaves have the b examples on their leading axis.
LossFn = Callable[[PyTree, PyTree], jax.Array]

#: Unit roundoff of float32 with round to nearest; every bound below is stated in it
#: (float64 values, under x64, round less, so the float32 bound still holds).
UNIT_ROUNDOFF = 2.0 ** -24
#: A result below this magnitude may be flushed to 0 (XLA flushes subnormals on
#: CPU and GPU): each such flush is an absolute error below it.
TINY = 2.0 ** -126
#: The clip norms the guarantee covers (`TrainConfig` enforces them): up to MAX
#: every scale below stays finite; from MIN up, the absolute errors of flushed
#: subnormals in what an example adds (below 2^-60 C, or 1e-18 with the
#: largest values that do not overflow a squared norm) fit in the margin.
MIN_CLIP_NORM, MAX_CLIP_NORM = 2.0 ** -20, 2.0 ** 40
_MIN_WEIGHT = 2.0 ** -100  # below it a weight would be subnormal: the example contributes 0
_FLOOR = 2.0 ** -60        # every bound is at least this, so C / bound stays finite
_MIN_RATIO = -60           # parts more than 2^60 below the largest count as 2^-60 of it
_HIGHEST = jax.lax.Precision.HIGHEST


def gamma(n: int) -> float:
  """Higham's gamma_n = n u / (1 - n u) for float32: the relative error of n roundings.

  Raises:
    ValueError: n u >= 1/2 (no useful bound; never for the sizes jaxdp builds).
  """
  nu = n * UNIT_ROUNDOFF
  if not 0 <= nu < 0.5:
    raise ValueError(f"a float32 sum of n={n} terms has no useful error bound (n must be in [0, 2^23))")
  return nu / (1.0 - nu)


def inflate(n: int) -> float:
  """The smallest float32 >= 1 + gamma_{n+1}: a positive value computed with n roundings, times
  this factor (one more rounding), is at least the exact value, since (1 - u)^-m <= 1 + gamma_m
  (Higham, Lemma 3.1)."""
  factor = np.float32(1.0 + gamma(n + 1))
  if float(factor) < 1.0 + gamma(n + 1):
    factor = np.nextafter(factor, np.float32(2.0))
  return float(factor)


class NormBound(NamedTuple):
  """A per-example bound on one part of what a clipped sum adds.

  The part is a float array x_i per example whose summands, multiplied by the
  example's scale and summed, form the clipped sum. In units of
  2**exponent_i:

    ||x_i|| <= norm_i   and   ||x_i's share of the sum's rounding|| <= share_i.

  A non-finite norm or share means the example contributes 0.

  Attributes:
    exponent: (b,) int32, the part's power-of-two scale (0: true units).
    norm: (b,) float32 upper bound of the norm of the summed values.
    share: (b,) float32 upper bound of the norm of their rounding share.
  """
  exponent: jax.Array
  norm: jax.Array
  share: jax.Array


_STAGE = 64


def _staged_sum(values: jax.Array) -> tuple[jax.Array, int]:
  """(sum over axis 1 of (b, n) values, the most additions on any term's path to the result)."""
  b, n = values.shape
  if n <= _STAGE:
    return jnp.sum(values, axis=1), max(n - 1, 0)
  head = _STAGE * (n // _STAGE)
  # The barrier keeps XLA from merging the stages back into one long reduction.
  partial = jax.lax.optimization_barrier(jnp.sum(values[:, :head].reshape(b, -1, _STAGE), axis=2))
  total, depth = _staged_sum(partial)
  depth += _STAGE - 1
  if head < n:
    total = total + jnp.sum(values[:, head:], axis=1)
    depth = max(depth, n - head - 1) + 1
  return total, depth


def sum_of_squares(x: jax.Array) -> tuple[jax.Array, int]:
  """(per-example sum of x**2 over all but the leading axis, additions on any term's path).

  A float sum of n terms is within gamma_k of exact, k the additions on the
  longest path from a term to the result; a single reduction in any order
  allows k = n - 1. Here each example's values are summed in stages of 64
  (the rest of a stage added once), with an optimisation barrier between
  stages: k <= 64 log_64(n) + stages, e.g. 115 for a 3x3x32x64 kernel instead
  of 18,431. Each stage's result is 64 times smaller than its input.
  """
  x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
  b = x.shape[0]
  return _staged_sum(jnp.square(x.reshape(b, -1)))


def gradient_bound(grads: Sequence[jax.Array], terms: int) -> NormBound:
  """`NormBound` of per-example gradients (true units) whose weighted values enter `terms`-long sums.

  `terms` is the length of the float sums each weighted value enters: b for
  `weighted_sum` over b rows (the products w_i g_i included), 1 for a
  materialised w_i g_i.

  Bound: each square is g^2 (1 + delta) or flushed (an error below TINY); a
  sum of n non-negative terms along paths of at most k additions is within
  gamma_k of its exact value, plus TINY per flushed addition; so with s the
  computed sum, ||g||^2 <= (s + 2 n TINY) inflate(k + 3) (two roundings
  more for the square root that follows, which rounds by at most u). The rounding share of a length-`terms` dot
  product is `gamma_terms sum_i |w_i g_ik| <= gamma_terms w_i ||g_i||`.
  """
  total, depth, count = 0.0, 0, 0
  for g in grads:
    s, k = sum_of_squares(g)
    total, depth, count = total + s, max(depth, k), count + math.prod(g.shape[1:])
  depth += len(grads)
  norm = jnp.sqrt((total + 2.0 * count * TINY) * inflate(depth + 3))
  b = grads[0].shape[0]
  return NormBound(exponent=jnp.zeros((b,), jnp.int32), norm=norm, share=gamma(terms) * norm)


class ClipScales(NamedTuple):
  """What `clip_scales` returns.

  Attributes:
    weight: (b,) the clip factor w_i = min(1, C / U_i) in true units, 0 for
      rows that contribute nothing.
    scales: per `NormBound` given, (b,) w_i * 2**exponent_i: the factor of
      that part's scaled values (0 where the row contributes nothing).
    keep: (b,) bool, True for rows that contribute.
  """
  weight: jax.Array
  scales: tuple
  keep: jax.Array


def clip_scales(bounds: Sequence[NormBound], l2_clip_norm: jax.Array, mask: jax.Array) -> ClipScales:
  """Per-example clip scales from the `NormBound` of every part of the example's gradient.

  Args:
    bounds: one `NormBound` per part (the parts together are the example's
      whole gradient).
    l2_clip_norm: C in [MIN_CLIP_NORM, MAX_CLIP_NORM] (may be traced).
    mask: (b,) bool, False for padding rows (they contribute 0).

  Returns:
    The `ClipScales`.

  Guarantees:
    With E the largest exponent and l_p = 2^max(E_p - E, -60) >= 2^(E_p - E),
    the parts' contributions total at most 2^E U with
    U = (sqrt(sum_p l_p^2 norm_p^2) + sum_p l_p share_p) times a margin for
    this function's own roundings and, for C >= MIN_CLIP_NORM, the absolute
    errors of subnormals flushed to zero in the sums. The weight is
    w = min(1, C / (2^E U)), applied to part p as the scale w 2^E_p (exact
    powers of two; C / U rounds by at most u). Hence each kept example adds
    at most C. A row is dropped (all scales 0) if it is masked, if U is not
    finite (a non-finite value, or a squared norm that overflows), or if
    w < 2^-100 (a gradient norm above ~1e30 C).
  """
  exponents = [jnp.asarray(bd.exponent, jnp.int32) for bd in bounds]
  top = exponents[0]
  for e in exponents[1:]:
    top = jnp.maximum(top, e)
  ratios = [jnp.ldexp(jnp.float32(1.0), jnp.maximum(e - top, _MIN_RATIO)) for e in exponents]
  norm_sq = sum(jnp.square(r * bd.norm) for r, bd in zip(ratios, bounds))
  share = sum(r * bd.share for r, bd in zip(ratios, bounds))
  # Roundings between the parts' bounds and C / bound: the products share_p (one each), the
  # squares and their sum, the square root, the sum of shares, one addition, the division;
  # and one u more for the flushed subnormals' absolute errors (see MIN_CLIP_NORM).
  margin = inflate(2 * len(bounds) + 4)
  bound = jnp.maximum((jnp.sqrt(norm_sq) + share) * margin, _FLOOR)
  ratio = jnp.asarray(l2_clip_norm, jnp.float32) / bound  # finite: bound >= _FLOOR
  unclipped = jnp.ldexp(ratio, -top) >= 1.0
  weight = jnp.minimum(1.0, jnp.ldexp(ratio, -top))
  keep = mask & jnp.isfinite(bound) & (weight >= _MIN_WEIGHT)
  scales = tuple(
      jnp.where(keep, jnp.where(unclipped, jnp.ldexp(jnp.float32(1.0), e), jnp.ldexp(ratio, e - top)), 0.0)
      for e in exponents)
  return ClipScales(weight=jnp.where(keep, weight, 0.0), scales=scales, keep=keep)


def check_clip_norm(l2_clip_norm) -> None:
  """Raises ValueError for a concrete C outside [MIN_CLIP_NORM, MAX_CLIP_NORM] (traced C passes)."""
  try:
    values = np.asarray(l2_clip_norm, np.float64)
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
    return
  if not np.all((values >= MIN_CLIP_NORM) & (values <= MAX_CLIP_NORM)):
    raise ValueError(f"l2_clip_norm must be in [{MIN_CLIP_NORM:.3g}, {MAX_CLIP_NORM:.3g}] (2^-20 to "
                     f"2^40, where the float32 clipping bound holds), got {l2_clip_norm!r}")


def per_example_grads(loss_fn: LossFn, params: PyTree, batch: PyTree) -> tuple[PyTree, jax.Array]:
  """Per-example gradients via `jax.vmap` of `jax.value_and_grad`.

  Args:
    loss_fn: maps (params, batch) with a leading example axis on every leaf
      of `batch` to the per-example losses, shape (b,).
    params: parameter tree.
    batch: pytree of arrays, b examples on the leading axis.

  Returns:
    (grads, losses): `grads` has every leaf of `params` with a leading batch
    axis; `losses` has shape (b,).
  """
  def single(p, example):
    # One example becomes a batch of one, so models never see unbatched input.
    return loss_fn(p, jax.tree.map(lambda leaf: leaf[None], example))[0]
  losses, grads = jax.vmap(jax.value_and_grad(single), in_axes=(None, 0))(params, batch)
  return grads, losses


def per_example_global_norms(grads: PyTree) -> jax.Array:
  """L2 norm of each example's gradient over all leaves, shape (batch,), as computed in float
  (for reporting; clipping uses the rigorous `gradient_bound`)."""
  leaves = jax.tree.leaves(grads)
  batch = leaves[0].shape[0]
  sq = sum(jnp.sum(jnp.square(leaf.reshape(batch, -1)), axis=1) for leaf in leaves)
  return jnp.sqrt(sq)


def _per_row(weights: jax.Array, g: jax.Array) -> jax.Array:
  """`weights` (b,) shaped to broadcast over the rows of g (b, ...)."""
  return weights.reshape((-1,) + (1,) * (g.ndim - 1))


def clip_per_example(grads: PyTree, l2_clip_norm: jax.Array) -> tuple[PyTree, jax.Array]:
  """Clips each example's gradient so that the clipped values have global L2 norm at most C.

  Args:
    grads: tree of per-example gradients, leading batch axis on every leaf.
    l2_clip_norm: clip norm C in [MIN_CLIP_NORM, MAX_CLIP_NORM].

  Returns:
    (clipped grads with the same structure, in at least float32 precision;
    unclipped norms of shape (batch,) as computed in float). A row with a
    non-finite value (or a bound that overflows) is exactly 0; a row whose
    bound is at most C is unchanged.

  Guarantees:
    The computed clipped values of each row have norm <= C (the products'
    rounding included), for any float values of `grads`. The products are
    formed in float32 (or wider): a bfloat16 or float16 weight and product
    would round by far more than the bound allows (by 0.5% for bfloat16).
  """
  check_clip_norm(l2_clip_norm)
  leaves, treedef = jax.tree.flatten(grads)
  bound = gradient_bound(leaves, terms=1)
  weight = clip_scales([bound], l2_clip_norm, jnp.ones(bound.norm.shape, bool)).weight

  def clip(g):
    g = g.astype(jnp.promote_types(g.dtype, jnp.float32))
    return jnp.where(_per_row(weight, g) > 0, g * _per_row(weight, g).astype(g.dtype), 0.0)
  clipped = [clip(g) for g in leaves]
  return treedef.unflatten(clipped), per_example_global_norms(grads)


def weighted_sum(grads: PyTree, weights: jax.Array, norms: jax.Array | None = None) -> PyTree:
  """sum_i weights[i] * grads[i] over the leading axis of every leaf, in float32 precision.

  Rows with zero weight contribute exactly zero even if they hold NaN/inf
  (where 0 * inf would give NaN).

  Args:
    grads: per-example gradient tree, leading batch axis on every leaf.
    weights: (batch,) non-negative weights.
    norms: optional (batch,) per-example norms (or norm bounds) of `grads`; a
      row can hold a non-finite value only if its norm is not finite, so
      passing them lets the common all-finite case skip the sanitising pass.

  Returns:
    The weighted sum, a tree shaped like one example's gradient.
  """
  def dot(tree):
    # A contraction over the batch lowers to one matmul (an elementwise select +
    # reduce made the whole DP step ~1.7x slower). HIGHEST: the bounds assume
    # float32 rounding, which TF32 or bfloat16 passes on accelerators are not.
    return jax.tree.map(lambda g: jnp.tensordot(weights.astype(jnp.promote_types(g.dtype, jnp.float32)),
                                                g, axes=1, precision=_HIGHEST), tree)

  def sanitised():
    keep = weights > 0
    return dot(jax.tree.map(lambda g: jnp.where(_per_row(keep, g), g, 0.0), grads))

  if norms is None:
    norms = per_example_global_norms(grads)
  # Under vmap this cond becomes a select and runs both branches; still exact.
  return jax.lax.cond(jnp.all(jnp.isfinite(norms)), lambda: dot(grads), sanitised)


def clipped_grad_sum(loss_fn: LossFn, params: PyTree, batch: PyTree, mask: jax.Array,
                     l2_clip_norm: jax.Array) -> tuple[PyTree, jax.Array]:
  """Sum over the unmasked examples of their clipped gradients (vmap per-example gradients).

  Masked rows (padding) contribute exactly zero whatever their content.

  Args:
    loss_fn: per-example loss function, see `per_example_grads`.
    params: parameter tree.
    batch: pytree of arrays with b examples on the leading axis.
    mask: (b,) boolean, True for rows that belong to the sampled batch.
    l2_clip_norm: clip norm C in [MIN_CLIP_NORM, MAX_CLIP_NORM].

  Returns:
    (summed clipped gradient tree, number of unmasked rows as float32).

  Guarantees:
    Each example's contribution to the returned sum (its weighted gradient,
    with its share of the sum's rounding) has norm <= C, for any float32
    values of its inputs (see the module docstring); a row with a non-finite
    gradient contributes exactly 0.
  """
  check_clip_norm(l2_clip_norm)
  grads, _ = per_example_grads(loss_fn, params, batch)
  leaves, treedef = jax.tree.flatten(grads)
  bound = gradient_bound(leaves, terms=mask.shape[0])
  weight = clip_scales([bound], l2_clip_norm, mask).weight
  summed = weighted_sum(leaves, weight, bound.norm)
  return treedef.unflatten(summed), jnp.sum(mask.astype(jnp.float32))


class ClipState(NamedTuple):
  """State of `clip_per_example_l2`: the clip norm as an array, so it can be
  vmapped over candidates without recompiling."""
  l2_clip_norm: jax.Array


def clip_per_example_l2(l2_clip_norm: float | jax.Array) -> optax.GradientTransformationExtraArgs:
  """Optax transformation: per-example gradients in, sum of clipped ones out.

  `update(per_example_grads, state, params=None, *, mask=None)` takes a tree
  whose leaves have a leading batch axis and returns the tree of sums over
  the batch of the clipped gradients (rows with mask False contribute 0),
  with the guarantee of `clipped_grad_sum`. Follow it with
  `jaxdp.train.add_gaussian_noise` to privatise the sum.

  Args:
    l2_clip_norm: clip norm C in [MIN_CLIP_NORM, MAX_CLIP_NORM], stored as an
      array in the state.

  Returns:
    The gradient transformation.
  """
  check_clip_norm(l2_clip_norm)

  def init_fn(params):
    del params
    return ClipState(l2_clip_norm=jnp.asarray(l2_clip_norm, jnp.float32))

  def update_fn(updates, state, params=None, *, mask=None, **extra_args):
    del params, extra_args
    leaves, treedef = jax.tree.flatten(updates)
    b = leaves[0].shape[0]
    bound = gradient_bound(leaves, terms=b)
    weight = clip_scales([bound], state.l2_clip_norm, jnp.ones((b,), bool) if mask is None else mask).weight
    return treedef.unflatten(weighted_sum(leaves, weight, bound.norm)), state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
