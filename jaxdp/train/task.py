"""A user's training task: model, per-example loss, score and optimizer factory.

A `Task` is data, not a name: any Flax module (or plain `init`/`apply`
functions), any per-example loss over any batch pytree, any score and any
optax optimizer built from the tuned hyperparameters. The built-in models are
presets of the same type (`jaxdp.train.presets`).

Hyperparameters reach the task as one mapping (`HParams`). A value is
*traced* (vmapped over candidates inside one compiled program) when it is a
float that neither the model factory nor `Task.static` claims; everything else
(ints, strings, objects, whatever shapes the model) is *static*: the sweep
engine compiles once per distinct set of static values. The mapping records
which names were read, so a grid naming a hyperparameter the task never reads
is refused before anything trains. A name counts as read when a factory reads
it or when the optimizer's `init`/`update` does (a schedule closure), and the
optimizer factory also gets the run's number of steps (`HParams.num_steps`).

Scores and privacy: a plain score function reads only the public `test`
split of a `jaxdp.data.Dataset` (declared public; not accounted). A DP score
(`NoisyMean`, `DpScore`) reads only the private `private_validation` split and
its DpEvent is composed into every candidate's event. No score ever reads the
private training data.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import traceback
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Optional, Sequence

import dp_accounting
import flax
import flax.linen as nn
import jax
import jaxlib
import jax.numpy as jnp
import numpy as np
import optax

from jaxdp import _validate
from jaxdp.train import trainable as trainable_lib
from jaxdp.train.noise import round_up_float32

PyTree = Any

#: Values of `Task.clipping` (see `DpSgdPlan.clipped_grad`).
CLIPPING_METHODS = ("auto", "vmap", "ghost")


class Model(NamedTuple):
  """A model as two plain functions (what a Flax module's `init`/`apply` are).

  Attributes:
    init: (key, inputs) -> params, for a batch of inputs.
    apply: (params, inputs) -> outputs, batched (leading example axis).
  """
  init: Callable[[jax.Array, Any], PyTree]
  apply: Callable[[PyTree, Any], Any]


# What a traced value raises where Python needs a concrete one.
_CONCRETIZATION_ERRORS = (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError,
                          jax.errors.TracerIntegerConversionError,
                          jax.errors.TracerArrayConversionError)


class HParams(Mapping):
  """Read-only hyperparameter mapping that records which names were read.

  A name is read by `hp[name]`, `hp.get(name)` or `name in hp`, whenever that
  happens: while a factory runs, or later, while the optimizer's `init` or
  `update` runs (a schedule closure `lambda t: hp["learning_rate"] * f(t)`
  reads it at each update). Iterating (`dict(hp)`, `**hp`, `hp.items()`) sets
  `enumerated`: the names then reach the factory wholesale, so whether each
  is used cannot be told (`check_hparams` says so instead of passing
  silently).

  `hp.num_steps` is the run's planned number of DP steps T (a Python int),
  for the optimizer factory (e.g. a schedule's `decay_steps`). It is not a
  hyperparameter: reading it reads none, and no grid varies it (a grid varies
  `steps` or `epochs`).
  """

  def __init__(self, values: Mapping[str, Any], num_steps: Optional[int] = None):
    self._values = dict(values)
    self._num_steps = num_steps
    self.read: set = set()
    self.enumerated = False
    self.num_steps_read = False

  @property
  def num_steps(self) -> int:
    """The run's planned number of DP steps T (optimizer factory only)."""
    self.num_steps_read = True
    if self._num_steps is None:
      raise ValueError("hp.num_steps (the run's number of DP steps) is given to the optimizer factory "
                       "only; the model does not depend on the length of the run")
    return self._num_steps

  def __getitem__(self, name: str) -> Any:
    self.read.add(name)
    try:
      return self._values[name]
    except KeyError:
      raise KeyError(f"hyperparameter {name!r} is not set; the candidate has "
                     f"{sorted(self._values)}") from None

  def __contains__(self, name) -> bool:
    self.read.add(name)
    return name in self._values

  def __iter__(self) -> Iterator[str]:
    self.enumerated = True
    return iter(self._values)

  def __len__(self) -> int:
    return len(self._values)

  def __repr__(self) -> str:
    steps = "" if self._num_steps is None else f", num_steps={self._num_steps!r}"
    return f"HParams({self._values!r}{steps})"


#: The number of steps `HParams.num_steps` stands at where the run's T is not
#: known yet (a config given by batch_size and epochs, checked before it meets
#: its data's N): the checks that use it never decide anything from its value.
STAND_IN_STEPS = 1000

#: Parameters on which an optimizer's `init` and `update` are traced (shapes
#: only) to see what they read, where the model's parameters are not known yet
#: (a `TrainConfig` is checked before it meets its data).
STAND_IN_PARAMS = {"b": jax.ShapeDtypeStruct((2,), jnp.float32),
                   "w": jax.ShapeDtypeStruct((2, 2), jnp.float32)}


def trace_optimizer(opt: optax.GradientTransformation, params: PyTree = None) -> Optional[Exception]:
  """Runs `opt.init` and one `opt.update` on `params` (shapes only; default `STAND_IN_PARAMS`).

  What the optimizer reads at update time (a schedule closure reading a
  hyperparameter) is read here. Returns None, or the exception that stopped
  the trace (the optimizer does not fit these parameters).
  """
  def run(p):
    opt.update(p, opt.init(p), p)
  try:
    jax.eval_shape(run, STAND_IN_PARAMS if params is None else params)
  except Exception as err:  # pylint: disable=broad-except
    return err
  return None


#: What each concretization error says a factory did with a traced value, in plain words.
_CONCRETE_USES = (
    (jax.errors.TracerBoolConversionError, "uses it in Python control flow (an if or a comparison)"),
    (jax.errors.TracerIntegerConversionError, "uses it as a Python int (an index, a count or a shape)"),
    (jax.errors.TracerArrayConversionError, "converts it to a NumPy array"),
    (jax.errors.ConcretizationTypeError, "needs it as a Python number"),
)

_LIBRARY_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (jax, jaxlib, optax, np, flax, os))
_OPTAX_DIR = os.path.dirname(optax.__file__) + os.sep
_JAXDP_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _concrete_reason(err: Exception, where: str) -> str:
  """Why `where` (e.g. 'the optimizer factory') needs a concrete value, in plain words, from the
  concretization error `err` it raised on a traced one."""
  use = next(text for kind, text in _CONCRETE_USES if isinstance(err, kind))
  frames = traceback.extract_tb(err.__traceback__)
  # The outermost public optax function on the way (the one the user called), else the user's line.
  named = [f for f in frames if f.filename.startswith(_OPTAX_DIR)
           and not f.name.startswith(("_", "<")) and f.name not in ("init_fn", "update_fn")]
  if named:
    culprit = f"optax.{named[0].name}"
    hint = ("; a schedule's peak stays traced with jaxdp.train.schedules"
            if os.sep + "schedules" + os.sep in named[0].filename else "")
    return f"{where} needs a concrete value: {culprit} {use}{hint}"
  own = [f for f in frames if not f.filename.startswith(_LIBRARY_DIRS + (_JAXDP_DIR,))]
  culprit = (f"the code at line {own[-1].lineno} of {os.path.basename(own[-1].filename)}" if own
             else "it")
  return f"{where} needs a concrete value: {culprit} {use}"


#: The largest magnitude of NoisyMean's bounds: 1 / half stays a normal float32
#: (XLA on CPU flushes subnormals to zero, and may divide by multiplying by the
#: reciprocal: dividing by a half above 2**126 would give 0, not the share).
_BOUND_MAX = 2.0**125
#: The smallest normal float32: half the width of NoisyMean's range must be at least this.
_FLOAT32_TINY = float(np.finfo(np.float32).tiny)


@dataclasses.dataclass(frozen=True)
class NoisyMean:
  """DP score: the Gaussian-noised mean of a bounded per-example value on private data.

  Each example's value v_i is clipped to [low, high] and centred at
  mid = (low + high) / 2; the sum runs over each example's share

    u_i = clip((v_i - mid) / half, -1, 1),   half = (high - low) / 2,

  so adding or removing one validation example moves it by at most 1, i.e.
  moves the sum of the clipped values by at most half. The released score is

    (sum_i u_i + sigma' Z) * half / num_examples + mid,   Z ~ N(0, 1),

  with sigma' the noise multiplier rounded up to float32 and `num_examples`
  the *declared, public* validation size: the divisor is this constant,
  whatever the number of rows, because dividing by the actual count would
  move the score's mean by about twice the accounted amount when one example
  is added. Its DpEvent is `GaussianDpEvent(noise_multiplier)` (add or remove
  one validation example), composed into every candidate's event.

  Attributes:
    fn: (outputs, batch) -> per-example values, shape (n,) (e.g. 1.0 for a
      correct prediction, or minus the loss).
    low, high: bounds with low < high (accuracy: 0 and 1), of magnitude at
      most 2**125 (about 4.25e37) and at least 2.4e-38 apart: the shares are
      computed in float32.
    noise_multiplier: sigma > 0.
    num_examples: the public validation size n >= 1 (keyword-only): the
      normaliser of the noisy sum (e.g. the size of a validation split you may
      publish).

  Guarantees:
    The sensitivity bound holds for any float32 value `fn` gives the added
    or removed example, whatever its bits (an adversary may choose the
    example, e.g. inputs that make the logits overflow): a NaN value counts
    as `low` (u = -1), +inf, -inf and every other value outside [low, high]
    count as the nearer bound, and values inside as themselves (subnormals
    too, up to the device flushing them to 0). The sum of the u_i plus N(0, sigma'^2) noise with
    sigma' >= sigma is the Gaussian mechanism of `event` (sensitivity 1, up
    to float32 rounding of the sum, as in every float implementation); the
    scaling by half / num_examples and the shift by mid that follow are
    public post-processing. Every term lies in [-1, 1], so the float32 sum
    cannot overflow for any bounds or values: a non-finite value is bounded,
    never propagated. The score is finite unless that post-processing
    overflows float32, which takes bounds near 2**125.
  """
  fn: Callable[[Any, PyTree], jax.Array]
  low: float
  high: float
  noise_multiplier: float
  num_examples: Optional[int] = dataclasses.field(default=None, kw_only=True)

  def __post_init__(self):
    if not callable(self.fn):
      raise ValueError(f"NoisyMean.fn must be a callable (outputs, batch) -> per-example values, "
                       f"got {self.fn!r}")
    # The shares are computed in float32: larger bounds would make 1 / half
    # subnormal (flushed to 0), and a half-width below the normal range would
    # round to 0 there.
    _validate.real("low", self.low, low=-_BOUND_MAX, high=_BOUND_MAX)
    _validate.real("high", self.high, low=-_BOUND_MAX, high=_BOUND_MAX)
    if not self.low < self.high:
      raise ValueError(f"NoisyMean needs low < high, got low={self.low!r}, high={self.high!r}")
    if not (float(self.high) - float(self.low)) / 2.0 >= _FLOAT32_TINY:
      raise ValueError(f"NoisyMean needs (high - low) / 2 >= {_FLOAT32_TINY!r} (a normal float32), "
                       f"got low={self.low!r}, high={self.high!r}")
    _validate.real("noise_multiplier", self.noise_multiplier, low=0.0, low_open=True)
    if self.num_examples is None:
      raise ValueError("NoisyMean needs num_examples, the public validation size that divides the "
                       "noisy sum (never read from the private rows), e.g. NoisyMean(fn, 0, 1, 2.0, "
                       "num_examples=1000)")
    object.__setattr__(self, "num_examples", _validate.integer("num_examples", self.num_examples, low=1))

  @property
  def event(self) -> dp_accounting.DpEvent:
    return dp_accounting.GaussianDpEvent(float(self.noise_multiplier))

  def __call__(self, outputs, batch, key, mask=None) -> jax.Array:
    """The noisy score; `mask` (n,) bool: the real rows of a padded batch (`jaxdp.train.padding`)."""
    values = jnp.asarray(self.fn(outputs, batch), jnp.float32)
    rows = jax.tree.leaves(batch)[0].shape[:1] if jax.tree.leaves(batch) else None
    if values.ndim != 1 or (rows is not None and values.shape != rows):
      raise ValueError(f"NoisyMean.fn must return one value per example, shape {rows or '(n,)'}, "
                       f"got shape {values.shape}")
    mid, half = (float(self.high) + float(self.low)) / 2.0, (float(self.high) - float(self.low)) / 2.0
    # Each example's share in [-1, 1], whatever its bits. jnp.clip passes NaN
    # through, and one NaN would make the sum, hence the score, NaN with
    # probability 1 (a neighbour told apart for sure): NaN counts as `low`.
    # +-inf and huge values (whose difference with mid may overflow to +-inf)
    # clip to the nearer bound. Centring and scaling *before* the sum keeps
    # every term within one unit, so the float32 sum cannot overflow either.
    share = jnp.clip((values - mid) / half, -1.0, 1.0)
    share = jnp.where(jnp.isnan(share), -1.0, share)
    if mask is not None:  # padding rows add exactly 0, whatever their values (NaN too)
      share = jnp.where(mask, share, 0.0)
    # sigma rounded up to float32: never less noise than accounted.
    sigma = round_up_float32(float(self.noise_multiplier))
    noisy = jnp.sum(share) + sigma * jax.random.normal(key)
    # Public post-processing of the Gaussian mechanism's output.
    return noisy * (half / self.num_examples) + mid


@dataclasses.dataclass(frozen=True)
class DpScore:
  """A user's own DP score on the private validation split and its DpEvent.

  jaxdp trusts `event` to describe `fn` on the private validation data
  (add/remove-one neighbours) and composes it into every candidate's event.

  Attributes:
    fn: (outputs, batch, key) -> scalar.
    event: its `dp_accounting.DpEvent`.
  """
  fn: Callable[[Any, PyTree, jax.Array], jax.Array]
  event: dp_accounting.DpEvent

  def __post_init__(self):
    if not callable(self.fn):
      raise ValueError(f"DpScore.fn must be a callable (outputs, batch, key) -> scalar, got {self.fn!r}")
    if not isinstance(self.event, dp_accounting.DpEvent):
      raise ValueError(f"DpScore.event must be a dp_accounting.DpEvent, got {self.event!r}")

  def __call__(self, outputs, batch, key) -> jax.Array:
    return self.fn(outputs, batch, key)


PRIVATE_SCORES = (NoisyMean, DpScore)


def default_inputs(batch: PyTree) -> Any:
  """The model input of a batch: `batch.inputs`/`batch[0]` for tuples, `batch['x']` for dicts."""
  if isinstance(batch, tuple):
    return batch[0]
  if isinstance(batch, Mapping):
    if "x" not in batch:
      raise ValueError(f"the default Task.inputs reads batch['x'], but the batch has keys "
                       f"{sorted(batch)}; pass Task(inputs='<key>') or a function batch -> inputs")
    return batch["x"]
  raise ValueError(f"the default Task.inputs handles tuple and dict batches, got "
                   f"{type(batch).__name__}; pass Task(inputs=<key or function>)")


def _is_float(value: Any) -> bool:
  return (isinstance(value, (float, np.floating)) and not isinstance(value, bool))


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class Task:
  """What one candidate trains: any model, loss, score and optimizer.

  Attributes:
    model: a `flax.linen.Module`, a `Model(init, apply)`, or a factory
      `hparams -> Module | Model` (e.g. `lambda hp: MLP(width=hp["width"])`);
      every hyperparameter the factory reads is static.
    loss: per-example loss `(outputs, batch) -> (b,)` over a batch pytree
      (`(losses, aux)` with `has_aux=True`; the aux is not used by training).
    optimizer: factory `hparams -> optax.GradientTransformation`, e.g.
      `lambda hp: optax.adamw(hp["learning_rate"], weight_decay=hp["weight_decay"])`.
      It receives the mean noisy clipped gradient (noise added and divided by
      the expected batch size q*N already), so it is post-processing.
      `hp.num_steps` is the run's planned number of DP steps T (a Python int,
      not a hyperparameter), e.g. for a schedule's `decay_steps`. A
      hyperparameter may be read when the factory runs or later, in the
      optimizer's `init`/`update` (a schedule closure
      `optax.scale_by_schedule(lambda t: -hp["learning_rate"] * f(t))`): both
      count as read, and a float used only in arithmetic stays traced.
      `jaxdp.train.schedules` builds optax's schedules with a traced peak
      (`optax.sgd(schedules.warmup_cosine(hp["learning_rate"], 10, hp.num_steps))`).
    score: how a trained candidate is scored for selection (higher is better):
      a function `(outputs, batch) -> scalar` on the public `test` split, or a
      DP score (`NoisyMean`, `DpScore`) on the private `private_validation`
      split. None: minus the mean loss on the public `test` split.
    inputs: the model input of a batch: a key/index, or a function batch ->
      inputs; None means `default_inputs` (`batch[0]` or `batch['x']`).
    has_aux: whether `loss` returns `(losses, aux)`.
    static: hyperparameter names to treat as static even when they are
      floats. Rarely needed: a float the optimizer uses in Python control
      flow (e.g. the peak of `optax.warmup_cosine_decay_schedule`) is found
      and made static automatically (`concrete_hparams`), and the dry run and
      `TunedResult.auto_static` say which and why.
    extrapolate: for `jaxdp.tuning.subsampled_search`: `(hparams, m, n) ->
      hparams` carrying hyperparameters tuned on m examples to a final run on
      n (None: that search refuses the task until given one; see
      `scale_learning_rate`).
    clipping: how per-example gradients are clipped; every way gives the
      same clipped sum (up to float rounding) and the same privacy. 'auto'
      (default): per layer, whichever of the two below needs fewer
      per-example bytes and less work, from the layers' shapes and the
      device's memory (`jaxdp.train.ghost.ghost_clipped_grad_sum`); the dry
      run names each parameter's path and why. 'vmap': `jax.vmap`
      per-example gradients of every parameter. 'ghost': per-example norms of
      every eligible `flax.linen.Dense`, `flax.linen.DenseGeneral` (attention
      projections), `flax.linen.Conv`, `jaxdp.models.Conv2D` and
      `flax.linen.Embed` layer without materialising its per-example
      gradients (`jaxdp.train.ghost`), vmap for every other parameter; for
      wide layers and large vocabularies it needs a fraction of the memory.
    trainable: which parameters train (`jaxdp.train.trainable`): None (all),
      a predicate on '/'-joined paths (e.g. `lambda path:
      path.startswith("params/head/")`, or `jaxdp.models.lora.adapters`), or
      a pytree of bools with the parameters' structure. Frozen parameters
      get no per-example gradient (none is computed), count toward no
      clipping norm (vmap and ghost paths alike), get no noise and no
      update, and come out of training bit for bit as they went in. The
      DpEvent does not change. Start them from public weights with the
      tuners' `initial_params=`.
    name: a label for results and pools.
  """
  model: Any
  loss: Callable[[Any, PyTree], Any]
  optimizer: Callable[[Mapping[str, Any]], optax.GradientTransformation]
  score: Any = None
  inputs: Any = None
  has_aux: bool = False
  static: tuple = ()
  extrapolate: Optional[Callable[[Mapping[str, Any], int, int], Mapping[str, Any]]] = None
  clipping: str = "auto"
  trainable: Any = None
  name: str = "task"

  def __post_init__(self):
    if not (isinstance(self.model, (nn.Module, Model)) or callable(self.model)):
      raise ValueError(f"model must be a flax.linen.Module, a jaxdp.train.Model(init, apply) or a "
                       f"factory hparams -> model, got {self.model!r}")
    if not callable(self.loss):
      raise ValueError(f"loss must be a callable (outputs, batch) -> per-example losses, got {self.loss!r}")
    if not callable(self.optimizer) or isinstance(self.optimizer, optax.GradientTransformation):
      raise ValueError(f"optimizer must be a factory hparams -> optax.GradientTransformation "
                       f"(e.g. lambda hp: optax.sgd(hp['learning_rate'])), got {self.optimizer!r}")
    if self.score is not None and not callable(self.score):
      raise ValueError(f"score must be None, a callable (outputs, batch) -> scalar, NoisyMean or "
                       f"DpScore, got {self.score!r}")
    if self.inputs is not None and not (callable(self.inputs) or isinstance(self.inputs, (str, int))):
      raise ValueError(f"inputs must be None, a key/index or a function batch -> inputs, got {self.inputs!r}")
    if not isinstance(self.has_aux, bool):
      raise ValueError(f"has_aux must be a bool, got {self.has_aux!r}")
    if isinstance(self.static, str) or not all(isinstance(s, str) for s in self.static):
      raise ValueError(f"static must be a tuple of hyperparameter names, got {self.static!r}")
    object.__setattr__(self, "static", tuple(self.static))
    if self.clipping not in CLIPPING_METHODS:
      raise ValueError(f"clipping must be one of {CLIPPING_METHODS}, got {self.clipping!r}")
    trainable_lib.check_spec(self.trainable)
    if self.extrapolate is not None and not callable(self.extrapolate):
      raise ValueError(f"extrapolate must be None or a callable (hparams, m, n) -> hparams, "
                       f"got {self.extrapolate!r}")

  # -- the pieces the trainer uses -------------------------------------------

  @property
  def private_score(self) -> bool:
    """True if the score is DP and reads the private validation split."""
    return isinstance(self.score, PRIVATE_SCORES)

  @property
  def score_event(self) -> Optional[dp_accounting.DpEvent]:
    """The DpEvent of one scoring (None for a public score)."""
    return self.score.event if self.private_score else None

  def model_for(self, hparams: Mapping[str, Any]) -> Model:
    """The `Model` for these (static) hyperparameters."""
    model = self.model
    if not isinstance(model, (nn.Module, Model)):
      model = model(hparams)
    if isinstance(model, nn.Module):
      return Model(model.init, model.apply)
    if isinstance(model, Model):
      return model
    raise ValueError(f"the model factory of task {self.name!r} must return a flax.linen.Module or a "
                     f"jaxdp.train.Model, got {type(model).__name__}")

  def model_reads(self, hparams: Mapping[str, Any]) -> set:
    """Names the model factory reads from `hparams` (empty for a fixed model)."""
    if isinstance(self.model, (nn.Module, Model)):
      return set()
    tracked = HParams(hparams)
    self.model_for(tracked)
    return tracked.read

  def concrete_hparams(self, hparams: Mapping[str, Any], names: Sequence[str], params: PyTree, *,
                       num_steps: Optional[int] = None) -> dict[str, str]:
    """Which of `names` (floats about to be traced) the optimizer needs concrete: name -> why.

    optax builds some optimizers with Python control flow on their arguments
    (e.g. `warmup_cosine_decay_schedule` compares its peak with 0), which a
    traced value cannot take. The factory is built and run (`init` and one
    `update` on `params`, shapes only) with `names` traced; a name whose
    tracing alone fails with a concretization error, in the factory or in
    `init`/`update`, must be static (one compilation per value); `why` says
    so in plain words. A value read only where it can stay traced (arithmetic,
    e.g. in a schedule closure `lambda t: -hp["learning_rate"] * f(t)`, or
    `jaxdp.train.schedules`) stays traced. Any other failure is left to
    `check_task`, which names it. `num_steps`: the run's T (`HParams.num_steps`;
    None: `STAND_IN_STEPS`).
    """
    steps = STAND_IN_STEPS if num_steps is None else num_steps

    def failure(traced_names) -> Optional[str]:
      where = ["the optimizer factory"]

      def build(values, p):
        opt = self.optimizer_for(HParams({**hparams, **values}, num_steps=steps))
        where[0] = "the optimizer's init"
        state = opt.init(p)
        where[0] = "the optimizer's update"
        opt.update(p, state, p)
      scalars = {n: jax.ShapeDtypeStruct((), jnp.float32) for n in traced_names}
      try:
        jax.eval_shape(build, scalars, params)
      except _CONCRETIZATION_ERRORS as err:
        return _concrete_reason(err, where[0])
      except Exception:  # pylint: disable=broad-except
        return None
      return None

    if not names or failure(names) is None:
      return {}
    out = {}
    for name in names:
      why = failure([name])
      if why is not None:
        out[name] = why
    rest = [n for n in names if n not in out]
    if rest and failure(rest) is not None:  # only together: keep them all concrete
      out.update({n: f"the optimizer needs {rest} as concrete values together (each alone may be "
                     "traced)" for n in rest})
    return out

  def split_hparams(self, hparams: Mapping[str, Any]) -> tuple[dict, dict]:
    """(static, traced): traced are the floats neither the model nor `static` claims
    (`jaxdp.train.LoopSpec` also makes static what `concrete_hparams` finds)."""
    claimed = self.model_reads(hparams) | set(self.static)
    static, traced = {}, {}
    for name, value in hparams.items():
      (traced if _is_float(value) and name not in claimed else static)[name] = value
    return static, traced

  def model_inputs(self, batch: PyTree) -> Any:
    if self.inputs is None:
      return default_inputs(batch)
    if callable(self.inputs):
      return self.inputs(batch)
    return batch[self.inputs]

  def per_example_loss(self, model: Model) -> Callable[[PyTree, PyTree], jax.Array]:
    """(params, batch) -> per-example losses (b,)."""
    def loss(params, batch):
      out = self.loss(model.apply(params, self.model_inputs(batch)), batch)
      return out[0] if self.has_aux else out
    return loss

  def public_score(self, outputs, batch) -> jax.Array:
    """The selection score on public data (the task's plain score, or -mean loss)."""
    if self.score is None or self.private_score:
      losses = self.loss(outputs, batch)
      return -jnp.mean(losses[0] if self.has_aux else losses)
    return self.score(outputs, batch)

  def trainable_mask(self, params: PyTree) -> PyTree:
    """Python bools shaped like `params`: True where a leaf trains (see `trainable`)."""
    return trainable_lib.mask(self.trainable, params)

  def optimizer_for(self, hparams: Mapping[str, Any]) -> optax.GradientTransformation:
    opt = self.optimizer(hparams)
    if not isinstance(opt, optax.GradientTransformation):
      raise ValueError(f"the optimizer factory of task {self.name!r} must return an "
                       f"optax.GradientTransformation, got {type(opt).__name__}")
    return opt


def scale_learning_rate(name: str = "learning_rate") -> Callable[[Mapping, int, int], dict]:
  """Koskela-Kulkarni's DP-SGD extrapolation: hparams[name] x n / m.

  DP-SGD's update is the clipped-gradient sum divided by the expected batch
  q*N; keeping the noise-to-signal ratio per step from m tuning examples to n
  final ones multiplies the learning rate by n/m (KK 2023, Sec. 4). It assumes
  the data set sizes m and n are public. Adam-type optimizers are scale
  invariant: use `keep_hparams` for them.
  """
  def extrapolate(hparams, m, n):
    out = dict(hparams)
    out[name] = hparams[name] * n / m
    return out
  return extrapolate


def keep_hparams(hparams: Mapping[str, Any], m: int, n: int) -> dict:
  """The identity extrapolation (scale-invariant optimizers such as Adam)."""
  del m, n
  return dict(hparams)



def real_hparam(name: str, value: Any) -> Any:
  """Checks a float hyperparameter is finite (Python numbers only; others pass)."""
  if _is_float(value) and not math.isfinite(float(value)):
    raise ValueError(f"hyperparameter {name!r} must be finite, got {value!r}")
  if isinstance(value, numbers.Number) and not isinstance(value, (bool, numbers.Real)):
    raise ValueError(f"hyperparameter {name!r} must be real, got {value!r}")
  return value

