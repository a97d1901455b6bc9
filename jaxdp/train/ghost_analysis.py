"""Which layers of a loss take ghost clipping (`ghost_layers`): the structural analysis, at
trace time, on abstract values of one example, that `jaxdp.train.ghost` relies on.

A call qualifies only if it is made in the loss's own trace (not inside
nn.scan, nn.remat, jax.checkpoint ...), its parameters are leaves of
`params` (checked by identity), and no other call reads them; then, on a
jaxpr in which every qualifying call is recomputed from separate copies of
its parameters, the original parameter inputs must be unused.  A kernel that
is tied, read by another module or by the loss itself, or used by a layer
called twice therefore falls back: its gradient has other terms, which a
ghost norm would miss. With `auto`, ghost norms are kept only where they
shrink one example's working set (`AUTO_MIN_SAVING`).
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
NOT_DETERMINISTIC = ("loss_fn made different Embed/Dense/Conv calls when traced again; ghost clipping "
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
class Call:
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


def weight_of(kind: str) -> str:
  """The parameter whose ghost norm the call's form computes (the other, if any, is its bias)."""
  return "embedding" if kind == "Embed" else "kernel"


def _feature_axes(kind: str, module: nn.Module) -> int:
  """How many trailing axes of the call's output are its features (d_out is their size)."""
  if kind == "DenseGeneral":
    return len(module.features) if isinstance(module.features, (tuple, list)) else 1
  return 1


def contracted(module: nn.Module, ndim: int) -> tuple[int, ...]:
  """A DenseGeneral's contracted input axes, non-negative, in the kernel's order: ascending,
  whatever order `axis` names them in (flax sorts them)."""
  axis = module.axis if isinstance(module.axis, (tuple, list)) else (module.axis,)
  return tuple(sorted(a % ndim for a in axis))


def layer_input(args, kwargs):
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
      if 0 in contracted(module, x.ndim):
        return "contracts the example axis"
    return None
  if module.feature_group_count != 1:
    return "feature_group_count != 1"
  if module.mask is not None:
    return "masked kernel"
  if module.conv_general_dilated is not None or module.conv_general_dilated_cls is not None:
    return "custom conv_general_dilated"
  return None


def interceptor(on_call: Callable[..., Any]):
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


def single_loss(loss_fn: LossFn, params: PyTree, example: PyTree) -> jax.Array:
  # Exactly `clipping.per_example_grads`' per-example function.
  return loss_fn(params, jax.tree.map(lambda leaf: leaf[None], example))[0]


def _discover(loss_fn, treedef, leaf_avals, example_avals) -> list[Call]:
  """All Dense / DenseGeneral / Conv / Conv2D / Embed calls of one example's loss, with static facts."""
  calls = []

  def fun(leaves, example):
    ids = {id(leaf): i for i, leaf in enumerate(leaves)}

    def on_call(key, kind, module, nested, next_fun, args, kwargs):
      x = layer_input(args, kwargs)
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
                             or y.dtype != jnp.result_type(variables[weight_of(kind)])):
        reason = "unexpected output"
      # Only eligible calls keep a clone: others may hold this trace's values.
      calls.append(Call(key=key, kind=kind,
                         module=module.clone(parent=None) if reason is None else None,
                         params={n: i for n, i in params.items() if i is not None},
                         out=jax.ShapeDtypeStruct(y.shape, y.dtype) if reason is None else None,
                         reason=reason))
      return y

    with interceptor(on_call):
      return single_loss(loss_fn, treedef.unflatten(leaves), example)

  jax.make_jaxpr(fun)(leaf_avals, example_avals)
  # A leaf read by two calls (a layer called twice, two layers sharing a
  # kernel) gets gradient terms from both: neither call may claim it.
  users = collections.Counter(i for c in calls for i in c.params.values())
  for c in calls:
    if c.reason is None and any(users[i] > 1 for i in c.params.values()):
      c.reason = "parameters shared with another Embed/Dense/Conv call"
  return calls


def _check_sole_use(loss_fn, treedef, leaf_avals, example_avals, calls: list[Call]) -> None:
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
          raise RuntimeError(NOT_DETERMINISTIC)
        seen.add(key)
        return eligible[key].module.apply({"params": copies[slot[key]]}, layer_input(args, kwargs))

      with interceptor(on_call):
        out = single_loss(loss_fn, treedef.unflatten(leaves), example)
      if seen != set(eligible):
        raise RuntimeError(NOT_DETERMINISTIC)
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


def geometry(call: Call, weight_shape: tuple) -> tuple[int, int, int]:
  """(T, d_in, d_out) of an eligible call: its positions, a row's length (1 for an Embed, whose
  rows are one-hot), and the size of its output features."""
  features = _feature_axes(call.kind, call.module)
  shape = call.out.shape  # one example's output (a batch of one)
  d_out = math.prod(shape[len(shape) - features:])
  t = math.prod(shape[:len(shape) - features])
  return t, 1 if call.kind == "Embed" else math.prod(weight_shape) // d_out, d_out


def uses_gram(t: int, d_in: int, d_out: int) -> bool:
  """sum_{t,s} (r_t . r_s)(g_t . g_s) (memory and work ~ T^2) rather than R^T G (~ d_in d_out)."""
  return t == 1 or t * (d_in + d_out) < d_in * d_out


def _cost(call: Call, leaf_avals: list) -> _Cost:
  weight = leaf_avals[call.params[weight_of(call.kind)]]
  item = jnp.dtype(weight.dtype).itemsize
  t, d_in, d_out = geometry(call, weight.shape)
  gradient_bytes = item * sum(math.prod(leaf_avals[i].shape) for i in call.params.values())
  if call.kind == "Embed":
    # The Gram form over token equality (T^2 d work) against a (V, d) gradient per example.
    return _Cost(gradient_bytes=gradient_bytes, ghost_bytes=item * (t * d_out + 2 * t * t + t),
                 less_work=t * t < weight.shape[0])
  gram = uses_gram(t, d_in, d_out)
  norms = 0 if t == 1 else 2 * t * t if gram else d_in * d_out
  patches = t * d_in if call.kind in ("Conv", "Conv2D") else 0  # a Dense layer's rows are its input
  return _Cost(gradient_bytes=gradient_bytes, ghost_bytes=item * (t * d_out + patches + norms),
               less_work=t == 1 or gram)


def _choose(loss_fn, treedef, leaf_avals, example_avals, calls: list[Call]) -> None:
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


def analyse(loss_fn: LossFn, params: PyTree, batch: PyTree, auto: bool = False):
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
  calls, names, _, leaf_avals = analyse(loss_fn, params, batch, auto)
  layers = tuple(GhostLayer(module=c.key[0], call=c.key[1], kind=c.kind,
                            leaves=tuple(names[i] for i in sorted(c.params.values())),
                            reason=c.reason) for c in calls)
  ghost = {i for c in calls if c.reason is None for i in c.params.values()}
  return GhostSplit(layers=layers,
                    ghost_leaves=tuple(n for i, n in enumerate(names) if i in ghost),
                    fallback_leaves=tuple(n for i, n in enumerate(names) if i not in ghost),
                    norm_bytes=sum(_cost(c, leaf_avals).ghost_bytes for c in calls if c.reason is None))
