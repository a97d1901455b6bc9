"""One DP-SGD candidate run of any `Task`: config, pure inner loop, thin wrapper.

The inner loop (`build_train_loop`) is a pure, jittable function of
(params, DpSgdPlan, traced hyperparameters, key, training batch pytree) with
every shape static, so a sweep engine can `jax.vmap` it over a candidate axis
of plans, hyperparameters and keys. `train_candidate` only validates,
compiles (cached per static structure), runs, scores and accounts.

Privacy: every step samples each training example independently with
probability q and processes all of them (see `jaxdp.train.sampling`); the
accounted event is `config.dp_event(N)`, built from the same `DpSgdPlan` that
clips, noises, samples and counts the steps (plus the DP score's event when
the task scores privately). A run that diverges stops early; its reported
epsilon is still that of the planned number of steps, which upper-bounds what
ran (the stopping time depends only on the privatised parameters). The
training set size N is a declared public input (`Dataset.num_examples`),
never read from the rows: every update is divided by the expected batch size
q*N, and an expected `batch_size` b means q = b/N, whatever number of rows
the data holds (README, "Privacy assumptions"). A config with noise_multiplier = 0 is not private at
all (epsilon = inf) and warns with `NotPrivateWarning` when it is built.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
import warnings
from typing import Any, Callable, Mapping, NamedTuple, Optional

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import optax
from dp_accounting import rdp

from jaxdp import _validate
from jaxdp.accounting import events as acc_events
from jaxdp.data import Dataset
from jaxdp.train import microbatching
from jaxdp.train.plan import DpSgdPlan
from jaxdp.train.sampling import default_padded_batch_size, validate_batch_sizes
from jaxdp.train.task import HParams, Task, check_scalar, real_hparam

PyTree = Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExecutionConfig:
  """Performance-only settings: they never change what is computed or its privacy.

  Attributes:
    padded_batch_size: rows processed on the common path per step; None picks
      qN + 4 std of Binomial(N, q).  Larger sampled batches are still fully
      processed by extra microbatches.
    microbatch_size: rows per vectorised per-example-gradient call (bounds
      memory); None chooses it from the model and the device
      (`jaxdp.train.microbatching`: about `budget_bytes(device)` per
      microbatch, the padded batch split into the fewest equal parts within
      it). It changes only the order of a sum, never what is computed.
    eval_batch_size: rows per model call when scoring.
  """
  padded_batch_size: int | None = None
  microbatch_size: int | None = None
  eval_batch_size: int = 1000

  def __post_init__(self):
    if self.padded_batch_size is not None:
      _validate.integer("padded_batch_size", self.padded_batch_size, low=1)
    if self.microbatch_size is not None:
      _validate.integer("microbatch_size", self.microbatch_size, low=1)
    if self.padded_batch_size is not None and self.microbatch_size is not None:
      validate_batch_sizes(self.padded_batch_size, self.microbatch_size)
    _validate.integer("eval_batch_size", self.eval_batch_size, low=1)


class NotPrivateWarning(UserWarning):
  """A configuration adds no noise: its runs are not differentially private (epsilon = inf)."""


#: TrainConfig fields that a grid may vary by name; every other grid name is a
#: hyperparameter of the task (`TrainConfig.hparams`).
CONFIG_FIELDS = ("l2_clip_norm", "noise_multiplier", "sampling_prob", "batch_size", "steps",
                 "epochs", "target_delta")
_EXCLUSIVE = {"steps": "epochs", "epochs": "steps", "sampling_prob": "batch_size",
              "batch_size": "sampling_prob"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
  """One candidate: the task, its privacy parameters and its hyperparameters.

  Privacy-relevant (they determine the DpEvent and hence epsilon):
    l2_clip_norm: per-example clip norm C > 0, the sensitivity of the summed
      gradient (with sigma it sets the noise std sigma*C; it does not change
      epsilon).
    noise_multiplier: sigma >= 0. sigma = 0 adds no noise: the run is not
      differentially private (epsilon = inf) and construction warns with a
      `NotPrivateWarning`; useful only as a non-private baseline.
    sampling_prob / batch_size: exactly one: the Poisson rate q in (0, 1], or
      the expected batch size b > 0 with q = b / N (N: the declared public
      `Dataset.num_examples`).
    steps / epochs: exactly one; steps = ceil(epochs / q) (`jaxdp.accounting.dpsgd_steps`).
    target_delta: delta in (0, 1) at which epsilon is reported.

  Everything else (post-processing, no privacy cost):
    task: the `jaxdp.train.Task` (model, loss, score, optimizer factory);
      `jaxdp.train.presets.classifier` gives the papers' models.
    hparams: name -> value, read by the task's model and optimizer factories
      (learning rate, weight decay, any optimizer argument, model width, ...).
      Floats the model does not read are traced (vmapped within one compiled
      group); the rest are static. A name the task never reads is an error.
    execution: an `ExecutionConfig`.
  """
  task: Task
  l2_clip_norm: float
  noise_multiplier: float
  sampling_prob: float | None = None
  batch_size: float | None = None
  steps: int | None = None
  epochs: float | None = None
  target_delta: float = 1e-5
  hparams: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  execution: ExecutionConfig = dataclasses.field(default_factory=ExecutionConfig)

  def __post_init__(self):
    if not isinstance(self.task, Task):
      raise ValueError(f"task must be a jaxdp.train.Task (e.g. jaxdp.train.presets.classifier(10)), "
                       f"got {type(self.task).__name__}")
    _validate.real("l2_clip_norm", self.l2_clip_norm, low=0.0, low_open=True)
    _validate.real("noise_multiplier", self.noise_multiplier, low=0.0)
    if self.noise_multiplier == 0:
      # Legal (non-private baselines, exact-GD checks) but never what a DP
      # user means: epsilon is inf and nothing downstream would say so.
      warnings.warn("noise_multiplier=0: this configuration adds no noise, so its training is NOT "
                    "differentially private (epsilon = inf)", NotPrivateWarning, stacklevel=3)
    if (self.sampling_prob is None) == (self.batch_size is None):
      raise ValueError(f"exactly one of sampling_prob and batch_size must be given, got "
                       f"sampling_prob={self.sampling_prob!r}, batch_size={self.batch_size!r}")
    if self.sampling_prob is not None:
      _validate.probability("sampling_prob", self.sampling_prob, one_ok=True)
    else:
      _validate.real("batch_size", self.batch_size, low=0.0, low_open=True)
    if (self.steps is None) == (self.epochs is None):
      raise ValueError(f"exactly one of steps and epochs must be given, got "
                       f"steps={self.steps!r}, epochs={self.epochs!r}")
    if self.steps is not None:
      _validate.integer("steps", self.steps, low=1)
    else:
      _validate.real("epochs", self.epochs, low=0.0, low_open=True)
    _validate.probability("target_delta", self.target_delta)
    if not isinstance(self.hparams, Mapping) or not all(isinstance(k, str) for k in self.hparams):
      raise ValueError(f"hparams must be a mapping name -> value, got {self.hparams!r}")
    clash = sorted(set(self.hparams) & set(CONFIG_FIELDS + ("task", "execution", "hparams")))
    if clash:
      raise ValueError(f"hparams must not name TrainConfig fields {clash}; set them as fields")
    object.__setattr__(self, "hparams", {k: real_hparam(k, v) for k, v in self.hparams.items()})
    if not isinstance(self.execution, ExecutionConfig):
      raise ValueError(f"execution must be an ExecutionConfig, got {self.execution!r}")
    check_hparams(self.task, self.hparams)

  def replace(self, **changes) -> "TrainConfig":
    """A copy with fields and/or hyperparameters changed, by name.

    Config fields are replaced (setting `steps` clears `epochs`, `batch_size`
    clears `sampling_prob`, and the reverse); any other name sets a
    hyperparameter.
    """
    fields = {k: v for k, v in changes.items()
              if k in CONFIG_FIELDS or k in ("task", "hparams", "execution")}
    for name in list(fields):
      if name in _EXCLUSIVE and name not in (_EXCLUSIVE[name],) and _EXCLUSIVE[name] not in fields:
        fields[_EXCLUSIVE[name]] = None
    hparams = dict(fields.pop("hparams", self.hparams))
    hparams.update({k: v for k, v in changes.items()
                    if k not in fields and k not in _EXCLUSIVE and k != "hparams"})
    return dataclasses.replace(self, hparams=hparams, **fields)

  def value(self, name: str) -> Any:
    """A config field or hyperparameter by name (what a grid point names)."""
    if name in CONFIG_FIELDS:
      return getattr(self, name)
    return self.hparams[name]

  def sampling_prob_for(self, num_examples: Optional[int] = None) -> float:
    """q; with `batch_size` it is batch_size / N and needs N."""
    if self.sampling_prob is not None:
      return float(self.sampling_prob)
    if num_examples is None:
      raise ValueError(f"batch_size={self.batch_size!r} sets q = batch_size / N: pass num_examples "
                       "(the declared public training set size, Dataset.num_examples)")
    n = _validate.integer("num_examples", num_examples, low=1)
    if self.batch_size > n:
      raise ValueError(f"batch_size must be in (0, N] with N={n} (declared) training examples, "
                       f"got {self.batch_size!r}")
    return float(self.batch_size) / n

  def num_steps_for(self, num_examples: Optional[int] = None) -> int:
    """Planned number of DP steps T (with epochs: ceil(epochs / q))."""
    if self.steps is not None:
      return int(self.steps)
    return acc_events.dpsgd_steps(self.epochs, self.sampling_prob_for(num_examples))

  @property
  def num_steps(self) -> int:
    """Planned DP steps (configs given by sampling_prob or steps; else `num_steps_for(N)`)."""
    return self.num_steps_for(None)

  def plan(self, num_examples: Optional[int] = None) -> DpSgdPlan:
    """The run's `DpSgdPlan` on a training set of `num_examples` examples.

    N may be omitted only for accounting a config given by `sampling_prob`
    (training always knows it).
    """
    n = None if num_examples is None else _validate.integer("num_examples", num_examples, low=1)
    return DpSgdPlan(l2_clip_norm=float(self.l2_clip_norm), noise_multiplier=float(self.noise_multiplier),
                     sampling_prob=self.sampling_prob_for(n), num_steps=self.num_steps_for(n),
                     num_examples=n)

  def dp_event(self, num_examples: Optional[int] = None) -> dp_accounting.DpEvent:
    """The candidate's DpEvent: its training (and its DP score's event, composed).

    Built by the same `DpSgdPlan` the trainer runs; `num_examples` is needed
    only when the config gives `batch_size` (q = batch_size / N).
    """
    train = self.plan(num_examples).dp_event()
    score = self.task.score_event
    return train if score is None else dp_accounting.ComposedDpEvent([train, score])

  def epsilon(self, num_examples: Optional[int] = None) -> float:
    """Epsilon of one candidate at `target_delta` (dp-accounting's RDP accountant)."""
    return epsilon(self, num_examples)


def check_hparams(task: Task, hparams: Mapping[str, Any]) -> None:
  """Builds the task's model and optimizer on concrete values; every name must be read.

  Raises:
    ValueError: a factory fails for these values, or a hyperparameter is read
      by neither factory (naming it), before anything trains.
  """
  tracked = HParams(hparams)
  what = "model"
  try:
    task.model_for(tracked)
    what = "optimizer"
    task.optimizer_for(tracked)
  except ValueError as err:
    raise ValueError(f"task {task.name!r}: the {what} factory rejects hyperparameters {hparams}: "
                     f"{err}") from err
  except Exception as err:  # a user's factory may raise anything
    raise ValueError(f"task {task.name!r}: the {what} factory fails for hyperparameters {hparams}: "
                     f"{type(err).__name__}: {err}") from err
  unread = sorted(set(hparams) - tracked.read)
  if unread:
    raise ValueError(f"hyperparameter(s) {unread} are not read by task {task.name!r} (its model and "
                     f"optimizer factories read {sorted(tracked.read & set(hparams))}); tuning them "
                     "would change nothing. Remove them or use them in the task")


def dp_event(config: TrainConfig, num_examples: Optional[int] = None) -> dp_accounting.DpEvent:
  """`config.dp_event(num_examples)`: see `TrainConfig.dp_event`."""
  return config.dp_event(num_examples)


def epsilon(config: TrainConfig, num_examples: Optional[int] = None) -> float:
  """Epsilon of the run at `config.target_delta` by the RDP accountant (inf if sigma=0)."""
  event = config.dp_event(num_examples)
  try:
    return _epsilon_of_event(event, float(config.target_delta))
  except TypeError:  # a ComposedDpEvent holds a list: unhashable, so not cached
    return _epsilon_of_event.__wrapped__(event, float(config.target_delta))


# Sweeps ask for the same few events thousands of times.
@functools.lru_cache(maxsize=1024)
def _epsilon_of_event(event: dp_accounting.DpEvent, delta: float) -> float:
  return float(rdp.RdpAccountant().compose(event).get_epsilon(delta))


def _device_dtype(leaf) -> np.dtype:
  """The dtype `jnp.asarray(leaf)` will have (float64 -> float32 without x64)."""
  return jax.dtypes.canonicalize_dtype(leaf.dtype)


def _abstract(tree: PyTree, rows: Optional[int] = None) -> PyTree:
  """ShapeDtypeStructs of `tree` as it will be on device (leading axis `rows` if given)."""
  return jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(
      np.shape(leaf) if rows is None else (rows,) + np.shape(leaf)[1:], _device_dtype(leaf)), tree)


def _structure(tree: PyTree) -> tuple:
  return (jax.tree.structure(tree),
          tuple((tuple(np.shape(x)[1:]), str(_device_dtype(x))) for x in jax.tree.leaves(tree)))


def _hashable_items(task: Task, values: Mapping[str, Any]) -> tuple:
  items = tuple(sorted(values.items()))
  try:
    hash(items)
  except TypeError:
    bad = [k for k, v in items if not _is_hashable(v)]
    raise ValueError(f"static hyperparameter(s) {bad} of task {task.name!r} must be hashable (they "
                     "key the compiled programs)") from None
  return items


def _is_hashable(value) -> bool:
  try:
    hash(value)
    return True
  except TypeError:
    return False


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopSpec:
  """Everything static about the inner loop: equal specs share one compilation.

  Attributes:
    task: the `Task` (compared by identity).
    static_hparams: sorted (name, value) pairs of the static hyperparameters.
    traced_names: names of the traced hyperparameters (vmapped arrays).
    train_structure: pytree structure, per-example shapes and dtypes of the
      training data.
    num_examples: N, the declared (public) training set size.
    sampling_prob: q.
    num_steps: planned steps.
    padded_batch_size: rows on the common path.
    microbatch_size: rows per per-example-gradient call.
    eval_batch_size: rows per model call when scoring.
  """
  task: Task
  static_hparams: tuple
  traced_names: tuple
  train_structure: tuple
  num_examples: int
  sampling_prob: float
  num_steps: int
  padded_batch_size: int
  microbatch_size: int
  eval_batch_size: int

  @classmethod
  def from_config(cls, config: TrainConfig, data: Dataset) -> "LoopSpec":
    """Resolves q, T and the padding/microbatch defaults for `data`."""
    n = data.num_examples
    q = config.sampling_prob_for(n)
    ex = config.execution
    micro = ex.microbatch_size
    padded = ex.padded_batch_size
    static, traced = config.task.split_hparams(config.hparams)
    static = _hashable_items(config.task, static)
    # Padding is sized from the rows present (a shape, performance only);
    # q and T above come from the declared N only.
    rows = data.num_train_rows
    if micro is None:
      fixed = padded is not None
      padded = padded if fixed else default_padded_batch_size(rows, q)
      per_example = _per_example_bytes(config.task, static, data.train)
      if per_example is None:  # the task does not fit the data: check_task will say why
        micro = padded
      else:
        micro = microbatching.auto_microbatch_size(padded, per_example, microbatching.budget_bytes(),
                                                   divide=fixed)
        padded = micro * math.ceil(padded / micro)
    elif padded is None:
      padded = default_padded_batch_size(rows, q, micro)
    validate_batch_sizes(padded, micro)
    return cls(task=config.task, static_hparams=static,
               traced_names=tuple(sorted(traced)), train_structure=_structure(data.train),
               num_examples=n, sampling_prob=q, num_steps=config.num_steps_for(n),
               padded_batch_size=padded, microbatch_size=micro, eval_batch_size=ex.eval_batch_size)

  def model(self):
    """The task's `Model` for this spec's static hyperparameters."""
    return self.task.model_for(dict(self.static_hparams))

  def hparams(self, traced: Mapping[str, Any]) -> HParams:
    """All hyperparameters: the static values and the (traced) arrays."""
    return HParams({**dict(self.static_hparams), **traced})


_PER_EXAMPLE_BYTES: dict = {}


def _per_example_bytes(task: Task, static_hparams: tuple, train: PyTree) -> Optional[int]:
  """`microbatching.per_example_bytes` of the task on one training example (cached); None
  if the task cannot be traced on this data."""
  memo = (task, static_hparams, _structure(train))
  if memo not in _PER_EXAMPLE_BYTES:
    example = _abstract(train, rows=1)
    try:
      model = task.model_for(dict(static_hparams))
      params = jax.eval_shape(model.init, jax.random.key(0), task.model_inputs(example))
      size = microbatching.per_example_bytes(task.per_example_loss(model), params, example)
      if task.clipping == "ghost":  # no per-example copy of the (ghost layers') gradients
        size = max(1, size - sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params)))
    except Exception:  # pylint: disable=broad-except
      return None
    if len(_PER_EXAMPLE_BYTES) > 256:
      _PER_EXAMPLE_BYTES.clear()
    _PER_EXAMPLE_BYTES[memo] = size
  return _PER_EXAMPLE_BYTES[memo]


def per_example_bytes(spec: LoopSpec, train: PyTree) -> Optional[int]:
  """Working set of one example's gradient for this spec's task (see `jaxdp.train.microbatching`)."""
  return _per_example_bytes(spec.task, spec.static_hparams, train)


def traced_hparams(spec: LoopSpec, config: TrainConfig) -> dict:
  """The config's traced hyperparameters as float32 scalars (vmappable)."""
  return {name: jnp.asarray(config.hparams[name], jnp.float32) for name in spec.traced_names}


class LoopOutput(NamedTuple):
  """Result of the inner loop."""
  params: PyTree
  steps: jax.Array      # steps actually run (int32)
  finite: jax.Array     # False if the parameters became non-finite (diverged)


def _first(tree: PyTree) -> PyTree:
  return jax.tree.map(lambda leaf: leaf[:1], tree)


def init_params(spec: LoopSpec, key: jax.Array, train: PyTree) -> PyTree:
  """Initial parameters: they depend on the key and the inputs' shapes only."""
  model = spec.model()
  return model.init(key, spec.task.model_inputs(jax.tree.map(jnp.zeros_like, _first(train))))


def _all_finite(tree: PyTree) -> jax.Array:
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(tree)]))


def _take(tree: PyTree, idx: jax.Array) -> PyTree:
  return jax.tree.map(lambda leaf: leaf[idx], tree)


def build_train_loop(spec: LoopSpec) -> Callable[..., LoopOutput]:
  """The pure inner DP training loop for `spec` (not jitted; jit or vmap it).

  Returns:
    loop(params, plan, traced_hparams, key, train) -> LoopOutput. It runs
    `plan.num_steps` Poisson-sampled DP steps, stopping early only if the
    parameters become non-finite. `plan` is a `DpSgdPlan` whose static fields
    equal the spec's; its C and sigma may be traced.
  """
  task = spec.task
  loss = task.per_example_loss(spec.model())

  def loop(params, plan: DpSgdPlan, traced: Mapping[str, jax.Array], key, train) -> LoopOutput:
    sample_key, noise_key = jax.random.split(key)
    num_rows = jax.tree.leaves(train)[0].shape[0]  # static; never a normaliser
    clipped = plan.clipped_grad(loss, method=task.clipping)
    opt = optax.chain(plan.privatizer(clipped, noise_key), task.optimizer_for(spec.hparams(traced)))
    opt_state = opt.init(params)

    def body(carry):
      step, params, opt_state, _ = carry
      grad_sum, _ = plan.batch_sum(
          jax.random.fold_in(sample_key, step), lambda idx, valid: clipped(params, _take(train, idx), valid),
          num_rows=num_rows, padded_batch_size=spec.padded_batch_size,
          microbatch_size=spec.microbatch_size)
      updates, opt_state = opt.update(grad_sum, opt_state, params)
      params = optax.apply_updates(params, updates)
      return step + 1, params, opt_state, _all_finite(params)

    def cond(carry):
      step, _, _, finite = carry
      return (step < plan.num_steps) & finite

    step, params, _, finite = jax.lax.while_loop(
        cond, body, (jnp.int32(0), params, opt_state, _all_finite(params)))
    return LoopOutput(params=params, steps=step, finite=finite)

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
  """Pure DP scoring: (params, private validation batch, key) -> the noisy score."""
  task = spec.task
  outputs = build_outputs(spec)

  def score(params, batch, key):
    return jnp.asarray(task.score(outputs(params, batch), batch, key), jnp.float32)

  return score


def score_key(key: jax.Array) -> jax.Array:
  """The key of a candidate's DP score, independent of its init and loop keys."""
  return jax.random.fold_in(key, 0x5C0E)


def run_candidate(spec: LoopSpec, plan: DpSgdPlan, traced, key, train, test, validation, params=None):
  """Init (unless `params`), train, then score: the one program lone and batched runs share.

  Returns:
    (LoopOutput, score, test score, test loss); the scores are NaN where
    their split is None.
  """
  init_key, loop_key = jax.random.split(key)
  if params is None:
    params = init_params(spec, init_key, train)
  out = build_train_loop(spec)(params, plan, traced, loop_key, train)
  nan = jnp.float32(jnp.nan)
  test_score, test_loss = build_evaluate(spec)(out.params, test) if test is not None else (nan, nan)
  if spec.task.private_score:
    score = build_private_score(spec)(out.params, validation, score_key(key))
  else:
    score = test_score
  return out, score, test_score, test_loss


@functools.lru_cache(maxsize=32)
def _compiled(spec: LoopSpec):
  return (jax.jit(functools.partial(init_params, spec)),
          jax.jit(functools.partial(run_candidate, spec)))


_EXECUTABLES: dict = {}


def _signature(args: tuple) -> tuple:
  leaves, treedef = jax.tree.flatten(args)
  return treedef, tuple((np.shape(x), str(getattr(x, "dtype", type(x).__name__)),
                         getattr(x, "sharding", None)) for x in leaves)


def compile_cached(jitted, args: tuple):
  """(`jitted` compiled ahead of time for `args`, seconds spent compiling now).

  Executables are kept per (function, argument shapes, dtypes and
  shardings); a cached one reports 0.0 seconds.
  """
  memo = (jitted, _signature(args))
  if memo in _EXECUTABLES:
    return _EXECUTABLES[memo], 0.0
  start = time.perf_counter()
  executable = jitted.lower(*args).compile()
  seconds = time.perf_counter() - start
  if len(_EXECUTABLES) > 64:
    _EXECUTABLES.clear()
  _EXECUTABLES[memo] = executable
  return executable, seconds


@dataclasses.dataclass(frozen=True, kw_only=True)
class CandidateResult:
  """Outcome of one candidate run.

  Attributes:
    score: the selection score (the task's public score on `data.test`, or
      its DP score on `data.private_validation`), NaN if the run diverged.
    test_score: the task's public score on `data.test` (NaN if diverged or
      there is no test split).
    test_loss: mean loss on `data.test` (NaN likewise).
    steps: DP steps actually run.
    planned_steps: DP steps configured (what epsilon accounts for).
    epsilon: epsilon at `delta` of the planned run (and its DP score; inf if
      sigma = 0).
    delta: target delta.
    diverged: True if the parameters became non-finite or the score did.
    wall_time_s: wall-clock seconds for the whole call, compilation included.
    compile_time_s: seconds of that spent compiling its program (0.0 when
      it was compiled before; in a batched run, its group's compilation).
    score_source: 'public test split (not accounted)' or 'private validation
      split (DP score, accounted)'.
    params: final parameters (not in repr).
  """
  score: float
  test_score: float
  test_loss: float
  steps: int
  planned_steps: int
  epsilon: float
  delta: float
  diverged: bool
  wall_time_s: float
  score_source: str = ""
  compile_time_s: float = 0.0
  params: PyTree = dataclasses.field(repr=False, default=None)


PUBLIC_SOURCE = "public test split (not accounted)"
PRIVATE_SOURCE = "private validation split (DP score, accounted)"


def score_source(task: Task) -> str:
  return PRIVATE_SOURCE if task.private_score else PUBLIC_SOURCE


def check_data(task: Task, data: Dataset) -> None:
  """Raises ValueError unless `data` has the split the task's score reads."""
  if not isinstance(data, Dataset):
    raise ValueError(f"data must be a jaxdp.data.Dataset (private train, public test, private "
                     f"validation), got {type(data).__name__}")
  if task.private_score and data.private_validation is None:
    raise ValueError(f"task {task.name!r} has a DP score, which reads data.private_validation, but "
                     "it is None; give Dataset(private_validation=...)")
  if not task.private_score and data.test is None:
    raise ValueError(f"task {task.name!r} scores on the public test split, but data.test is None. "
                     "jaxdp never scores on the private training data: give public data as "
                     "Dataset(test=...), or score privately with jaxdp.train.NoisyMean / DpScore "
                     "on Dataset(private_validation=...)")


_CHECKED: set = set()


def check_task(spec: LoopSpec, data: Dataset) -> None:
  """Shape-checks the task on `data` (no compilation, no training).

  A spec that passed on splits of the same shapes is not traced again.

  Raises:
    ValueError: the model cannot take the inputs, the loss does not fit the
      model's outputs or is not one value per example, a score is not a
      scalar, or the optimizer fails on the parameters; each names the culprit.
  """
  task = spec.task
  check_data(task, data)
  split = data.private_validation if task.private_score else data.test
  memo = (spec, jax.tree.structure(split),
          tuple((np.shape(x), str(_device_dtype(x))) for x in jax.tree.leaves(split)))
  if memo in _CHECKED:
    return
  _check_task(spec, data)
  if len(_CHECKED) > 256:
    _CHECKED.clear()
  _CHECKED.add(memo)


def _check_task(spec: LoopSpec, data: Dataset) -> None:
  task = spec.task
  two = _abstract(data.train, rows=2)
  try:
    inputs = jax.eval_shape(task.model_inputs, two)
  except Exception as err:  # pylint: disable=broad-except
    raise ValueError(f"task {task.name!r}: inputs cannot select the model input from a batch "
                     f"{jax.tree.map(lambda s: s.shape, two)}: {type(err).__name__}: {err}") from err
  model = spec.model()
  try:
    params = jax.eval_shape(model.init, jax.random.key(0), inputs)
    outputs = jax.eval_shape(model.apply, params, inputs)
  except Exception as err:  # pylint: disable=broad-except
    raise ValueError(f"task {task.name!r}: the model (static hyperparameters "
                     f"{dict(spec.static_hparams)}) cannot take inputs of shape "
                     f"{jax.tree.map(lambda s: s.shape, inputs)}: {type(err).__name__}: {err}") from err
  try:
    losses = jax.eval_shape(task.per_example_loss(model), params, two)
  except Exception as err:  # pylint: disable=broad-except
    raise ValueError(f"task {task.name!r}: the loss does not fit the model's outputs "
                     f"{jax.tree.map(lambda s: s.shape, outputs)}: {type(err).__name__}: {err}") from err
  if getattr(losses, "shape", None) != (2,):
    raise ValueError(f"task {task.name!r}: the loss must return one value per example, shape (b,); "
                     f"for a batch of 2 it returned {jax.tree.map(lambda s: s.shape, losses)}")
  split = data.private_validation if task.private_score else data.test
  which = "private_validation" if task.private_score else "test"
  batch = _abstract(split)
  try:
    if task.private_score:
      got = jax.eval_shape(build_private_score(spec), params, batch, jax.random.key(0))
    else:
      got = jax.eval_shape(build_evaluate(spec), params, batch)[0]
  except Exception as err:  # pylint: disable=broad-except
    raise ValueError(f"task {task.name!r}: the score fails on data.{which}: "
                     f"{type(err).__name__}: {err}") from err
  check_scalar(f"task {task.name!r}: the score", got)
  scalar = jax.ShapeDtypeStruct((), jnp.float32)
  traced = {k: scalar for k in spec.traced_names}

  def one_run(p, clip, sigma, t, train):
    plan = DpSgdPlan(l2_clip_norm=clip, noise_multiplier=sigma, sampling_prob=spec.sampling_prob,
                     num_steps=spec.num_steps, num_examples=spec.num_examples)
    return build_train_loop(spec)(p, plan, t, jax.random.key(0), train)

  train = _abstract(data.train)
  try:
    jax.eval_shape(one_run, params, scalar, scalar, traced, train)
  except Exception as err:  # pylint: disable=broad-except
    raise ValueError(f"task {task.name!r}: one DP step fails with static hyperparameters "
                     f"{dict(spec.static_hparams)} and traced {list(spec.traced_names)}: "
                     f"{type(err).__name__}: {err}. A factory that needs a concrete value "
                     f"(Python control flow) must declare it Task(static=(...))") from err


def _check_initial_params(given: PyTree, expected: PyTree) -> PyTree:
  """`given` cast to the model's dtypes, after checking it matches its parameter tree."""
  if jax.tree.structure(given) != jax.tree.structure(expected):
    raise ValueError(f"initial_params must have the model's parameter structure "
                     f"{jax.tree.structure(expected)}, got {jax.tree.structure(given)}")
  for g, e in zip(jax.tree.leaves(given), jax.tree.leaves(expected)):
    if tuple(jnp.shape(g)) != tuple(e.shape):
      raise ValueError(f"initial_params leaf has shape {tuple(jnp.shape(g))}, the model needs {tuple(e.shape)}")
  # Through the host, so arrays placed or sharded elsewhere (e.g. by the sweep
  # engine) do not make the jitted loop recompile for a new input sharding.
  return jax.tree.map(lambda g, e: jnp.asarray(np.asarray(g), e.dtype), given, expected)


def device_splits(data: Dataset) -> tuple:
  """(train, test, private validation) as JAX arrays (None stays None)."""
  def put(tree):
    return None if tree is None else jax.tree.map(jnp.asarray, tree)
  return put(data.train), put(data.test), put(data.private_validation)


def check_key(key: Any) -> jax.Array:
  if not isinstance(key, jax.Array) or not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    raise ValueError(f"key must be a typed PRNG key from jax.random.key(seed), got {key!r}")
  return key


def result_of(config: TrainConfig, num_examples: int, out: LoopOutput, score, test_score, test_loss,
              wall_time_s: float, params: PyTree = None,
              compile_time_s: float = 0.0) -> CandidateResult:
  """The `CandidateResult` of one finished run (a diverged run scores NaN)."""
  score, test_score, test_loss = float(score), float(test_score), float(test_loss)
  diverged = not (bool(out.finite) and math.isfinite(score))
  if diverged:
    score = test_score = test_loss = float("nan")
  return CandidateResult(
      score=score, test_score=test_score, test_loss=test_loss, steps=int(out.steps),
      planned_steps=config.num_steps_for(num_examples), epsilon=epsilon(config, num_examples),
      delta=float(config.target_delta), diverged=diverged, wall_time_s=wall_time_s,
      score_source=score_source(config.task), compile_time_s=compile_time_s, params=params)


def train_candidate(config: TrainConfig, data: Dataset, key: jax.Array, *,
                    initial_params: PyTree | None = None) -> CandidateResult:
  """Trains one candidate with DP and scores it.

  Args:
    config: the candidate's configuration (task, privacy, hyperparameters).
    data: a `jaxdp.data.Dataset`: private `train`; the score reads the public
      `test` split, or, for a DP score, `private_validation`.
    key: PRNG key; the same key gives the same result.
    initial_params: optional warm start (e.g. a model released by a private
      search; Koskela & Kulkarni 2023 warm-start the final run from the tuned
      model). It must have the structure and shapes of the model's
      parameters. None (default): the usual random initialisation. The key is
      split exactly as without it, so the DP noise and batches are the same.

  Returns:
    The `CandidateResult`.  A diverging run returns score NaN; it never raises.

  Raises:
    ValueError: for a bad config/data type, a key that is not a PRNG key, or a
      task that does not fit the data (model, loss, score; see `check_task`).
  """
  start = time.perf_counter()
  if not isinstance(config, TrainConfig):
    raise ValueError(f"config must be a TrainConfig, got {type(config).__name__}")
  check_data(config.task, data)
  key = check_key(key)
  spec = LoopSpec.from_config(config, data)
  check_task(spec, data)
  init_fn, run_fn = _compiled(spec)
  train, test, validation = device_splits(data)
  if initial_params is not None:
    init_key, _ = jax.random.split(key)
    initial_params = _check_initial_params(initial_params, jax.eval_shape(init_fn, init_key, train))
  args = (config.plan(data.num_examples).for_device(), traced_hparams(spec, config), key, train, test,
          validation, initial_params)
  executable, compile_s = compile_cached(run_fn, args)
  out, score, test_score, test_loss = executable(*args)
  return result_of(config, data.num_examples, out, score, test_score, test_loss,
                   time.perf_counter() - start, params=out.params, compile_time_s=compile_s)
