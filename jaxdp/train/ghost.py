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

import collections
import dataclasses
import math
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.extend.core as jax_core
import jax.numpy as jnp
from flax.linen import dtypes as flax_dtypes

from jaxdp.models import layers as jaxdp_layers
from jaxdp.train import clipping
from jaxdp.train import microbatching

PyTree = Any
LossFn = clipping.LossFn

_HIGHEST = jax.lax.Precision.HIGHEST
#: `auto=True` (`Task(clipping="auto")`) keeps ghost norms only if, together,
#: they shrink one example's working set by at least this fraction of it;
#: below that the per-example gradient path is as small and has less work.
AUTO_MIN_SAVING = 0.1
_NOT_DETERMINISTIC = ("loss_fn made different Embed/Dense/Conv calls when traced again; ghost clipping "
                      "needs a loss whose layer calls depend on shapes only")


class GhostLayer(NamedTuple):
  """One call of a Dense / DenseGeneral / Conv / Conv2D / Embed module seen while tracing the loss.

  Attributes:
    module: the module's path, '/'-joined (e.g. 'Dense_0' or 'block/Conv_1').
    call: 0 for its first call in the loss, 1 for the second, ...
    kind: 'Dense', 'DenseGeneral', 'Conv', 'Conv2D' or 'Embed'.
    leaves: the `params` leaves (as `jax.tree_util.keystr` paths) this call
      reads; empty when its parameters are not leaves of `params` (e.g.
      inside `nn.scan`).
    reason: None when the call's gradient norms are computed by ghost
      clipping; otherwise why its leaves fall back to vmap.
  """
  module: str
  call: int
  kind: str
  leaves: tuple[str, ...]
  reason: str | None


class GhostSplit(NamedTuple):
  """How `ghost_clipped_grad_sum` treats each leaf of `params`.

  Attributes:
    layers: every Dense / DenseGeneral / Conv / Conv2D / Embed call in the loss, in call order.
    ghost_leaves: leaves whose per-example norms come from ghost clipping.
    fallback_leaves: leaves whose per-example gradients are materialised by
      vmap; every leaf of `params` is in exactly one of the two.
    norm_bytes: one example's bytes of what the ghost norms hold instead of
      the ghost leaves' gradients (cotangents, patches, Gram matrices or
      R^T G), for `microbatching.per_example_bytes(extra=...)`.
  """
  layers: tuple[GhostLayer, ...]
  ghost_leaves: tuple[str, ...]
  fallback_leaves: tuple[str, ...]
  norm_bytes: int = 0


@dataclasses.dataclass
class _Call:
  key: tuple[str, int]  # (module path, call index): the same in every trace
  kind: str
  module: nn.Module | None  # an unbound clone (eligible calls only)
  params: dict[str, int]  # parameter name -> index among params' leaves
  out: jax.ShapeDtypeStruct | None  # one example's output (a batch of one), if eligible
  reason: str | None = None


_KINDS = {nn.Dense: "Dense", nn.DenseGeneral: "DenseGeneral", nn.Conv: "Conv",
          jaxdp_layers.Conv2D: "Conv2D", nn.Embed: "Embed"}


def _kind(module: nn.Module) -> str | None:
  # Exact types only: a subclass may change __call__ or anything it relies on.
  return _KINDS.get(type(module))


def _weight_of(kind: str) -> str:
  """The parameter whose ghost norm the call's form computes (the other, if any, is its bias)."""
  return "embedding" if kind == "Embed" else "kernel"


def _feature_axes(kind: str, module: nn.Module) -> int:
  """How many trailing axes of the call's output are its features (d_out is their size)."""
  if kind == "DenseGeneral":
    return len(module.features) if isinstance(module.features, (tuple, list)) else 1
  return 1


def _contracted(module: nn.Module, ndim: int) -> tuple[int, ...]:
  """A DenseGeneral's contracted input axes, non-negative, in the kernel's order: ascending,
  whatever order `axis` names them in (flax sorts them)."""
  axis = module.axis if isinstance(module.axis, (tuple, list)) else (module.axis,)
  return tuple(sorted(a % ndim for a in axis))


def _input(args, kwargs):
  """The one array a layer's __call__ takes, or None for any other call shape."""
  if len(args) == 1 and not kwargs:
    return args[0]
  if not args and len(kwargs) == 1:
    return next(iter(kwargs.values()))
  return None


def _expected_params(kind: str, module: nn.Module) -> set[str]:
  if kind == "Embed":
    return {"embedding"}
  if kind == "Conv2D" or module.use_bias:
    return {"kernel", "bias"}
  return {"kernel"}


def _embed_reason(module: nn.Module, x, variables) -> str | None:
  """Why this nn.Embed call is not a plain row lookup in its one table, or None."""
  if not isinstance(x, jax.Array) or not jnp.issubdtype(x.dtype, jnp.integer):
    return "input is not an integer array"
  if set(variables) != {"embedding"}:
    return f"unexpected parameters {sorted(variables)}"
  table = variables["embedding"]
  if not jnp.issubdtype(jnp.result_type(table), jnp.floating):
    return "the table is not floating-point"
  if module.num_embeddings == 1:
    return "num_embeddings == 1 broadcasts the table whatever the token"
  if module.dtype is not None and jnp.dtype(module.dtype) != jnp.result_type(table):
    return "computation dtype differs from the table's dtype"
  if module.promote_dtype is not flax_dtypes.promote_dtype:
    return "custom promote_dtype"
  return None


def _config_reason(kind: str, module: nn.Module, x, variables) -> str | None:
  """Why this call is not a plain affine map in its parameters (a row lookup for Embed), or None."""
  if kind == "Embed":
    return _embed_reason(module, x, variables)
  if not isinstance(x, jax.Array) or not jnp.issubdtype(x.dtype, jnp.floating):
    return "input is not a floating-point array"
  if set(variables) != _expected_params(kind, module):
    return f"unexpected parameters {sorted(variables)}"
  # Mixed dtypes would make the layer's gradient a cast of R^T G; keep it simple.
  if any(jnp.result_type(v) != x.dtype for v in variables.values()):
    return "parameter and input dtypes differ"
  if kind == "Conv2D":
    if module.impl not in jaxdp_layers.CONV_IMPLS or x.ndim != 4:
      return "unsupported Conv2D configuration"
    return None
  if module.dtype is not None and jnp.dtype(module.dtype) != x.dtype:
    return "computation dtype differs from the input dtype"
  if module.promote_dtype is not flax_dtypes.promote_dtype:
    return "custom promote_dtype"
  if kind in ("Dense", "DenseGeneral"):
    if module.dot_general is not None or module.dot_general_cls is not None:
      return "custom dot_general"
    if kind == "DenseGeneral":
      if module.batch_dims not in ((), []):
        return "batch_dims (a kernel per index of the leading axes)"
      if 0 in _contracted(module, x.ndim):
        return "contracts the example axis"
    return None
  if module.feature_group_count != 1:
    return "feature_group_count != 1"
  if module.mask is not None:
    return "masked kernel"
  if module.conv_general_dilated is not None or module.conv_general_dilated_cls is not None:
    return "custom conv_general_dilated"
  return None


def _interceptor(on_call: Callable[..., Any]):
  """A flax method interceptor calling on_call(key, kind, module, nested, next_fun, args, kwargs).

  Calls are keyed by (module path, how many times that path was called
  before); the key is the same in every trace of the same loss.  `nested` is
  True for a call made inside a JAX transform within the loss (nn.scan,
  nn.remat, jax.checkpoint, an inner jit ...): its values belong to another
  trace, so it can never be ghost (it may also run any number of times).
  Create the interceptor inside the traced function whose trace is the
  reference.  Calls made while on_call runs (our own clones) pass through.
  """
  counts = collections.Counter()
  depth = [0]
  top = jax_core.get_opaque_trace_state(convention="flax")

  def interceptor(next_fun, args, kwargs, context):
    module = context.module
    kind = _kind(module) if context.method_name == "__call__" else None
    if depth[0] or kind is None or module.scope is None:
      return next_fun(*args, **kwargs)
    path = "/".join(module.path)
    key = (path, counts[path])
    counts[path] += 1
    nested = jax_core.get_opaque_trace_state(convention="flax") != top
    depth[0] += 1
    try:
      return on_call(key, kind, module, nested, next_fun, args, kwargs)
    finally:
      depth[0] -= 1
  return nn.intercept_methods(interceptor)


def _single_loss(loss_fn: LossFn, params: PyTree, example: PyTree) -> jax.Array:
  # Exactly `clipping.per_example_grads`' per-example function.
  return loss_fn(params, jax.tree.map(lambda leaf: leaf[None], example))[0]


def _discover(loss_fn, treedef, leaf_avals, example_avals) -> list[_Call]:
  """All Dense / DenseGeneral / Conv / Conv2D / Embed calls of one example's loss, with static facts."""
  calls = []

  def fun(leaves, example):
    ids = {id(leaf): i for i, leaf in enumerate(leaves)}

    def on_call(key, kind, module, nested, next_fun, args, kwargs):
      x = _input(args, kwargs)
      variables = dict(module.variables.get("params", {}))
      params = {name: ids.get(id(v)) for name, v in variables.items()}
      reason = _config_reason(kind, module, x, variables)
      if all(i is None for i in params.values()):
        # E.g. inside nn.scan / nn.vmap, or under nn.map_variables.
        reason, params = "parameters are not leaves of params (lifted transform?)", {}
      elif any(i is None for i in params.values()):
        # Its leaves stay named (and counted as read by this call), so the dry run can say why.
        reason = ("some of its parameters are not leaves of params (not trained, "
                  f"{sorted(n for n, i in params.items() if i is None)})")
      if nested:
        reason = "called inside a JAX transform within the loss (lifted transform?)"
      y = next_fun(*args, **kwargs)
      # The output has the parameters' dtype (an Embed's input is integer).
      if reason is None and (not isinstance(y, jax.Array)
                             or y.dtype != jnp.result_type(variables[_weight_of(kind)])):
        reason = "unexpected output"
      # Only eligible calls keep a clone: others may hold this trace's values.
      calls.append(_Call(key=key, kind=kind,
                         module=module.clone(parent=None) if reason is None else None,
                         params={n: i for n, i in params.items() if i is not None},
                         out=jax.ShapeDtypeStruct(y.shape, y.dtype) if reason is None else None,
                         reason=reason))
      return y

    with _interceptor(on_call):
      return _single_loss(loss_fn, treedef.unflatten(leaves), example)

  jax.make_jaxpr(fun)(leaf_avals, example_avals)
  # A leaf read by two calls (a layer called twice, two layers sharing a
  # kernel) gets gradient terms from both: neither call may claim it.
  users = collections.Counter(i for c in calls for i in c.params.values())
  for c in calls:
    if c.reason is None and any(users[i] > 1 for i in c.params.values()):
      c.reason = "parameters shared with another Embed/Dense/Conv call"
  return calls


def _check_sole_use(loss_fn, treedef, leaf_avals, example_avals, calls: list[_Call]) -> None:
  """Marks eligible calls whose parameter leaves are used anywhere else.

  Traces the loss with each eligible call recomputed by its unbound clone
  from separate copies of its parameters; an original leaf that is still an
  input of any equation (or an output) is used outside its call, e.g. by a
  tied layer or a module reading another's variables.  Repeats until no
  remaining call is affected.
  """
  while True:
    eligible = {c.key: c for c in calls if c.reason is None}
    if not eligible:
      return
    copy_avals = {j: {n: leaf_avals[i] for n, i in c.params.items()}
                  for j, c in enumerate(eligible.values())}
    slot = {key: j for j, key in enumerate(eligible)}

    def fun(leaves, copies, example):
      seen = set()

      def on_call(key, kind, module, nested, next_fun, args, kwargs):
        del kind, module
        if key not in eligible:
          return next_fun(*args, **kwargs)
        if nested or key in seen:
          raise RuntimeError(_NOT_DETERMINISTIC)
        seen.add(key)
        return eligible[key].module.apply({"params": copies[slot[key]]}, _input(args, kwargs))

      with _interceptor(on_call):
        out = _single_loss(loss_fn, treedef.unflatten(leaves), example)
      if seen != set(eligible):
        raise RuntimeError(_NOT_DETERMINISTIC)
      return out

    jaxpr = jax.make_jaxpr(fun)(leaf_avals, copy_avals, example_avals).jaxpr
    leaf_vars = jaxpr.invars[:len(leaf_avals)]
    # Sub-jaxprs (pjit, cond, scan, custom_vjp ...) get outer values only as
    # operands of their equation, so the top level sees every use.
    used = {id(v) for eqn in jaxpr.eqns for v in eqn.invars if isinstance(v, jax_core.Var)}
    used |= {id(v) for v in jaxpr.outvars if isinstance(v, jax_core.Var)}
    changed = False
    for c in eligible.values():
      if any(id(leaf_vars[i]) in used for i in c.params.values()):
        c.reason = "a parameter is also used outside this call (tied weights?)"
        changed = True
    if not changed:
      return


class _Cost(NamedTuple):
  """One eligible call's per-example bytes on each path, and whether its ghost norm needs less work."""
  gradient_bytes: int  # its leaves' per-example gradients (the vmap path)
  ghost_bytes: int     # cotangents, a convolution's patches, and the Gram matrices or R^T G
  less_work: bool      # ||r||^2 ||g||^2 (T = 1) or the Gram form; the R^T G form is vmap's work and more


def _geometry(call: _Call, weight_shape: tuple) -> tuple[int, int, int]:
  """(T, d_in, d_out) of an eligible call: its positions, a row's length (1 for an Embed, whose
  rows are one-hot), and the size of its output features."""
  features = _feature_axes(call.kind, call.module)
  shape = call.out.shape  # one example's output (a batch of one)
  d_out = math.prod(shape[len(shape) - features:])
  t = math.prod(shape[:len(shape) - features])
  return t, 1 if call.kind == "Embed" else math.prod(weight_shape) // d_out, d_out


def _cost(call: _Call, leaf_avals: list) -> _Cost:
  weight = leaf_avals[call.params[_weight_of(call.kind)]]
  item = jnp.dtype(weight.dtype).itemsize
  t, d_in, d_out = _geometry(call, weight.shape)
  gradient_bytes = item * sum(math.prod(leaf_avals[i].shape) for i in call.params.values())
  if call.kind == "Embed":
    # The Gram form over token equality (T^2 d work) against a (V, d) gradient per example.
    return _Cost(gradient_bytes=gradient_bytes, ghost_bytes=item * (t * d_out + 2 * t * t + t),
                 less_work=t * t < weight.shape[0])
  gram = _uses_gram(t, d_in, d_out)
  norms = 0 if t == 1 else 2 * t * t if gram else d_in * d_out
  patches = t * d_in if call.kind in ("Conv", "Conv2D") else 0  # a Dense layer's rows are its input
  return _Cost(gradient_bytes=gradient_bytes, ghost_bytes=item * (t * d_out + patches + norms),
               less_work=t == 1 or gram)


def _choose(loss_fn, treedef, leaf_avals, example_avals, calls: list[_Call]) -> None:
  """`auto`: marks the eligible calls whose per-example gradients are the better path.

  A call keeps its ghost norm only if that needs both less memory and less
  work than its per-example gradient, and the calls kept must together save
  `AUTO_MIN_SAVING` of one example's working set on the vmap path
  (`microbatching.per_example_bytes`) unless that working set exceeds the
  device's microbatch budget on its own (`microbatching.budget_bytes`), where
  every byte saved counts. Otherwise the ghost path's own work (a
  convolution's patches rebuilt, a second sum per layer) buys no microbatch
  worth having, and every call falls back: the step is the vmap path.
  """
  eligible = [c for c in calls if c.reason is None]
  costs = {c.key: _cost(c, leaf_avals) for c in eligible}
  for c in eligible:
    cost = costs[c.key]
    if not cost.less_work or cost.ghost_bytes >= cost.gradient_bytes:
      c.reason = (f"auto: its per-example gradient ({cost.gradient_bytes:,} bytes) is cheaper than a "
                  f"ghost norm ({cost.ghost_bytes:,} bytes{'' if cost.less_work else ', more work'})")
  kept = [c for c in eligible if c.reason is None]
  if not kept:
    return
  saved = sum(costs[c.key].gradient_bytes - costs[c.key].ghost_bytes for c in kept)
  one = jax.tree.map(lambda a: jax.ShapeDtypeStruct((1,) + a.shape, a.dtype), example_avals)
  working_set = microbatching.per_example_bytes(loss_fn, treedef.unflatten(leaf_avals), one)
  if saved < AUTO_MIN_SAVING * working_set and working_set <= microbatching.budget_bytes():
    for c in kept:
      c.reason = (f"auto: ghost norms would save {saved:,} of an example's {working_set:,} bytes "
                  f"(< {AUTO_MIN_SAVING:.0%}); per-example gradients throughout")


def _analyse(loss_fn: LossFn, params: PyTree, batch: PyTree, auto: bool = False):
  """(calls, leaf paths, treedef) for one example's loss, from shapes only."""
  with_path, treedef = jax.tree_util.tree_flatten_with_path(params)
  names = [jax.tree_util.keystr(path) for path, _ in with_path]
  leaf_avals = [jax.ShapeDtypeStruct(jnp.shape(leaf), jnp.result_type(leaf)) for _, leaf in with_path]
  example_avals = jax.tree.map(
      lambda leaf: jax.ShapeDtypeStruct(jnp.shape(leaf)[1:], jnp.result_type(leaf)), batch)
  calls = _discover(loss_fn, treedef, leaf_avals, example_avals)
  _check_sole_use(loss_fn, treedef, leaf_avals, example_avals, calls)
  if auto:
    _choose(loss_fn, treedef, leaf_avals, example_avals, calls)
  return calls, names, treedef, leaf_avals


def ghost_layers(loss_fn: LossFn, params: PyTree, batch: PyTree, *, auto: bool = False) -> GhostSplit:
  """Which leaves `ghost_clipped_grad_sum` handles by ghost norms, and why others fall back.

  Only shapes are used (nothing is computed on the values), so `params` and
  `batch` may be `jax.ShapeDtypeStruct` trees.

  Args:
    loss_fn: per-example loss, as for `clipping.clipped_grad_sum`.
    params: parameter tree.
    batch: pytree of arrays with the examples on the leading axis.
    auto: apply the cost model of `Task(clipping="auto")` (see
      `ghost_clipped_grad_sum`); a layer it sends to per-example gradients
      says why in its `reason`, starting 'auto:'.

  Returns:
    The `GhostSplit`.

  Example:
    >>> import flax.linen as nn, jax, jax.numpy as jnp
    >>> model = nn.Dense(3)
    >>> params = model.init(jax.random.key(0), jnp.ones((1, 4)))
    >>> loss_fn = lambda p, x: jnp.sum(model.apply(p, x) ** 2, axis=-1)
    >>> ghost_layers(loss_fn, params, jnp.ones((8, 4))).fallback_leaves
    ()
  """
  calls, names, _, leaf_avals = _analyse(loss_fn, params, batch, auto)
  layers = tuple(GhostLayer(module=c.key[0], call=c.key[1], kind=c.kind,
                            leaves=tuple(names[i] for i in sorted(c.params.values())),
                            reason=c.reason) for c in calls)
  ghost = {i for c in calls if c.reason is None for i in c.params.values()}
  return GhostSplit(layers=layers,
                    ghost_leaves=tuple(n for i, n in enumerate(names) if i in ghost),
                    fallback_leaves=tuple(n for i, n in enumerate(names) if i not in ghost),
                    norm_bytes=sum(_cost(c, leaf_avals).ghost_bytes for c in calls if c.reason is None))


def _rows(call: _Call, x: jax.Array) -> jax.Array:
  """(b, T, d_in) rows R with y = R @ kernel.reshape(d_in, d_out) + bias, per example.

  x holds b examples' inputs, each shaped as the layer saw it.
  """
  b = x.shape[0]
  module = call.module
  if call.kind == "Dense":
    return x.reshape(b, -1, x.shape[-1])
  if call.kind == "DenseGeneral":
    # The contracted axes last, in the kernel's order: the output is the other axes, then features.
    axes = tuple(a + 1 for a in _contracted(module, x.ndim - 1))
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


def _uses_gram(t: int, d_in: int, d_out: int) -> bool:
  """sum_{t,s} (r_t . r_s)(g_t . g_s) (memory and work ~ T^2) rather than R^T G (~ d_in d_out)."""
  return t == 1 or t * (d_in + d_out) < d_in * d_out


class _KernelPart(NamedTuple):
  """One ghost call's kernel: its `NormBound` and what its clipped sum is built from."""
  bound: clipping.NormBound
  rows: Any         # (b, T, d_in) rows, scaled like `bound` (Gram forms), else None
  cots: Any         # (b, T, d_out) cotangents, scaled like `bound` (Gram forms), else None
  per_example: Any  # (b, d_in, d_out) R_i^T G_i (direct form), else None


def _kernel_part(call: _Call, inputs: jax.Array, cots: jax.Array, d_in: int) -> _KernelPart:
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
  if call.kind == "Embed" or (t > 1 and _uses_gram(t, d_in, d_out)):
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


def _token_rows(call: _Call, tokens: jax.Array) -> jax.Array:
  """(b, T) the table row each token reads, as the layer's `jnp.take` reads it (a negative id
  wraps), or -1 where it reads none (an id out of range: the lookup gives NaN)."""
  rows = jnp.arange(call.module.num_embeddings, dtype=jnp.int32)
  return jnp.take(rows, tokens.reshape(tokens.shape[0], -1), axis=0, mode="fill", fill_value=-1)


def _gram_part(call: _Call, inputs: jax.Array, cots: jax.Array) -> _KernelPart:
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
  calls, _, treedef, _ = _analyse(loss_fn, params, batch, auto)
  ghost_calls = [c for c in calls if c.reason is None]
  if not ghost_calls:
    return clipping.clipped_grad_sum(loss_fn, params, batch, mask, l2_clip_norm)
  leaves = jax.tree.leaves(params)
  b = mask.shape[0]
  ghost_idx = {i for c in ghost_calls for i in c.params.values()}
  fallback_idx = [i for i in range(len(leaves)) if i not in ghost_idx]
  inputs, fallback_grads, cots = _per_example_pieces(loss_fn, leaves, treedef, ghost_calls,
                                                     fallback_idx, batch)
  geometry = [_geometry(call, jnp.shape(leaves[call.params[_weight_of(call.kind)]])) for call in ghost_calls]
  cots = {j: c.reshape(b, -1, geometry[j][2]) for j, c in cots.items()}  # (b, T, d_out)
  kernels = [_kernel_part(call, inputs[j], cots[j], geometry[j][1]) for j, call in enumerate(ghost_calls)]
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
        raise RuntimeError(_NOT_DETERMINISTIC)
      inputs[slot[key]] = _input(args, kwargs)
      # The gradient w.r.t. a zero added to the output is the output cotangent G.
      return next_fun(*args, **kwargs) + perturbations[slot[key]]

    with _interceptor(on_call):
      loss = _single_loss(loss_fn, treedef.unflatten(full), example)
    if len(inputs) != len(ghost_calls):
      raise RuntimeError(_NOT_DETERMINISTIC)
    return loss, inputs

  perturbations = {j: jnp.zeros(c.out.shape, c.out.dtype) for j, c in enumerate(ghost_calls)}
  grad_fn = jax.value_and_grad(single, argnums=(0, 1), has_aux=True)
  (_, inputs), (fallback_grads, cots) = jax.vmap(grad_fn, in_axes=(None, None, 0))(
      [leaves[i] for i in fallback_idx], perturbations, batch)
  return inputs, fallback_grads, cots


def _add_kernel_sum(out: list, call: _Call, kernel: _KernelPart, scale: jax.Array, keep: jax.Array) -> None:
  """Writes one ghost call's clipped kernel sum into `out`: the book-keeping contraction
  sum_i R_i^T (s_i G_i) (Gram form) or the weighted sum of the materialised R_i^T G_i."""
  index = call.params[_weight_of(call.kind)]
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
