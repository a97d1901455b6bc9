"""Trainers: how a search's candidates train, here or on a Ray cluster (the tuners' `trainer=`).

A trainer is an object with two methods (`Trainer`): `check(plan)`, which a
tuner calls before anything is drawn (so whether a call fails never depends
on K), and `__call__(candidates, plan, ...)`, which trains them and returns
their results in order, calling `on_chunk` as each chunk ends (a durable
store writes it there). What a trainer holds is how to run, never what runs:
two trainers train a candidate to the same results (bit for bit on the same
machine and layout), so a search started on one host resumes on a cluster.

  - `LocalTrainer`: this host's devices (the batched engine for a task's plan,
    one call after another for a training function's);
  - `RayTrainer`: chunks of candidates as Ray tasks, each run by its own
    `LocalTrainer` on the devices its worker sees (`pip install jaxdp[ray]`).
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from typing import Any, Callable, Optional, Protocol, Sequence

import jax

from jaxdp import _validate
from jaxdp.sweep import engine, ray_backend
from jaxdp.sweep.functions import FunctionPlan, train_functions
from jaxdp.sweep.plan import SearchPlan
from jaxdp.sweep.space import Candidate
from jaxdp.train import compilation_cache

OnChunk = Callable[[list], None]


class Trainer(Protocol):
  """What trains a plan's candidates (see the module docstring)."""

  def check(self, plan: SearchPlan) -> None:
    """Raises ValueError unless this trainer can train `plan`'s candidates."""

  def __call__(self, candidates: Sequence[Candidate], plan: SearchPlan, *, keep_params: bool = True,
               search_size: Optional[int] = None, on_chunk: Optional[OnChunk] = None,
               checkpoint_dir: Optional[str] = None) -> list:
    """One result per candidate, in order; `on_chunk([(candidate, result), ...])` as each chunk
    ends, before this trainer's own `on_chunk`. `search_size`: the number of candidates the
    layout is chosen for (a resume trains part of a search in the whole's layout);
    `checkpoint_dir`: where candidates checkpoint (a durable store's)."""


def _warn_on_chunk(on_chunk: Optional[OnChunk]) -> None:
  if on_chunk is not None and not callable(on_chunk):
    raise ValueError(f"on_chunk must be a callable or None, got {on_chunk!r}")
  if on_chunk is not None:
    # As a search's unreleased part: what the callback sees is the whole search, not its release.
    warnings.warn("on_chunk receives every trained candidate and its result (its score, its key "
                  "or seed, and so how many there are): none of it is covered by the reported "
                  "epsilon; keep what it sees as secret as the data", stacklevel=4)


def _then(first: Optional[OnChunk], then: Optional[OnChunk]) -> Optional[OnChunk]:
  """`first`, then `then` (a store writes a chunk before the user's callback sees it)."""
  if first is None or then is None:
    return first or then

  def both(chunk):
    first(chunk)
    then(chunk)
  return both


@dataclasses.dataclass(frozen=True)
class LocalTrainer:
  """Trains candidates on this host.

  Args:
    devices: the jax devices to shard a task's candidates over (None: all). Each candidate
      uses `ExecutionConfig.data_parallel` of them.
    max_candidates_per_device: a task's candidates vmapped on one device at once (None:
      `jaxdp.sweep.auto_candidates_per_device`).
    progress: a progress bar (the share done and the time, never a count: `jaxdp.sweep.progress`).
    on_chunk: called with [(candidate, result), ...] as each chunk ends. It sees every
      candidate, which epsilon does not cover (it warns).

  A training function picks its own devices: `devices` and `max_candidates_per_device` must
  then be None (`check`).
  """
  devices: Optional[Sequence[jax.Device]] = None
  max_candidates_per_device: Optional[int] = None
  progress: bool = False
  on_chunk: Optional[OnChunk] = dataclasses.field(default=None, compare=False)

  def __post_init__(self):
    devices = engine.check_options(self.max_candidates_per_device, self.devices, self.progress)
    if self.devices is not None:
      object.__setattr__(self, "devices", devices)
    _warn_on_chunk(self.on_chunk)

  def check(self, plan: SearchPlan) -> None:
    """A task's layout fits the devices (`engine.check_layout`); a training function is given
    no devices."""
    if isinstance(plan, FunctionPlan):
      if self.devices is not None or self.max_candidates_per_device is not None:
        raise ValueError("devices and max_candidates_per_device are options of jaxdp's training "
                         "engine; a TrainFunction picks its own devices: give LocalTrainer() "
                         "without them")
      return
    engine.check_layout(plan, self.devices)

  def __call__(self, candidates: Sequence[Candidate], plan: SearchPlan, *, keep_params: bool = True,
               search_size: Optional[int] = None, on_chunk: Optional[OnChunk] = None,
               checkpoint_dir: Optional[str] = None) -> list:
    on_chunk = _then(on_chunk, self.on_chunk)
    if isinstance(plan, FunctionPlan):
      if checkpoint_dir is not None:
        raise ValueError("checkpoint_dir must be None for a training function: it checkpoints "
                         "itself, if at all")
      return train_functions(candidates, plan, keep_params=keep_params, progress=self.progress,
                             on_chunk=on_chunk)
    return engine.train_candidates(
        candidates, plan, devices=self.devices, max_candidates_per_device=self.max_candidates_per_device,
        keep_params=keep_params, progress=self.progress, on_chunk=on_chunk, search_size=search_size,
        checkpoint_dir=checkpoint_dir)

  def compile_unrun(self, stand_in: Candidate, plan: SearchPlan) -> None:
    """A search that drew no candidate compiles, without running, the program one of
    `stand_in`'s plan would write to the persistent compilation cache (`engine.compile_unrun`):
    the entries do not tell K = 0 from K >= 1. A training function's are never written."""
    if not isinstance(plan, FunctionPlan):
      engine.compile_unrun(stand_in, plan, devices=self.devices,
                           max_candidates_per_device=self.max_candidates_per_device)


@dataclasses.dataclass(frozen=True)
class _Unwritten:
  """A Ray worker's `LocalTrainer`, its programs never written to the persistent cache: which
  workers get a chunk, and its layout (`search_size`), depend on K."""
  local: LocalTrainer

  def __call__(self, *args, **kwargs) -> list:
    with compilation_cache.unwritten():
      return self.local(*args, **kwargs)


@dataclasses.dataclass(frozen=True)
class RayTrainer:
  """Trains candidates in Ray tasks of `chunk_size` candidates, on one machine or a cluster.

  Each task runs `local` on its chunk, on whatever devices its worker sees, and a chunk's
  results are handed to `on_chunk` (a durable store writes them) as its task finishes, so a
  killed task loses at most its chunk, and one Ray retries after its node was lost resumes
  its candidates from their checkpoints.

  Args:
    chunk_size: candidates per task (>= 1).
    num_cpus, num_gpus: resources each task asks Ray for.
    address: the cluster to join when Ray is not initialised yet ("auto", or "host:port" of a
      head started with `ray start --head`); None starts a local instance.
    max_retries: how many times Ray reruns a task whose worker or node died (the rerun trains
      the same candidates with the same keys: the same results).
    progress: a progress bar on the driver.
    on_chunk: called on the driver with [(candidate, result), ...] as each task finishes (it
      warns, as `LocalTrainer`'s).
    local: the `LocalTrainer` each worker runs (its `devices` must be None: a worker has its
      own; `max_candidates_per_device` applies per worker).

  Raises:
    ValueError: a bad option, before anything runs.
  """
  chunk_size: int = 4
  num_cpus: float = 1
  num_gpus: float = 0
  address: Optional[str] = None
  max_retries: int = 3
  progress: bool = False
  on_chunk: Optional[OnChunk] = dataclasses.field(default=None, compare=False)
  local: LocalTrainer = LocalTrainer()

  def __post_init__(self):
    _validate.integer("chunk_size", self.chunk_size, low=1)
    _validate.real("num_cpus", self.num_cpus, low=0.0)
    _validate.real("num_gpus", self.num_gpus, low=0.0)
    _validate.integer("max_retries", self.max_retries, low=0)
    if not isinstance(self.local, LocalTrainer):
      raise ValueError(f"local must be a LocalTrainer, got {type(self.local).__name__}")
    if self.local.devices is not None:
      raise ValueError("local.devices names this process's jax devices, which a Ray task does "
                       "not have: each task trains on the devices its worker sees (num_gpus= "
                       "asks Ray for them)")
    ray_backend.check_address(self.address)
    engine.check_options(progress=self.progress)
    _warn_on_chunk(self.on_chunk)

  def check(self, plan: SearchPlan) -> None:
    """Ray is installed, `address` answers and the plan can be sent to the workers (each
    worker lays out its own devices)."""
    ray_backend.require_ray()
    ray_backend.check_reachable(self.address)
    ray_backend.check_shippable(plan)

  def __call__(self, candidates: Sequence[Candidate], plan: SearchPlan, *, keep_params: bool = True,
               search_size: Optional[int] = None, on_chunk: Optional[OnChunk] = None,
               checkpoint_dir: Optional[str] = None) -> list:
    plan.check_candidates(candidates)
    # Every task lays out a full chunk (or the whole, smaller search), so a candidate gets the
    # same bits in whichever chunk it lands: the short last chunk, or a rerun of what a crash
    # left missing.
    layout = min(self.chunk_size, search_size or self.chunk_size)
    worker = _Unwritten(dataclasses.replace(self.local, progress=False, on_chunk=None))
    return ray_backend.run_chunks(
        candidates, plan, worker, dict(keep_params=keep_params, search_size=layout,
                                       checkpoint_dir=checkpoint_dir),
        options=self, on_chunk=_then(on_chunk, self.on_chunk))


def default_trainer(trainer: Any) -> Trainer:
  """`trainer`, or a `LocalTrainer()` for None; ValueError for what is not a trainer (a callable
  with `Trainer.__call__`'s signature is one: its `check` is optional)."""
  if trainer is None:
    return LocalTrainer()
  message = (f"trainer must be None, a jaxdp.sweep.LocalTrainer or RayTrainer (or a callable "
             f"with their __call__'s signature), got {trainer!r:.200}")
  if isinstance(trainer, type) or not callable(trainer):  # a class is callable, not a trainer
    raise ValueError(message)
  try:  # now, not when the first candidate trains: whether a call fails must not depend on K
    inspect.signature(trainer).bind([], None, keep_params=True, search_size=1, on_chunk=None,
                                    checkpoint_dir=None)
  except TypeError as err:
    raise ValueError(f"{message}: {err}") from None
  except ValueError:  # no signature to read (a builtin): it is called as it is
    pass
  return trainer


def check(trainer: Trainer, plan: SearchPlan) -> None:
  """`trainer.check(plan)` where it has one: what a tuner asks before anything is drawn."""
  checker = getattr(trainer, "check", None)
  if callable(checker):
    checker(plan)
