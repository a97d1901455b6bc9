"""The pure programs of one candidate, and their compilation.

`LoopSpec` is everything static about a run (task, static hyperparameters,
data structure, q, T, padding, microbatch): equal specs share one compiled
program. `build_loop` is the DP training loop as two pure, jittable
functions with every shape static: `begin` (the `LoopState` at step 0) and
`advance` (the steps from the state's step up to a traced stop), so one
compiled step runs a candidate in one segment or in many (checkpoints,
`jaxdp.sweep.checkpoints`) with the same result. Every run executes
`run_segment`, one program that lone and batched runs share: the
initialisation when fresh (`start_candidate`), the steps up to a traced stop
(`advance_candidate`), and the scores once the stop is the last step
(`finish_candidate`); the sweep engine `jax.vmap`s it over a candidate axis of
plans, hyperparameters, keys and states. Compiled programs and executables
are kept in bounded `jaxdp._cache.LruCache`s.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any, Callable, Mapping, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdp._cache import LruCache
from jaxdp.train import compilation_cache
from jaxdp.train import padding
from jaxdp.train import trainable as trainable_lib
from jaxdp.train.plan import DpSgdPlan
from jaxdp.train.loop_spec import device_dtype, abstract, structure, LoopSpec

PyTree = Any


class LoopOutput(NamedTuple):
  """Result of the inner loop."""
  params: PyTree
  steps: jax.Array      # steps actually run (int32)
  finite: jax.Array     # False if the parameters became non-finite (diverged)


class LoopState(NamedTuple):
  """Everything the DP training loop carries from one step to the next.

  `step`, `trained`, `opt_state` and `finite` are what a checkpoint holds
  (`jaxdp.sweep.checkpoints`): with the run's key they determine every later
  step. The optimizer state holds the noise transform's PRNG key, split on
  every step, and the Poisson sample of step t is drawn from the loop key
  folded with t, so a loop continued from a saved state draws the samples
  and noise of the uninterrupted run. PRNG keys are stored as their raw key
  data (`jax.random.key_data`), so the state is plain arrays that a host can
  copy and write. `frozen` (the parameters not trained) is a function of the
  key and the public start only: a resume recomputes it instead of storing it.
  """
  step: jax.Array       # steps done (int32)
  trained: PyTree
  opt_state: PyTree     # PRNG keys as key data
  finite: jax.Array     # False once the parameters became non-finite
  frozen: PyTree


#: The fields of a `LoopState` a checkpoint stores (the rest is recomputed).
SAVED_FIELDS = ("step", "trained", "opt_state", "finite")


def _zero_row(tree: PyTree) -> PyTree:
  """One all-zero example shaped like the rows of `tree` (which may hold none)."""
  return jax.tree.map(lambda leaf: jnp.zeros((1,) + tuple(np.shape(leaf)[1:]), device_dtype(leaf)), tree)


def init_params(spec: LoopSpec, key: jax.Array, train: PyTree) -> PyTree:
  """Initial parameters: they depend on the key and the inputs' shapes only.

  The init batch is built from the data's structure (one zero row), never
  from its rows, so training data with zero rows initialises as any other.
  `train` may be a `padding.PaddedRows`.
  """
  model = spec.model()
  return model.init(key, spec.task.model_inputs(_zero_row(padding.rows_of(train))))


def param_shapes(spec: LoopSpec, train: PyTree) -> PyTree:
  """The parameter tree's structure, shapes and dtypes (`jax.ShapeDtypeStruct` leaves), untraced."""
  return jax.eval_shape(functools.partial(init_params, spec), jax.random.key(0), train)


def _all_finite(tree: PyTree) -> jax.Array:
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(tree)]))


def _take(tree: PyTree, idx: jax.Array) -> PyTree:
  return jax.tree.map(lambda leaf: leaf[idx], tree)


def _is_key(leaf) -> bool:
  return jax.dtypes.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key)


def _raw_keys(tree: PyTree) -> PyTree:
  return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


def _typed_keys(raw: PyTree, like: PyTree) -> PyTree:
  """`raw` with the leaves that are PRNG keys in `like` (same structure) wrapped back."""
  return jax.tree.map(lambda r, x: jax.random.wrap_key_data(r, impl=jax.random.key_impl(x))
                      if _is_key(x) else r, raw, like)


def build_loop(spec: LoopSpec, *, axis_name: Optional[str] = None) -> tuple:
  """The pure DP training loop of `spec` in two parts (not jitted; jit or vmap them).

  Returns:
    (begin, advance):
      begin(params, plan, traced_hparams, key) -> LoopState at step 0;
      advance(state, plan, traced_hparams, key, train, stop) -> LoopState:
        the Poisson-sampled DP steps from `state.step` up to `min(stop,
        plan.num_steps)`, stopping early only if the parameters become
        non-finite. `stop` may be traced: one compiled `advance` runs any
        segment of the run.
    `plan` is a `DpSgdPlan` whose static fields equal the spec's (its C and
    sigma may be traced); `key` is the loop's key, the same in every call.

  Guarantees:
    Step t reads only the state after step t - 1 and (key, t): running the
    steps in segments, in one process or across a checkpoint and a resume,
    runs the same steps as one call, with the same compiled step (the same
    bits on the same machine). See `build_train_loop` for `axis_name`.
  """
  task = spec.task
  loss = task.per_example_loss(spec.model())

  def optimizer(plan: DpSgdPlan, traced, key, frozen):
    _, noise_key = jax.random.split(key)
    # Only the trainable leaves are differentiated, clipped, noised and updated;
    # the frozen ones enter the loss as constants (jaxdp.train.trainable).
    clipped = plan.clipped_grad(trainable_lib.partial_loss(loss, frozen), method=task.clipping)
    return clipped, optax.chain(plan.privatizer(clipped, noise_key),
                                task.optimizer_for(spec.hparams(traced)))

  def begin(params, plan: DpSgdPlan, traced: Mapping[str, jax.Array], key) -> LoopState:
    trained, frozen = trainable_lib.partition(params, task.trainable_mask(params))
    _, opt = optimizer(plan, traced, key, frozen)
    return LoopState(step=jnp.int32(0), trained=trained, opt_state=_raw_keys(opt.init(trained)),
                     finite=_all_finite(trained), frozen=frozen)

  def advance(state: LoopState, plan: DpSgdPlan, traced: Mapping[str, jax.Array], key, train,
              stop) -> LoopState:
    sample_key, _ = jax.random.split(key)
    # jaxdp's own callers pass a `PaddedRows` (num_rows the public capacity, real_rows its mask).
    rows, real_rows = padding.rows_of(train), padding.mask_of(train)
    num_rows = jax.tree.leaves(rows)[0].shape[0]  # static; never a normaliser
    # Zero rows (possible only unpadded) is a valid input: nobody is sampled,
    # every microbatch row is padding (valid False), and the gather needs a
    # row to read: one zero row, never sampled. Each step then sums no
    # gradient and adds the noise, the mechanism on the empty data set.
    rows = rows if num_rows else _zero_row(rows)
    clipped, opt = optimizer(plan, traced, key, state.frozen)
    # Where the state's raw key data are PRNG keys, and of which implementation:
    # a fresh init's (traced for its types: XLA drops what nothing reads).
    like = opt.init(state.trained)
    last = jnp.minimum(jnp.asarray(stop, jnp.int32), plan.num_steps)

    def body(carry):
      step, trained, opt_state, _ = carry
      grad_sum, _ = plan.batch_sum(
          jax.random.fold_in(sample_key, step), lambda idx, valid: clipped(trained, _take(rows, idx), valid),
          num_rows=num_rows, padded_batch_size=spec.padded_batch_size,
          microbatch_size=spec.microbatch_size, axis_name=axis_name, real_rows=real_rows)
      # grad_sum is the whole batch's clipped sum on every device: the noise
      # below is added once to it (same key everywhere), never per share.
      updates, opt_state = opt.update(grad_sum, opt_state, trained)
      trained = optax.apply_updates(trained, updates)
      return step + 1, trained, opt_state, _all_finite(trained)

    def cond(carry):
      step, _, _, finite = carry
      return (step < last) & finite

    step, trained, opt_state, finite = jax.lax.while_loop(
        cond, body, (state.step, state.trained, _typed_keys(state.opt_state, like), state.finite))
    return state._replace(step=step, trained=trained, opt_state=_raw_keys(opt_state), finite=finite)

  return begin, advance


def build_train_loop(spec: LoopSpec, *, axis_name: Optional[str] = None) -> Callable[..., LoopOutput]:
  """The pure inner DP training loop for `spec` (not jitted; jit or vmap it).

  Args:
    spec: the static structure of the run.
    axis_name: None (default): the loop runs on one device. Otherwise the
      name of a `jax.shard_map` mesh axis over which each step's batch is
      shared out (data parallelism); every argument must then be the same on
      every device of that axis (replicated).

  Returns:
    loop(params, plan, traced_hparams, key, train) -> LoopOutput. It runs
    `plan.num_steps` Poisson-sampled DP steps, stopping early only if the
    parameters become non-finite. `plan` is a `DpSgdPlan` whose static fields
    equal the spec's; its C and sigma may be traced. It is `build_loop`'s
    begin and one advance to the end.

  Guarantees:
    With `axis_name` the mechanism is the one of a single device. The devices
    draw the same Poisson sample, each clips and sums the per-example
    gradients of its own disjoint share of the sampled microbatches, and the
    shares are added (`psum`, in `plan.batch_sum`) before the noise. The
    privatizer then runs on the summed gradient, identical on every device,
    with the same noise key on every device: it draws the same N(0, (sigma
    C)^2) noise everywhere, i.e. one draw per step, not one per device, and
    every device applies the same update. The parameters stay replicated,
    and what is released is one DP-SGD run of `plan` (`plan.dp_event()`):
    only the order of float additions in the clipped sum differs from one
    device.
  """
  begin, advance = build_loop(spec, axis_name=axis_name)

  def loop(params, plan: DpSgdPlan, traced: Mapping[str, jax.Array], key, train) -> LoopOutput:
    state = advance(begin(params, plan, traced, key), plan, traced, key, train, plan.num_steps)
    return output(state)

  return loop


def build_outputs(spec: LoopSpec) -> Callable[[PyTree, PyTree], Any]:
  """(params, batch) -> model outputs on every example, in chunks of `eval_batch_size`."""
  model = spec.model()
  task = spec.task

  def outputs(params, batch):
    n = jax.tree.leaves(batch)[0].shape[0]
    b = min(spec.eval_batch_size, n)
    chunks = math.ceil(n / b)
    pad = chunks * b - n
    inputs = task.model_inputs(batch)

    def chunked(x):
      x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
      return x.reshape((chunks, b) + x.shape[1:])

    out = jax.lax.map(lambda xb: model.apply(params, xb), jax.tree.map(chunked, inputs))
    return jax.tree.map(lambda o: o.reshape((chunks * b,) + o.shape[2:])[:n], out)

  return outputs


def build_evaluate(spec: LoopSpec) -> Callable[..., tuple[jax.Array, jax.Array]]:
  """Pure public scoring: (params, test batch) -> (the task's public score, mean loss)."""
  task = spec.task
  outputs = build_outputs(spec)

  def evaluate(params, batch):
    out = outputs(params, batch)
    losses = task.loss(out, batch)
    losses = losses[0] if task.has_aux else losses
    return jnp.asarray(task.public_score(out, batch), jnp.float32), jnp.mean(losses)

  return evaluate


def build_private_score(spec: LoopSpec) -> Callable[..., jax.Array]:
  """Pure DP scoring: (params, private validation batch, key) -> the noisy score. A padded
  batch (`padding.PaddedRows`, a `NoisyMean` score's) is scored on its real rows only."""
  task = spec.task
  outputs = build_outputs(spec)

  def score(params, batch, key):
    rows, mask = padding.rows_of(batch), padding.mask_of(batch)
    out = outputs(params, rows)
    noisy = task.score(out, rows, key) if mask is None else task.score(out, rows, key, mask=mask)
    return jnp.asarray(noisy, jnp.float32)

  return score


def score_key(key: jax.Array) -> jax.Array:
  """The key of a candidate's DP score, independent of its init and loop keys."""
  return jax.random.fold_in(key, 0x5C0E)


def start_candidate(spec: LoopSpec, plan: DpSgdPlan, traced, key, train, initial=None) -> LoopState:
  """A candidate's initialisation: its `LoopState` at step 0.

  `initial`: None, or a tree shaped like the parameters (`check_initial_params`)
  whose non-None leaves replace the initialisation (a checkpoint, a
  pretrained backbone); the key is split the same either way.
  """
  init_key, loop_key = jax.random.split(key)
  params = init_params(spec, init_key, train)
  if initial is not None:
    params = trainable_lib.combine(initial, params)
  begin, _ = build_loop(spec)
  return begin(params, plan, traced, loop_key)


def advance_candidate(spec: LoopSpec, plan: DpSgdPlan, traced, key, train, state: LoopState, stop,
                      *, axis_name: Optional[str] = None) -> LoopState:
  """A candidate's DP steps from `state.step` up to `stop` (`build_loop`'s advance)."""
  _, loop_key = jax.random.split(key)
  _, advance = build_loop(spec, axis_name=axis_name)
  return advance(state, plan, traced, loop_key, train, stop)


def finish_candidate(spec: LoopSpec, state: LoopState, key, test, validation):
  """A trained candidate's scores: (LoopOutput, score, test score, test loss); the scores are
  NaN where their split is None. With data parallelism every device scores the same
  parameters with the same key."""
  out = output(state)
  nan = jnp.float32(jnp.nan)
  test_score, test_loss = build_evaluate(spec)(out.params, test) if test is not None else (nan, nan)
  if spec.task.private_score:
    score = build_private_score(spec)(out.params, validation, score_key(key))
  else:
    score = test_score
  return out, score, test_score, test_loss


def run_candidate(spec: LoopSpec, plan: DpSgdPlan, traced, key, train, test, validation, initial=None,
                  *, axis_name: Optional[str] = None):
  """Init, train, then score: what `run_segment` computes when it runs a candidate in one
  segment from step 0, as one function of the candidate's inputs (what
  `jaxdp.train.digest.program_digest` traces).

  `axis_name`: see `build_train_loop` (data parallelism over that mesh axis).

  Returns:
    (LoopOutput, score, test score, test loss); the scores are NaN where
    their split is None.
  """
  state = start_candidate(spec, plan, traced, key, train, initial)
  state = advance_candidate(spec, plan, traced, key, train, state, plan.num_steps, axis_name=axis_name)
  return finish_candidate(spec, state, key, test, validation)


def run_segment(spec: LoopSpec, plan: DpSgdPlan, traced, key, train, test, validation, initial,
                state: LoopState, fresh, stop, *, axis_name: Optional[str] = None):
  """One segment of a candidate's run: the one program every run executes, lone or batched,
  in one segment or in many (checkpoints).

  Args:
    spec, plan, traced, key, train, test, validation, initial: as in `run_candidate`.
    state: where the segment starts (ignored when `fresh`): a `LoopState`
      from an earlier segment or a checkpoint, or `empty_state` with `fresh`.
      Its `frozen` is ignored too: the frozen parameters are always the
      initialisation's.
    fresh: True to start from the candidate's initialisation (step 0).
    stop: the step the segment runs to (traced: one compilation runs any segment).

  Returns:
    (the `LoopState` after the segment, (score, test score, test loss)). The
    scores are computed only by the segment that reaches the planned T
    (`stop >= spec.num_steps`), NaN before.
  """
  # The frozen parameters are a function of the key and the public start: never stored, always
  # taken from the initialisation (a restored state's are the empty state's zeros).
  begun = start_candidate(spec, plan, traced, key, train, initial)
  state = jax.lax.cond(fresh, lambda s: begun, lambda s: s._replace(frozen=begun.frozen), state)
  state = advance_candidate(spec, plan, traced, key, train, state, stop, axis_name=axis_name)
  nan = jnp.float32(jnp.nan)
  scores = jax.lax.cond(jnp.asarray(stop) >= spec.num_steps,
                        lambda s: finish_candidate(spec, s, key, test, validation)[1:],
                        lambda s: (nan, nan, nan), state)
  return state, scores


def output(state: LoopState) -> LoopOutput:
  """The `LoopOutput` of a finished run's state (its parameters: trained and frozen together)."""
  return LoopOutput(params=trainable_lib.combine(state.trained, state.frozen), steps=state.step,
                    finite=state.finite)


_STATE_SHAPES = LruCache(32)


def empty_state(spec: LoopSpec, train: PyTree, rows: Optional[int] = None,
                key_dtype=None) -> LoopState:
  """A `LoopState` of zeros shaped like a candidate's (a leading axis of `rows` if given): what
  `run_segment` takes with `fresh` (traced once per spec and PRNG implementation, for its
  shapes: the noise key in the state is as wide as the candidate's key, `key_dtype`, by default
  the default implementation's)."""
  key_dtype = jax.random.key(0).dtype if key_dtype is None else key_dtype
  def shapes():
    scalar = jax.ShapeDtypeStruct((), jnp.float32)
    plan = jax.tree.map(lambda _: scalar, DpSgdPlan(
        l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=spec.sampling_prob,
        num_steps=spec.num_steps, num_examples=spec.num_examples))
    traced = {name: scalar for name in spec.traced_names}
    return jax.eval_shape(functools.partial(start_candidate, spec), plan, traced,
                          jax.ShapeDtypeStruct((), key_dtype), abstract(train))
  lead = () if rows is None else (rows,)
  return jax.tree.map(lambda x: np.zeros(lead + tuple(x.shape), x.dtype),
                      _STATE_SHAPES.get_or_build((spec, structure(train), str(key_dtype)), shapes))


class Programs(NamedTuple):
  """The jitted programs of one `LoopSpec`: what `train_candidate` runs."""
  init_params: Callable
  segment: Callable


_PROGRAMS = LruCache(32)


def compiled(spec: LoopSpec) -> Programs:
  """The jitted `Programs` of `spec`: one set per spec."""
  return _PROGRAMS.get_or_build(spec, lambda: Programs(
      jax.jit(functools.partial(init_params, spec)), jax.jit(functools.partial(run_segment, spec))))


_EXECUTABLES = LruCache(64)


def _signature(args: tuple) -> tuple:
  leaves, treedef = jax.tree.flatten(args)
  return treedef, tuple((np.shape(x), str(getattr(x, "dtype", type(x).__name__)),
                         getattr(x, "sharding", None)) for x in leaves)


def compile_cached(jitted, args: tuple, *, persist: bool = True):
  """(`jitted` compiled ahead of time for `args`, seconds spent compiling now).

  Executables are kept per (function, argument shapes, dtypes and
  shardings); a cached one reports 0.0 seconds. Across processes, JAX's
  persistent cache (`jaxdp.train.compilation_cache`) makes a compilation a
  read; the program is written there only with `persist`, which a caller
  gives only when every private split in `args` is padded to its public
  capacity (`padding.persistable`).
  """
  memo = (jitted, _signature(args))
  executable = _EXECUTABLES.get(memo)
  if executable is not None:
    return executable, 0.0
  with compilation_cache.writing(persist):  # a program an earlier process compiled is read
    start = time.perf_counter()
    executable = jitted.lower(*args).compile()
    seconds = time.perf_counter() - start
  _EXECUTABLES.put(memo, executable)
  return executable, seconds
