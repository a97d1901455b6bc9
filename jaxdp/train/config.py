"""A candidate's configuration: its task, its privacy parameters, its hyperparameters.

`TrainConfig` is what one candidate trains: the `Task`, the privacy-relevant
fields that determine its DpEvent (clip norm, noise multiplier, Poisson rate
or expected batch size, steps or epochs, delta) and the hyperparameters the
task's factories read; `ExecutionConfig` holds the performance-only settings.
`config.dp_event(N)` is built by the same `DpSgdPlan` the trainer runs, and
`epsilon(config, N)` accounts it through `jaxdp.accounting` with
`EPSILON_METHOD`. N is the declared public training set size
(`jaxdp.data.Dataset.num_examples`), never read from the rows.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Mapping, Optional

import dp_accounting

from jaxdp import _validate
from jaxdp._cache import LruCache
from jaxdp import accounting as acc
from jaxdp.accounting import events as acc_events
from jaxdp.train import clipping
from jaxdp.train.plan import DpSgdPlan
from jaxdp.train.sampling import validate_batch_sizes
from jaxdp.train.task import STAND_IN_STEPS, HParams, Task, real_hparam, trace_optimizer

#: The method behind every `CandidateResult.epsilon` and `TrainConfig.epsilon`:
#: one candidate's RDP epsilon (a search's is `TunedResult.epsilon`, by "best").
EPSILON_METHOD = "rdp"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExecutionConfig:
  """Performance-only settings: they never change what is computed or its privacy.

  Each setting changes at most the order in which float sums are added (so
  the last bits of the parameters), never which examples are sampled, how
  they are clipped, the noise, or the DpEvent.

  Attributes:
    padded_batch_size: the batch the microbatch size is chosen for; None
      picks qN + 4 std of Binomial(N, q). A step computes only the
      microbatches holding sampled rows, and larger sampled batches are
      still fully processed by extra microbatches.
    microbatch_size: rows per vectorised per-example-gradient call (bounds
      memory); None chooses it from the model and the device
      (`jaxdp.train.microbatching`: about `budget_bytes(device)` per
      microbatch, the padded batch split into the fewest equal parts within
      it). It changes only the order of a sum, never what is computed.
    eval_batch_size: rows per model call when scoring.
    data_parallel: how many devices share each candidate's batch in the
      sweep engine (`jaxdp.sweep.train_candidates`, which every tuner uses):
      data parallelism. The devices draw the same Poisson sample, each clips
      the per-example gradients of a disjoint share of its microbatches, and
      the clipped sums are added across devices before the noise, which is
      drawn once per step (the same draw on every device). The `DpSgdPlan`,
      its DpEvent and epsilon are those of one device; only the order of the
      float additions in the clipped sum changes (and the engine may cut the
      common path into smaller microbatches, one equal share per device).
      None (default): automatic (`jaxdp.sweep.engine.data_parallel_degree`:
      used when a group has fewer candidates than devices). An int >= 1: that
      many devices per candidate; it must divide the number of devices the
      engine uses, or the engine raises ValueError before any training.
      `jaxdp.train.train_candidate` runs one candidate on one device and
      does not read it.
    checkpoint_every: how often a candidate that trains with a checkpoint
      directory (a tuner's or `run_sweep`'s `run_dir`) saves its loop state
      (`jaxdp.sweep.checkpoints`), so that a run killed mid-candidate resumes
      from its last checkpoint rather than step 0. An int S >= 1: every S DP
      steps. None (default): by wall time, about every
      `jaxdp.sweep.checkpoints.AUTO_SECONDS` (10 minutes) of a candidate's
      training (a candidate shorter than that never saves one). 0: never.
      Not read without a checkpoint directory. Performance only: a resumed
      candidate continues with the same samples and noise, through the same
      compiled step, so it computes the bits of an uninterrupted run.
  """
  padded_batch_size: int | None = None
  microbatch_size: int | None = None
  eval_batch_size: int = 1000
  data_parallel: int | None = None
  checkpoint_every: int | None = None

  def __post_init__(self):
    if self.padded_batch_size is not None:
      _validate.integer("padded_batch_size", self.padded_batch_size, low=1)
    if self.microbatch_size is not None:
      _validate.integer("microbatch_size", self.microbatch_size, low=1)
    if self.padded_batch_size is not None and self.microbatch_size is not None:
      validate_batch_sizes(self.padded_batch_size, self.microbatch_size)
    _validate.integer("eval_batch_size", self.eval_batch_size, low=1)
    if self.data_parallel is not None:
      object.__setattr__(self, "data_parallel",
                         _validate.integer("data_parallel", self.data_parallel, low=1))
    if self.checkpoint_every is not None:
      object.__setattr__(self, "checkpoint_every",
                         _validate.integer("checkpoint_every", self.checkpoint_every, low=0))


class UncheckedHparamsWarning(UserWarning):
  """A task's factory takes its hyperparameters wholesale: unused names cannot be detected."""


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
    l2_clip_norm: per-example clip norm C in [2^-20, 2^40], the sensitivity of the summed
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
    # The float32 clipping bound holds for C in this range (jaxdp.train.clipping).
    _validate.real("l2_clip_norm", self.l2_clip_norm, low=clipping.MIN_CLIP_NORM, high=clipping.MAX_CLIP_NORM)
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
    # T is known here unless it needs N (batch_size with epochs): then the check runs on a
    # stand-in and the run's own T is checked when the run is built.
    check_hparams(self.task, self.hparams,
                  num_steps=None if self.sampling_prob is None and self.steps is None
                  else self.num_steps_for(None))

  def replace(self, **changes) -> "TrainConfig":
    """A copy with fields and/or hyperparameters changed, by name.

    Config fields are replaced (setting `steps` clears `epochs`, `batch_size`
    clears `sampling_prob`, and the reverse); any other name sets a
    hyperparameter.
    """
    fields = {k: v for k, v in changes.items()
              if k in CONFIG_FIELDS or k in ("task", "hparams", "execution")}
    for name in list(fields):
      # Setting one of an exclusive pair clears the other, unless both are set.
      if name in _EXCLUSIVE and _EXCLUSIVE[name] not in fields:
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
    """Epsilon of one candidate at `target_delta` (`jaxdp.accounting`, method `EPSILON_METHOD`)."""
    return epsilon(self, num_examples)


def check_hparams(task: Task, hparams: Mapping[str, Any], num_steps: Optional[int] = None) -> None:
  """Builds the task's model and optimizer on concrete values; every name must be read.

  A name is read when the model factory or the optimizer factory reads it, or
  when the optimizer's `init` or `update` does (a schedule closure such as
  `lambda t: -hp["learning_rate"] * f(t)` reads it at each update): these
  run traced on stand-in parameters (shapes only; `jaxdp.train.task.STAND_IN_PARAMS`)
  when the factories alone leave a name unread. The optimizer factory gets
  `hp.num_steps` = `num_steps`, the run's T (None: not known before N is,
  a stand-in; a factory that then fails is checked on the run's T when the
  run is built).

  Raises:
    ValueError: a factory fails for these values, or a hyperparameter is read
      by none of them (naming it), before anything trains.
  """
  model_hp = HParams(hparams)
  opt_hp = HParams(hparams, num_steps=STAND_IN_STEPS if num_steps is None else num_steps)
  what = "model"
  try:
    task.model_for(model_hp)
    what = "optimizer"
    opt = task.optimizer_for(opt_hp)
  except Exception as err:  # a user's factory may raise anything
    if what == "optimizer" and num_steps is None and opt_hp.num_steps_read:
      return  # it may fail for the stand-in T only: the run's T is checked when the run is built
    if isinstance(err, ValueError):
      raise ValueError(f"task {task.name!r}: the {what} factory rejects hyperparameters {hparams}: "
                       f"{err}") from err
    raise ValueError(f"task {task.name!r}: the {what} factory fails for hyperparameters {hparams}: "
                     f"{type(err).__name__}: {err}") from err
  if model_hp.enumerated or opt_hp.enumerated:
    # dict(hp) / **hp read every name through the mapping: that says nothing
    # about which of them the factory then uses.
    warnings.warn(f"task {task.name!r}: a factory iterates over its hyperparameters (dict(hp), **hp or "
                  f"hp.items()), so jaxdp cannot check that each of {sorted(hparams)} is used; read "
                  "them by name (hp['learning_rate']) to keep that check", UncheckedHparamsWarning,
                  stacklevel=4)
  read = model_hp.read | opt_hp.read
  if not set(hparams) - read:
    return
  # The rest may be read at update time (a schedule closure): run init and one update, shapes only.
  failed = trace_optimizer(opt)
  read = model_hp.read | opt_hp.read
  unread = sorted(set(hparams) - read)
  if not unread:
    return
  if failed is not None:
    if num_steps is None and opt_hp.num_steps_read:
      return  # it may fail for the stand-in T only
    warnings.warn(f"task {task.name!r}: no factory reads hyperparameter(s) {unread}, and the optimizer's "
                  f"init and update could not run on stand-in parameters to see whether they read them "
                  f"({type(failed).__name__}: {str(failed).splitlines()[0] if str(failed) else ''}); "
                  "jaxdp cannot check that they are used. Read them in the factory (lr = "
                  "hp['learning_rate'], then use lr) to keep that check", UncheckedHparamsWarning,
                  stacklevel=4)
    return
  raise ValueError(f"hyperparameter(s) {unread} are not read by task {task.name!r}: neither its model "
                   f"factory, its optimizer factory nor the optimizer's init and update (schedules "
                   f"included) read them (they read {sorted(read & set(hparams))}), so tuning them "
                   "would change nothing. Remove them or use them in the task")


_EPSILONS = LruCache(4096)


def epsilon(config: TrainConfig, num_examples: Optional[int] = None) -> float:
  """Epsilon of one run at `config.target_delta` by `EPSILON_METHOD` (inf if sigma = 0).

  Remembered by event (the engine asks once per candidate, and a search's
  candidates share a handful of events): accounting is deterministic, so the
  remembered number is the one a fresh accountant gives.
  """
  event, delta = config.dp_event(num_examples), float(config.target_delta)
  key = acc_events.event_key(event)
  memo = (key, delta, EPSILON_METHOD)
  found = None if key is None else _EPSILONS.get(memo)
  if found is None:
    found = float(acc.epsilon(event, delta, method=EPSILON_METHOD))
    if key is not None:
      _EPSILONS.put(memo, found)
  return found
