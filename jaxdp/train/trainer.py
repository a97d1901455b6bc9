"""One DP-SGD / DP-Adam candidate run: config, pure inner loop, thin wrapper.

The inner loop (`build_train_loop`) is a pure, jittable function of
(params, HParams, key, train inputs, train labels) with every shape static, so a
sweep engine can `jax.vmap` it over a candidate axis of `HParams` and keys.
`train_candidate` only validates, compiles (cached per static structure),
runs, evaluates on the public test set and accounts.

Privacy: each step samples every training example independently with
probability q and processes all of them (see `jaxdp.train.sampling`); the
accounted event is exactly `dp_event(config)`.  A run that diverges stops
early; its reported epsilon is still that of the planned number of steps,
which upper-bounds what ran (the stopping time depends only on the privatised
parameters).  The dataset size N is treated as public: every update is
divided by the expected batch size q*N (README, "Privacy assumptions").
A config with noise_multiplier = 0 is not private at all (epsilon = inf) and
warns with `NotPrivateWarning` when it is built.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
import warnings
from typing import Any, Callable, NamedTuple

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import optax
from dp_accounting import rdp

from jaxdp import _validate
from jaxdp.accounting import events as acc_events
from jaxdp.data import Dataset
from jaxdp.models import CONV_IMPLS, MODELS, get_activation, get_model
from jaxdp.train.clipping import clipped_grad_sum
from jaxdp.train.optimizers import dp_adam, dp_sgd
from jaxdp.train.sampling import default_padded_batch_size, poisson_batch_sum, validate_batch_sizes

PyTree = Any
OPTIMIZERS = ("sgd", "adam")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExecutionConfig:
  """Performance-only settings: they never change what is computed or its privacy.

  Attributes:
    padded_batch_size: rows processed on the common path per step; None picks
      qN + 4 std of Binomial(N, q).  Larger sampled batches are still fully
      processed by extra microbatches.
    microbatch_size: rows per vectorised per-example-gradient call (bounds
      memory); None means the whole padded batch at once.
    eval_batch_size: rows per call when scoring the test set.
    conv_impl: convolution lowering, 'im2col' (fast per-example gradients) or
      'native'.
  """
  padded_batch_size: int | None = None
  microbatch_size: int | None = None
  eval_batch_size: int = 1000
  conv_impl: str = "im2col"

  def __post_init__(self):
    if self.padded_batch_size is not None:
      _validate.integer("padded_batch_size", self.padded_batch_size, low=1)
    if self.microbatch_size is not None:
      _validate.integer("microbatch_size", self.microbatch_size, low=1)
    if self.padded_batch_size is not None and self.microbatch_size is not None:
      validate_batch_sizes(self.padded_batch_size, self.microbatch_size)
    _validate.integer("eval_batch_size", self.eval_batch_size, low=1)
    if self.conv_impl not in CONV_IMPLS:
      raise ValueError(f"conv_impl must be one of {CONV_IMPLS}, got {self.conv_impl!r}")


class NotPrivateWarning(UserWarning):
  """A configuration adds no noise: its runs are not differentially private (epsilon = inf)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
  """One candidate: privacy parameters, optimisation parameters, execution.

  Privacy-relevant (they determine the DpEvent and hence epsilon):
    sampling_prob: Poisson inclusion probability q in (0, 1].
    noise_multiplier: sigma >= 0. sigma = 0 adds no noise: the run is not
      differentially private (epsilon = inf) and construction warns with a
      `NotPrivateWarning`; useful only as a non-private baseline.
    steps / epochs: exactly one; steps = ceil(epochs / q) (`jaxdp.accounting.dpsgd_steps`).
    target_delta: delta in (0, 1) at which epsilon is reported.
    l2_clip_norm: per-example clip norm C > 0 (the sensitivity; with sigma it
      sets the noise std sigma*C but does not change epsilon).

  Optimisation (post-processing, no privacy cost):
    learning_rate: > 0.
    optimizer: 'sgd' or 'adam'.
    momentum: in [0, 1), SGD only.
    weight_decay: >= 0 (coupled for SGD, decoupled AdamW for Adam).
    model: one of `jaxdp.models.MODELS`.
    activation: 'relu', 'tanh', 'tempered_sigmoid' or a `TemperedSigmoid`.

  Performance only:
    execution: an `ExecutionConfig`.
  """
  l2_clip_norm: float
  noise_multiplier: float
  sampling_prob: float
  steps: int | None = None
  epochs: float | None = None
  target_delta: float = 1e-5
  learning_rate: float
  optimizer: str = "sgd"
  momentum: float = 0.0
  weight_decay: float = 0.0
  model: str = "logreg"
  activation: Any = "tanh"
  execution: ExecutionConfig = dataclasses.field(default_factory=ExecutionConfig)

  def __post_init__(self):
    _validate.real("l2_clip_norm", self.l2_clip_norm, low=0.0, low_open=True)
    _validate.real("noise_multiplier", self.noise_multiplier, low=0.0)
    if self.noise_multiplier == 0:
      # Legal (non-private baselines, exact-GD checks) but never what a DP
      # user means: epsilon is inf and nothing downstream would say so.
      warnings.warn("noise_multiplier=0: this configuration adds no noise, so its training is NOT "
                    "differentially private (epsilon = inf)", NotPrivateWarning, stacklevel=3)
    _validate.probability("sampling_prob", self.sampling_prob, one_ok=True)
    if (self.steps is None) == (self.epochs is None):
      raise ValueError(f"exactly one of steps and epochs must be given, got "
                       f"steps={self.steps!r}, epochs={self.epochs!r}")
    if self.steps is not None:
      _validate.integer("steps", self.steps, low=1)
    else:
      _validate.real("epochs", self.epochs, low=0.0, low_open=True)
    _validate.probability("target_delta", self.target_delta)
    _validate.real("learning_rate", self.learning_rate, low=0.0, low_open=True)
    if self.optimizer not in OPTIMIZERS:
      raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
    _validate.real("momentum", self.momentum, low=0.0, high=1.0, high_open=True)
    if self.momentum and self.optimizer != "sgd":
      raise ValueError(f"momentum applies to optimizer='sgd' only, got optimizer="
                       f"{self.optimizer!r} with momentum={self.momentum!r}")
    _validate.real("weight_decay", self.weight_decay, low=0.0)
    if self.model not in MODELS:
      raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
    get_activation(self.activation)
    if not isinstance(self.execution, ExecutionConfig):
      raise ValueError(f"execution must be an ExecutionConfig, got {self.execution!r}")

  @property
  def num_steps(self) -> int:
    """Planned number of DP steps."""
    if self.steps is not None:
      return int(self.steps)
    return acc_events.dpsgd_steps(self.epochs, self.sampling_prob)

  def hparams(self) -> "HParams":
    """The traced (vmappable) hyperparameters of this config."""
    return HParams(*(jnp.asarray(v, jnp.float32) for v in (
        self.learning_rate, self.l2_clip_norm, self.noise_multiplier, self.weight_decay)))

  def dp_event(self) -> dp_accounting.DpEvent:
    """The DpEvent of this run; see `dp_event`."""
    return dp_event(self)


def dp_event(config: TrainConfig) -> dp_accounting.DpEvent:
  """`num_steps` self-composed Poisson-subsampled Gaussian mechanisms.

  Args:
    config: the run's configuration.

  Returns:
    `jaxdp.accounting.dpsgd_event(q, sigma, steps)`, the one DP-SGD event builder.
  """
  return acc_events.dpsgd_event(config.sampling_prob, config.noise_multiplier, config.num_steps)


def epsilon(config: TrainConfig) -> float:
  """Epsilon of the run at `config.target_delta` by the RDP accountant (inf if sigma=0)."""
  accountant = rdp.RdpAccountant()
  return float(accountant.compose(dp_event(config)).get_epsilon(config.target_delta))


class HParams(NamedTuple):
  """Per-candidate hyperparameters as float32 arrays (scalars, or vectors when vmapped)."""
  learning_rate: jax.Array
  l2_clip_norm: jax.Array
  noise_multiplier: jax.Array
  weight_decay: jax.Array


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopSpec:
  """Everything static about the inner loop: equal specs share one compilation.

  Attributes:
    model: model name.
    num_classes: number of logits.
    activation: activation name or `TemperedSigmoid`.
    conv_impl: convolution lowering.
    input_shape: shape of one example.
    num_examples: N, training set size.
    sampling_prob: q.
    num_steps: planned steps.
    optimizer: 'sgd' or 'adam'.
    momentum: SGD momentum.
    padded_batch_size: rows on the common path.
    microbatch_size: rows per per-example-gradient call.
  """
  model: str
  num_classes: int
  activation: Any
  conv_impl: str
  input_shape: tuple[int, ...]
  num_examples: int
  sampling_prob: float
  num_steps: int
  optimizer: str
  momentum: float
  padded_batch_size: int
  microbatch_size: int

  @classmethod
  def from_config(cls, config: TrainConfig, data: Dataset) -> "LoopSpec":
    """Resolves padding/microbatch defaults for `data`."""
    n = int(data.train.inputs.shape[0])
    ex = config.execution
    micro = ex.microbatch_size
    padded = ex.padded_batch_size
    if padded is None:
      padded = default_padded_batch_size(n, config.sampling_prob, micro)
    if micro is None:
      micro = padded
    validate_batch_sizes(padded, micro)
    return cls(model=config.model, num_classes=data.num_classes, activation=config.activation,
               conv_impl=ex.conv_impl, input_shape=data.input_shape, num_examples=n,
               sampling_prob=float(config.sampling_prob), num_steps=config.num_steps,
               optimizer=config.optimizer, momentum=float(config.momentum),
               padded_batch_size=padded, microbatch_size=micro)

  def module(self):
    """The Flax module."""
    return get_model(self.model, num_classes=self.num_classes, activation=self.activation,
                     conv_impl=self.conv_impl)


class LoopOutput(NamedTuple):
  """Result of the inner loop."""
  params: PyTree
  steps: jax.Array      # steps actually run (int32)
  finite: jax.Array     # False if the parameters became non-finite (diverged)


def init_params(spec: LoopSpec, key: jax.Array) -> PyTree:
  """Initial parameters; they depend on the key and shapes only, not on data."""
  return spec.module().init(key, jnp.zeros((1,) + spec.input_shape, jnp.float32))


def _make_optimizer(spec: LoopSpec, hp: HParams, key: jax.Array) -> optax.GradientTransformation:
  common = dict(learning_rate=hp.learning_rate, l2_clip_norm=hp.l2_clip_norm,
                noise_multiplier=hp.noise_multiplier,
                expected_batch_size=spec.sampling_prob * spec.num_examples,
                key=key, weight_decay=hp.weight_decay)
  if spec.optimizer == "sgd":
    return dp_sgd(momentum=spec.momentum, **common)
  return dp_adam(**common)


def _all_finite(tree: PyTree) -> jax.Array:
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(tree)]))


def build_train_loop(spec: LoopSpec) -> Callable[..., LoopOutput]:
  """The pure inner DP training loop for `spec` (not jitted; jit or vmap it).

  Args:
    spec: static structure.

  Returns:
    loop(params, hparams, key, train_inputs, train_labels) -> LoopOutput.  It
    runs `spec.num_steps` Poisson-sampled DP steps, stopping early only if the
    parameters become non-finite.
  """
  module = spec.module()

  def loss_fn(params, inputs, labels):
    return optax.softmax_cross_entropy_with_integer_labels(module.apply(params, inputs), labels)

  def loop(params, hparams: HParams, key, train_inputs, train_labels) -> LoopOutput:
    sample_key, noise_key = jax.random.split(key)
    opt = _make_optimizer(spec, hparams, noise_key)
    opt_state = opt.init(params)

    def body(carry):
      step, params, opt_state, _ = carry

      def microbatch(idx, valid):
        grads, _ = clipped_grad_sum(loss_fn, params, train_inputs[idx], train_labels[idx],
                                    valid, hparams.l2_clip_norm)
        return grads

      grad_sum, _ = poisson_batch_sum(
          jax.random.fold_in(sample_key, step), microbatch, num_examples=spec.num_examples,
          sampling_prob=spec.sampling_prob, padded_batch_size=spec.padded_batch_size,
          microbatch_size=spec.microbatch_size)
      updates, opt_state = opt.update(grad_sum, opt_state, params)
      params = optax.apply_updates(params, updates)
      return step + 1, params, opt_state, _all_finite(params)

    def cond(carry):
      step, _, _, finite = carry
      return (step < spec.num_steps) & finite

    step, params, _, finite = jax.lax.while_loop(
        cond, body, (jnp.int32(0), params, opt_state, _all_finite(params)))
    return LoopOutput(params=params, steps=step, finite=finite)

  return loop


def build_evaluate(spec: LoopSpec, eval_batch_size: int) -> Callable[..., tuple[jax.Array, jax.Array]]:
  """Pure test-set scoring: (params, inputs, labels) -> (accuracy, mean loss).

  `inputs` is padded internally to a multiple of `eval_batch_size`.
  """
  module = spec.module()

  def evaluate(params, inputs, labels):
    n = inputs.shape[0]
    b = min(eval_batch_size, n)
    chunks = math.ceil(n / b)
    pad = chunks * b - n
    x = jnp.pad(inputs, [(0, pad)] + [(0, 0)] * (inputs.ndim - 1)).reshape((chunks, b) + inputs.shape[1:])
    y = jnp.pad(labels, (0, pad)).reshape(chunks, b)
    valid = (jnp.arange(chunks * b) < n).reshape(chunks, b)

    def one(args):
      xb, yb, vb = args
      logits = module.apply(params, xb)
      loss = optax.softmax_cross_entropy_with_integer_labels(logits, yb)
      correct = jnp.argmax(logits, -1) == yb
      return (jnp.sum(jnp.where(vb, correct, False)), jnp.sum(jnp.where(vb, loss, 0.0)))

    correct, loss = jax.lax.map(one, (x, y, valid))
    return jnp.sum(correct) / n, jnp.sum(loss) / n

  return evaluate


@functools.lru_cache(maxsize=32)
def _compiled(spec: LoopSpec, eval_batch_size: int):
  return (jax.jit(functools.partial(init_params, spec)), jax.jit(build_train_loop(spec)),
          jax.jit(build_evaluate(spec, eval_batch_size)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class CandidateResult:
  """Outcome of one candidate run.

  Attributes:
    score: test accuracy, or NaN if the run diverged.
    test_accuracy: accuracy on the public test set (NaN if diverged).
    test_loss: mean cross-entropy on the public test set (NaN if diverged).
    steps: DP steps actually run.
    planned_steps: DP steps configured (what epsilon accounts for).
    epsilon: epsilon at `delta` of the planned run (inf if sigma = 0).
    delta: target delta.
    diverged: True if the parameters became non-finite or the test loss did.
    wall_time_s: wall-clock seconds for the whole call, compilation included.
    params: final parameters (not in repr).
  """
  score: float
  test_accuracy: float
  test_loss: float
  steps: int
  planned_steps: int
  epsilon: float
  delta: float
  diverged: bool
  wall_time_s: float
  params: PyTree = dataclasses.field(repr=False, default=None)


def check_model_input(spec: LoopSpec) -> None:
  """Raises ValueError if the model cannot map the data's inputs to num_classes logits."""
  module = spec.module()
  x = jax.ShapeDtypeStruct((1,) + spec.input_shape, jnp.float32)
  try:
    params = jax.eval_shape(module.init, jax.random.key(0), x)
    out = jax.eval_shape(module.apply, params, x)
  except Exception as err:  # flax/lax raise various types for shape mismatches
    raise ValueError(f"model {spec.model!r} cannot take inputs of shape {spec.input_shape}: "
                     f"{type(err).__name__}: {err}") from err
  if out.shape != (1, spec.num_classes):
    raise ValueError(f"model {spec.model!r} maps inputs of shape {spec.input_shape} to "
                     f"{out.shape[1:]}, expected ({spec.num_classes},)")


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


def train_candidate(config: TrainConfig, data: Dataset, key: jax.Array, *,
                    initial_params: PyTree | None = None) -> CandidateResult:
  """Trains one candidate with DP and scores it on the public test set.

  Args:
    config: the candidate's configuration.
    data: a `jaxdp.data.Dataset` (train is private, test is public).
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
      model that does not fit the data's input shape or class count.
  """
  start = time.perf_counter()
  if not isinstance(config, TrainConfig):
    raise ValueError(f"config must be a TrainConfig, got {type(config).__name__}")
  if not isinstance(data, Dataset):
    raise ValueError(f"data must be a jaxdp.data.Dataset, got {type(data).__name__}")
  if not isinstance(key, jax.Array) or not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    raise ValueError(f"key must be a typed PRNG key from jax.random.key(seed), got {key!r}")
  spec = LoopSpec.from_config(config, data)
  check_model_input(spec)
  init_fn, loop_fn, eval_fn = _compiled(spec, config.execution.eval_batch_size)

  init_key, loop_key = jax.random.split(key)
  if initial_params is None:
    params = init_fn(init_key)
  else:
    params = _check_initial_params(initial_params, jax.eval_shape(init_fn, init_key))
  out = loop_fn(params, config.hparams(), loop_key,
                jnp.asarray(data.train.inputs, jnp.float32), jnp.asarray(data.train.labels, jnp.int32))
  finite = bool(out.finite)
  accuracy, loss = eval_fn(out.params, jnp.asarray(data.test.inputs, jnp.float32),
                           jnp.asarray(data.test.labels, jnp.int32))
  accuracy, loss = float(accuracy), float(loss)
  diverged = not (finite and math.isfinite(loss))
  if diverged:
    accuracy = loss = float("nan")
  return CandidateResult(
      score=float("nan") if diverged else accuracy, test_accuracy=accuracy, test_loss=loss,
      steps=int(out.steps), planned_steps=config.num_steps, epsilon=epsilon(config),
      delta=float(config.target_delta), diverged=diverged,
      wall_time_s=time.perf_counter() - start, params=out.params)
