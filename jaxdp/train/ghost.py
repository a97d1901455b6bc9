"""Ghost clipping: the clipped gradient sum without per-example weight gradients.

`ghost_clipped_grad_sum` returns what `clipping.clipped_grad_sum` returns,
but for every eligible `flax.linen.Dense`, `flax.linen.DenseGeneral`,
`flax.linen.Conv`, `jaxdp.models.Conv2D` and `flax.linen.Embed` call it
never materialises the per-example weight gradients ((b, d_in, d_out) for a
kernel, (b, V, d) for an embedding table), which dominate the memory of the
vmap path for wide layers and large vocabularies.  Every other parameter
(LayerNorm scales, a table read twice, ...) falls back to vmap per-example
gradients.

For a layer y_t = r_t W + c (t over positions: the middle axes of a Dense
input, the non-contracted axes of a DenseGeneral input, whose contracted
axes form r_t (attention's projections: axis -1 to (heads, head_dim), or
(heads, head_dim) contracted), the output pixels of a convolution whose rows
r_t are the input patches) the per-example gradients are

  dL/dW = sum_t r_t^T g_t = R^T G,     dL/dc = sum_t g_t,

with g_t = dL/dy_t.  Hence, with per-example R (T, d_in) and G (T, d_out),

  ||R^T G||_F^2 = sum_{t,s} (r_t . r_s)(g_t . g_s)             (Gram, cost ~ T^2)

or R^T G itself (cost ~ d_in d_out), whichever is cheaper; for T = 1 it is
||r||^2 ||g||^2 (Goodfellow, "Efficient per-example gradient computations",
arXiv:1510.01799; Li et al., "Large language models can be strong
differentially private learners", ICLR 2022, Sec. 4; the per-layer choice is
the "mixed ghost clipping" of Bu et al., "Scalable and efficient training of
large convolutional neural networks with differential privacy", NeurIPS
2022).  One vmapped backward pass gives R, G and the fallback leaves'
per-example gradients; the clipped sum is then sum_i w_i R_i^T G_i with the
clip factors w_i, so no second backward pass is needed (the "book-keeping"
trick of Bu et al., "Differentially private optimization on large model at
small cost", ICML 2023).

An embedding lookup y_t = E[x_t] is the case r_t = e_{x_t}, a one-hot row of
length V: its gradient sum_t e_{x_t} g_t^T is scattered into the rows read,
and r_t . r_s = [x_t = x_s] exactly, so

  ||dL/dE||_F^2 = sum_{t,s} [x_t = x_s] (g_t . g_s)              (cost ~ T^2 d)

with no V-sized tensor (Li et al., ICLR 2022, App.). "The row read" is the
one the layer's `jnp.take` reads: a negative id wraps (-1 is row V - 1), an
id out of range reads none (the lookup is NaN and its gradient drops it), so
equality is taken on those rows, and the clipped sum is scattered into
exactly them: what is normed is what is added. It is the Gram form below
with d_in = 1 and exact row products, so the same bound holds.

Sensitivity holds after rounding (`jaxdp.train.clipping`): example i adds w_i
(R_i^T G_i per ghost layer, its vmap gradient per fallback leaf) to the sum,
and w_i comes from a rigorous upper bound of the norm of what is added, float
rounding included. In the Gram form sum_{t,s} (r_t . r_s)(g_t . g_s) the
terms may cancel (an adversary can make the computed value 0 for a gradient
of norm 3,000 C), so the bound adds the form's rounding error, relative to
(sum_t ||r_t|| ||g_t||)^2, and the book-keeping contraction's, on rows and
cotangents scaled per example by powers of two so that no square overflows
or underflows (`_kernel_part` states each form's bound).  That the vector
*is* the example's gradient needs each ghost kernel and bias to be used by
its one call alone.
This is decided structurally, at trace time, on abstract values of one
example: a call qualifies only if it is made in the loss's own trace (not
inside nn.scan, nn.remat, jax.checkpoint ...), its parameters are leaves of
`params` (checked by identity), and no other call reads them; then, on a
jaxpr in which every qualifying call is recomputed from separate copies of
its parameters, the original parameter inputs must be unused.  A kernel that
is tied, read by another module or by the loss itself, or used by a layer
called twice therefore falls back: its gradient has other terms, which a
ghost norm would miss.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxdp.models import layers as jaxdp_layers
from jaxdp.train import clipping
from jaxdp.train.ghost_analysis import (Call, NOT_DETERMINISTIC, analyse, contracted, geometry,
                                        interceptor,
                                       layer_input, single_loss, uses_gram, weight_of)

PyTree = Any
LossFn = clipping.LossFn

_HIGHEST = jax.lax.Precision.HIGHEST


def _rows(call: Call, x: jax.Array) -> jax.Array:
  """(b, T, d_in) rows R with y = R @ kernel.reshape(d_in, d_out) + bias, per example.

  x holds b examples' inputs, each shaped as the layer saw it.
  """
  b = x.shape[0]
  module = call.module
  if call.kind == "Dense":
    return x.reshape(b, -1, x.shape[-1])
  if call.kind == "DenseGeneral":
    # The contracted axes last, in the kernel's order: the output is the other axes, then features.
    axes = tuple(a + 1 for a in contracted(module, x.ndim - 1))
    rest = tuple(a for a in range(1, x.ndim) if a not in axes)
    return jnp.transpose(x, (0,) + rest + axes).reshape(b, -1, math.prod(x.shape[a] for a in axes))
  if call.kind == "Conv2D":
    patches = jaxdp_layers.extract_patches(x.reshape((-1,) + x.shape[-3:]), module.kernel_size,
                                           module.strides, module.padding)
    return patches.reshape(b, -1, patches.shape[-1])  # (kh, kw, C) order = kernel.reshape
  # nn.Conv: run the layer itself with a one-hot kernel, grouped by input
  # channel (as lax.conv_general_dilated_patches does), so its own padding
  # (SAME, CIRCULAR, CAUSAL, ...), strides and dilations give the patches.
  kernel_size = (module.kernel_size,) if isinstance(module.kernel_size, int) else tuple(module.kernel_size)
  k, c_in = math.prod(kernel_size), x.shape[-1]
  # Channel c's group has outputs c*k + j; output j copies kernel position j.
  one_hot = jnp.tile(jnp.eye(k, dtype=x.dtype), (1, c_in)).reshape(kernel_size + (1, c_in * k))
  patch_layer = module.clone(parent=None, features=c_in * k, use_bias=False,
                             feature_group_count=c_in, precision=_HIGHEST)
  # Leading axes beyond the spatial ones are batch axes to nn.Conv.
  patches = patch_layer.apply({"params": {"kernel": one_hot}}, x)
  patches = patches.reshape(b, -1, c_in, k)
  return jnp.swapaxes(patches, -1, -2).reshape(b, -1, k * c_in)  # (kernel position, C) order


def _power_of_two(k: jax.Array) -> jax.Array:
  """2.0**k as float32, exactly, for integer k in [-126, 127] (built from its bits)."""
  return jax.lax.bitcast_convert_type((k + 127) << 23, jnp.float32)


def _normalise(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(x / 2^E_i per example, E (b,) int32, finite (b,) bool): max |x / 2^E_i| in [1/2, 1).

  E_i is in [-126, 128], and x / 2^E_i is two multiplications by powers of two
  in the normal range (2^-E_i alone may not be): exact, but for results that
  underflow, which only shrink; so every scaled value is at most 1 in
  magnitude, which the bounds' absolute terms rely on. A row holding a
  non-finite value keeps it (E_i = 0) and is flagged. One multiplication,
  which XLA fuses into the values' producer (`jnp.ldexp`'s bit
  manipulations, a clip and a select each materialised a copy of x).
  """
  b = x.shape[0]
  x = x.astype(jnp.promote_types(x.dtype, jnp.float32))  # the bounds assume float32 rounding
  top = jnp.max(jnp.abs(x).reshape(b, -1), axis=1)
  finite = jnp.isfinite(top)
  exponent = jnp.where(finite, jnp.maximum(jnp.frexp(top)[1], -126), 0)
  half = exponent // 2
  scale = (_power_of_two(-half) * _power_of_two(half - exponent)).reshape((b,) + (1,) * (x.ndim - 1))
  return x * scale, exponent, finite


class _KernelPart(NamedTuple):
  """One ghost call's kernel: its `NormBound` and what its clipped sum is built from."""
  bound: clipping.NormBound
  rows: Any         # (b, T, d_in) rows, scaled like `bound` (Gram forms), else None
  cots: Any         # (b, T, d_out) cotangents, scaled like `bound` (Gram forms), else None
  per_example: Any  # (b, d_in, d_out) R_i^T G_i (direct form), else None


def _kernel_part(call: Call, inputs: jax.Array, cots: jax.Array, d_in: int) -> _KernelPart:
  """The kernel part of one ghost call from its per-example inputs and cotangents G (b, T, d_out);
  d_in is the kernel's size over d_out (a row's length).

  Let R (b, T, d_in) be the rows, S = sum_t ||r_t|| ||g_t|| and K = b T.

  Direct form (T (d_in + d_out) >= d_in d_out): R_i^T G_i is materialised,
  normed from those very values (`clipping.gradient_bound`), and the clipped
  sum is their weighted sum over the b rows (the ghost saving is then only
  the other layers'). However they were rounded, what is summed is what is
  normed.

  Gram forms: the clipped sum is the book-keeping contraction
  sum_i R_i^T (w_i G_i), of length K. Its rounding gives example i's terms
  r_tk w_i g_to (1 + theta) with |theta| <= gamma_{K+1} (the product w_i g_to
  rounded too), so its share has norm <= gamma_{K+1} w_i S. And:

    * T = 1: ||r g^T||^2 = ||r||^2 ||g||^2, two sums of squares with no
      cancellation (errors as in `clipping.gradient_bound`); S is the same
      product. The values are used as they are (true units).
    * T > 1: ||R^T G||_F^2 = sum_{t,s} (r_t . r_s)(g_t . g_s), whose terms
      may cancel. The inputs (so the rows: a convolution's patches copy input
      values or are 0) and G are scaled per example by powers of two to max
      |entry| in [1/2, 1) (exponents E_r, E_g; the part's exponent is
      E_r + E_g), so no square overflows or underflows. The dot products
      then err by gamma_{d_in} ||r_t|| ||r_s||, gamma_{d_out} ||g_t|| ||g_s||,
      the product by u, the two-stage sum over (t, s) by gamma_{2T} of
      sum |terms| <= S^2, so the computed value v satisfies
      ||R^T G||^2 <= v + gamma_{2T + d_in + d_out + 1} S^2 + A (Higham's
      gamma_j + gamma_k + gamma_j gamma_k <= gamma_{j+k}); A =
      T^2 d_in d_out 2^-122 bounds the flushed subnormals (every scaled entry
      is at most 1). S comes from the Gram diagonals (positive terms): its
      computed value plus 5 T sqrt(d_in d_out) 2^-63 (flushed squares), times
      1 + gamma_{T + d_in + d_out + 6}, bounds it.

  A row holding a non-finite value gets a NaN bound (it then contributes 0).
  """
  b, t, d_out = cots.shape
  if call.kind == "Embed" or (t > 1 and uses_gram(t, d_in, d_out)):
    return _gram_part(call, inputs, cots)
  rows = _rows(call, inputs).astype(jnp.promote_types(inputs.dtype, jnp.float32))
  cots = cots.astype(jnp.promote_types(cots.dtype, jnp.float32))
  if t > 1:
    per_example = jnp.einsum("btk,bto->bko", rows, cots, precision=_HIGHEST)
    return _KernelPart(bound=clipping.gradient_bound([per_example], terms=b), rows=None, cots=None,
                       per_example=per_example)
  (rr, k_r), (gg, k_g) = clipping.sum_of_squares(rows), clipping.sum_of_squares(cots)
  norm = jnp.sqrt((rr + 2.0 * d_in * clipping.TINY) * (gg + 2.0 * d_out * clipping.TINY)
                  * clipping.inflate(k_r + k_g + 6))
  bound = clipping.NormBound(exponent=jnp.zeros((b,), jnp.int32), norm=norm,
                             share=clipping.gamma(b + 1) * norm)
  return _KernelPart(bound=bound, rows=rows, cots=cots, per_example=None)


def _token_rows(call: Call, tokens: jax.Array) -> jax.Array:
  """(b, T) the table row each token reads, as the layer's `jnp.take` reads it (a negative id
  wraps), or -1 where it reads none (an id out of range: the lookup gives NaN)."""
  rows = jnp.arange(call.module.num_embeddings, dtype=jnp.int32)
  return jnp.take(rows, tokens.reshape(tokens.shape[0], -1), axis=0, mode="fill", fill_value=-1)


def _gram_part(call: Call, inputs: jax.Array, cots: jax.Array) -> _KernelPart:
  """The Gram form of `_kernel_part` (T > 1, or any Embed), on per-example scaled inputs and
  cotangents. An Embed's rows are one-hot, so r_t . r_s = [row_t = row_s] exactly: its part
  keeps the (b, T) rows read (`_token_rows`) instead of rows."""
  cots, e_cots, finite_cots = _normalise(cots)
  b, t, d_out = cots.shape
  if call.kind == "Embed":
    rows = _token_rows(call, inputs)
    read = rows >= 0
    rr = ((rows[:, :, None] == rows[:, None, :]) & read[:, :, None]).astype(cots.dtype)
    e_rows, finite_rows, d_in = jnp.zeros((b,), jnp.int32), True, 1
  else:
    inputs, e_rows, finite_rows = _normalise(inputs)
    rows = _rows(call, inputs)
    d_in = rows.shape[2]
    rr = jnp.einsum("btk,bsk->bts", rows, rows, precision=_HIGHEST)
  gg = jnp.einsum("bto,bso->bts", cots, cots, precision=_HIGHEST)
  # Two stages (the barrier keeps XLA from merging them): a term passes at most
  # 2T additions, not T^2.
  gram = jnp.sum(jax.lax.optimization_barrier(jnp.sum(rr * gg, axis=2)), axis=1)
  diag = (jnp.sqrt(jnp.maximum(jnp.diagonal(rr, axis1=1, axis2=2), 0.0))
          * jnp.sqrt(jnp.maximum(jnp.diagonal(gg, axis1=1, axis2=2), 0.0)))
  mass = ((jnp.sum(diag, axis=1) + 5.0 * t * math.sqrt(d_in * d_out) * 2.0 ** -63)
          * clipping.inflate(t + d_in + d_out + 5))
  # inflate(6): this line's roundings and the square root's below. jnp.maximum keeps NaN.
  norm_sq = ((jnp.maximum(gram, 0.0) + clipping.gamma(2 * t + d_in + d_out + 1) * jnp.square(mass)
              + t * t * d_in * d_out * 2.0 ** -122) * clipping.inflate(6))
  # A non-finite input or cotangent makes the bound NaN: the example then contributes 0.
  norm = jnp.where(finite_rows & finite_cots, jnp.sqrt(norm_sq), jnp.nan)
  bound = clipping.NormBound(exponent=e_rows + e_cots, norm=norm, share=clipping.gamma(b * t + 1) * mass)
  return _KernelPart(bound=bound, rows=rows, cots=cots, per_example=None)


def ghost_clipped_grad_sum(loss_fn: LossFn, params: PyTree, batch: PyTree, mask: jax.Array,
                           l2_clip_norm: jax.Array, *, auto: bool = False) -> tuple[PyTree, jax.Array]:
  """Sum over the unmasked examples of their clipped gradients, by ghost clipping.

  A drop-in for `clipping.clipped_grad_sum`: same arguments, same result up
  to float rounding and the slack of each path's norm bound, but eligible Embed / Dense / DenseGeneral / Conv / Conv2D layers (see
  `ghost_layers`) never hold per-example weight gradients, so memory grows
  with the activations instead of with b x the parameter count.  Without any
  eligible layer this is `clipping.clipped_grad_sum`.

  Jittable and vmappable (over params, batch and l2_clip_norm); the layer
  analysis runs at trace time on shapes only, so it is free once compiled.

  Guarantees:
    * Each example's contribution (what the float sums add for it, its share
      of their rounding included) has L2 norm at most `l2_clip_norm`, for any
      float32 values of its inputs: its weight comes from
      `clipping.clip_scales` over rigorous bounds of every part it adds
      (`_kernel_part` states the Gram, one-position and direct forms' bounds;
      bias and fallback gradients are normed from the very values summed).
    * Masked rows, rows holding a non-finite value, and rows whose bound
      overflows contribute exactly zero (selected away with `where`, never
      multiplied by 0).

  Args:
    loss_fn: maps (params, batch) to per-example losses (b,); see
      `clipping.per_example_grads`.
    params: parameter tree.
    batch: pytree of arrays with b examples on the leading axis.
    mask: (b,) boolean, True for rows that belong to the sampled batch.
    l2_clip_norm: clip norm C in [clipping.MIN_CLIP_NORM, clipping.MAX_CLIP_NORM]
      (may be traced).
    auto: choose, per eligible layer, between its ghost norm and its
      per-example gradient by their per-example bytes and work, from shapes
      (`Task(clipping="auto")`, the default): a layer keeps its ghost norm
      only where that is smaller and less work, and only if the layers kept
      save `AUTO_MIN_SAVING` of an example's working set (or that working
      set exceeds the device's microbatch budget). Wide Dense layers go
      ghost; a small CNN's convolutions, whose patches cost more than their
      kernels' gradients, stay on the vmap path. The sum is the same either
      way, up to float rounding.

  Returns:
    (summed clipped gradient tree shaped like `params`, number of unmasked
    rows as float32).

  Raises:
    RuntimeError: if `loss_fn` makes different layer calls in different
      traces (its calls must depend on shapes only).
  """
  clipping.check_clip_norm(l2_clip_norm)
  calls, _, treedef, _ = analyse(loss_fn, params, batch, auto)
  return _ghost_sum(loss_fn, params, batch, mask, l2_clip_norm, calls, treedef)


def ghost_sum_for(loss_fn: LossFn, *, auto: bool = False) -> Callable[..., tuple[PyTree, jax.Array]]:
  """`ghost_clipped_grad_sum` of this one `loss_fn`, as `(params, batch, mask, l2_clip_norm)
  -> (sum, rows)`, whose layer analysis runs once per shape of the parameters and of one
  example instead of once per call: what `DpSgdPlan.clipped_grad` builds, which the DP loop
  calls twice in one trace (for its sum's shapes, then in its loop)."""
  analysed: dict = {}  # lives as long as this function: one entry per shape, rarely two

  def summed(params: PyTree, batch: PyTree, mask: jax.Array, l2_clip_norm: jax.Array):
    clipping.check_clip_norm(l2_clip_norm)
    # `analyse` reads nothing but the loss (fixed here) and these shapes and dtypes: equal keys,
    # equal analyses. The number of rows is left out; it reads one example's shapes.
    key = (jax.tree.structure(params), jax.tree.structure(batch),
           tuple((jnp.shape(x), jnp.result_type(x)) for x in jax.tree.leaves(params)),
           tuple((jnp.shape(x)[1:], jnp.result_type(x)) for x in jax.tree.leaves(batch)))
    if key not in analysed:
      analysed[key] = analyse(loss_fn, params, batch, auto)
    calls, _, treedef, _ = analysed[key]
    return _ghost_sum(loss_fn, params, batch, mask, l2_clip_norm, calls, treedef)
  return summed


def _ghost_sum(loss_fn: LossFn, params: PyTree, batch: PyTree, mask: jax.Array, l2_clip_norm: jax.Array,
               calls: list, treedef) -> tuple[PyTree, jax.Array]:
  """`ghost_clipped_grad_sum` given `analyse`'s calls and treedef for `loss_fn` on these shapes."""
  ghost_calls = [c for c in calls if c.reason is None]
  if not ghost_calls:
    return clipping.clipped_grad_sum(loss_fn, params, batch, mask, l2_clip_norm)
  leaves = jax.tree.leaves(params)
  b = mask.shape[0]
  ghost_idx = {i for c in ghost_calls for i in c.params.values()}
  fallback_idx = [i for i in range(len(leaves)) if i not in ghost_idx]
  inputs, fallback_grads, cots = _per_example_pieces(loss_fn, leaves, treedef, ghost_calls,
                                                     fallback_idx, batch)
  shapes = [geometry(call, jnp.shape(leaves[call.params[weight_of(call.kind)]])) for call in ghost_calls]
  cots = {j: c.reshape(b, -1, shapes[j][2]) for j, c in cots.items()}  # (b, T, d_out)
  kernels = [_kernel_part(call, inputs[j], cots[j], shapes[j][1]) for j, call in enumerate(ghost_calls)]
  # A bias gradient sum_t g_t is materialised (b, d_out): its norm is that of the values summed.
  biases = {j: _bias_part(cots[j]) for j, call in enumerate(ghost_calls) if "bias" in call.params}
  bounds = [k.bound for k in kernels] + [bias.bound for bias in biases.values()]
  if fallback_grads:
    bounds.append(clipping.gradient_bound(fallback_grads, terms=b))
  # One clip factor per example from every part's bound: its whole gradient is clipped at once.
  scales = clipping.clip_scales(bounds, l2_clip_norm, mask)
  bias_scales = dict(zip(biases, scales.scales[len(kernels):]))
  out = list(leaves)
  if fallback_grads:
    for i, g in zip(fallback_idx, clipping.weighted_sum(fallback_grads, scales.scales[-1], bounds[-1].norm)):
      out[i] = g
  for j, (call, kernel) in enumerate(zip(ghost_calls, kernels)):
    _add_kernel_sum(out, call, kernel, scales.scales[j], scales.keep)
    if j in biases:
      index = call.params["bias"]
      summed = clipping.weighted_sum([biases[j].values], bias_scales[j], biases[j].bound.norm)[0]
      out[index] = summed.reshape(out[index].shape)
  return treedef.unflatten(out), jnp.sum(mask.astype(jnp.float32))


class _BiasPart(NamedTuple):
  bound: clipping.NormBound
  values: jax.Array  # (b, d_out) per-example bias gradients


def _bias_part(cots: jax.Array) -> _BiasPart:
  values = jnp.sum(cots.astype(jnp.promote_types(cots.dtype, jnp.float32)), axis=1)
  return _BiasPart(bound=clipping.gradient_bound([values], terms=values.shape[0]), values=values)


def _per_example_pieces(loss_fn: LossFn, leaves: list, treedef, ghost_calls: list, fallback_idx: list,
                        batch: PyTree) -> tuple:
  """(each ghost call's inputs, per-example gradients of the fallback leaves, each ghost
  call's output cotangents), all with the example axis first, from one vmapped backward pass."""
  slot = {c.key: j for j, c in enumerate(ghost_calls)}

  def single(fallback_leaves, perturbations, example):
    # Eligible layers' parameters are closed over, not differentiated: their
    # per-example gradients are what we avoid building.
    full = list(leaves)
    for i, leaf in zip(fallback_idx, fallback_leaves):
      full[i] = leaf
    inputs = {}

    def on_call(key, kind, module, nested, next_fun, args, kwargs):
      del kind
      if key not in slot:
        return next_fun(*args, **kwargs)
      call = ghost_calls[slot[key]]
      variables = module.variables.get("params", {})
      if nested or slot[key] in inputs or set(variables) != set(call.params) or any(
          variables[n] is not full[i] for n, i in call.params.items()):
        raise RuntimeError(NOT_DETERMINISTIC)
      inputs[slot[key]] = layer_input(args, kwargs)
      # The gradient w.r.t. a zero added to the output is the output cotangent G.
      return next_fun(*args, **kwargs) + perturbations[slot[key]]

    with interceptor(on_call):
      loss = single_loss(loss_fn, treedef.unflatten(full), example)
    if len(inputs) != len(ghost_calls):
      raise RuntimeError(NOT_DETERMINISTIC)
    return loss, inputs

  perturbations = {j: jnp.zeros(c.out.shape, c.out.dtype) for j, c in enumerate(ghost_calls)}
  grad_fn = jax.value_and_grad(single, argnums=(0, 1), has_aux=True)
  (_, inputs), (fallback_grads, cots) = jax.vmap(grad_fn, in_axes=(None, None, 0))(
      [leaves[i] for i in fallback_idx], perturbations, batch)
  return inputs, fallback_grads, cots


def _add_kernel_sum(out: list, call: Call, kernel: _KernelPart, scale: jax.Array,
                    keep: jax.Array) -> None:
  """Writes one ghost call's clipped kernel sum into `out`: the book-keeping contraction
  sum_i R_i^T (s_i G_i) (Gram form) or the weighted sum of the materialised R_i^T G_i."""
  index = call.params[weight_of(call.kind)]
  if call.kind == "Embed":
    # Scattered into the rows read, as the lookup's own gradient is: what is normed is what is added.
    use = keep[:, None] & (kernel.rows >= 0)
    cots = jnp.where(use[..., None], kernel.cots, 0.0) * scale[:, None, None].astype(kernel.cots.dtype)
    summed = jnp.zeros(out[index].shape, cots.dtype).at[jnp.where(use, kernel.rows, 0).reshape(-1)].add(
        cots.reshape(-1, cots.shape[-1]))
  elif kernel.per_example is not None:
    summed = clipping.weighted_sum([kernel.per_example], scale, kernel.bound.norm)[0]
  else:
    rows_keep = keep[:, None, None]
    # where(), not a product, so a dropped row holding NaN adds exactly 0.
    rows = jnp.where(rows_keep, kernel.rows, 0.0)
    cots = jnp.where(rows_keep, kernel.cots, 0.0) * scale[:, None, None].astype(kernel.cots.dtype)
    # HIGHEST: the share bound assumes float32 rounding (TF32 would not be).
    summed = jnp.einsum("btk,bto->ko", rows, cots, precision=_HIGHEST)
  out[index] = summed.reshape(out[index].shape)
