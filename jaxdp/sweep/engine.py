"""Train many DP-SGD candidates of any task inside one compiled program.

Candidates that share every static property (task, static hyperparameters
such as model width or optimizer name, sampling rate -> padded batch, number
of steps, data shapes: a `LoopSpec`) form a group. Within a group the traced
hyperparameters (clip norm and noise multiplier in the `DpSgdPlan`, and every
float the task's optimizer reads: learning rate, weight decay, ...) and the
PRNG keys are arrays with a leading candidate axis: the trainer's pure
program is `vmap`ped over that axis, and the axis is split across all devices
with `shard_map`. Groups are cut into chunks of
`n_devices * candidates_per_device`; the last chunk is padded with copies so
every chunk reuses one compilation.

Data parallelism: a group with fewer candidates than devices would leave
devices idle, so each candidate's batch is shared out over P devices (the
mesh is ("candidates", "data") with P devices on "data";
`data_parallel_degree` picks P, `ExecutionConfig(data_parallel=...)` sets
it). The devices of one candidate hold its parameters and optimizer state
replicated, draw the same Poisson sample, clip and sum disjoint shares of its
microbatches, add the shares (`psum`) and then draw the same noise from the
same key: one DP-SGD step of the candidate's `DpSgdPlan`, whose DpEvent is
what is accounted (see `jaxdp.train.program.build_train_loop`). Only the order
of float additions differs from one device.

On CPUs XLA runs a model vmapped over a parameter axis more slowly than the
same candidates one by one, so the automatic default there is one candidate
per device (which then runs the lone program, without vmap) and the
parallelism comes from the devices: start Python with
`XLA_FLAGS=--xla_force_host_platform_device_count=<cores>` (the experiments do
this) to expose each core as a device. On accelerators the default packs as
many candidates per device as fit a quarter of its memory.

Checkpoints: every chunk runs `jaxdp.train.program.run_segment`, one compiled
program whose stop is traced. Without `checkpoint_dir` a chunk is one segment
to the last step; with it, a chunk resumes its candidates from their newest
checkpoints and stops at the cadence its configurations ask for
(`ExecutionConfig.checkpoint_every`) to save them (`jaxdp.sweep.checkpoints`):
the same steps through the same program, so the same bits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import time
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxdp import _validate
from jaxdp._cache import LruCache
from jaxdp.data import Dataset
from jaxdp.sweep import checkpoints
from jaxdp.sweep.task_plan import TaskPlan, task_plan_of
from jaxdp.sweep.chunk_saver import ChunkSaver
from jaxdp.sweep.progress import candidates_bar
from jaxdp.sweep.space import Candidate, candidate_keys
from jaxdp.train import compilation_cache
from jaxdp.train import padding
from jaxdp.train import program
from jaxdp.train import loop_spec
from jaxdp.train.program import LoopOutput
from jaxdp.train.loop_spec import LoopSpec
from jaxdp.train.run_plan import RunPlan
from jaxdp.train.trainer import CandidateResult, device_splits, result_of

# Memory model of one candidate on an accelerator (`auto_candidates_per_device`):
# float32 parameters, and about 11 parameter-sized float32 buffers around them
# (parameters, gradient sum, noise, update, two Adam moments, the loop carry's
# copies, and the segment's input state: parameters and two moments), on top of
# one microbatch of per-example working set.
_FLOAT_BYTES = 4
_PARAMETER_COPIES = 11
_MEMORY_SHARE = 4          # candidates may take a quarter of the device memory
_UNKNOWN_MEMORY = 8 << 30  # a device that reports no memory limit
_MAX_PER_DEVICE = 256      # vmapping more buys nothing measurable


def auto_candidates_per_device(spec: LoopSpec, device: jax.Device, train) -> int:
  """How many candidates one device trains at once when the caller does not say.

  CPU: 1. Measured with `benchmarks/sweep_throughput.py` (jax 0.10, 2-core
  Xeon): vmapping candidates on one host device costs 1.3-1.5x the time of
  running them one after the other, for CNNs and MLPs alike, so the
  parallelism comes from host devices, one candidate each (see the module
  docstring). Other platforms: as many as fit a quarter of the device
  memory, one candidate costing a microbatch of per-example working set
  (`jaxdp.train.microbatching`) plus `_PARAMETER_COPIES` of its parameters.
  """
  if device.platform == "cpu":
    return 1
  size = sum(math.prod(x.shape) for x in jax.tree.leaves(program.param_shapes(spec, train)))
  per_example = loop_spec.per_example_bytes(spec, train) or _FLOAT_BYTES * size
  per_candidate = per_example * spec.microbatch_size + _FLOAT_BYTES * _PARAMETER_COPIES * size
  budget = (device.memory_stats() or {}).get("bytes_limit", _UNKNOWN_MEMORY) // _MEMORY_SHARE
  return int(max(1, min(_MAX_PER_DEVICE, budget // max(per_candidate, 1))))


def data_parallel_degree(requested: Optional[int], num_candidates: int, num_devices: int) -> int:
  """How many devices share each candidate's batch: the data-parallel degree P.

  Args:
    requested: `ExecutionConfig.data_parallel`: an int, or None for automatic.
    num_candidates: candidates in the group (they share one compiled program),
      or the whole search's (`train_candidates`'s `search_size`).
    num_devices: devices the engine uses, D.

  Returns:
    `requested` if given. Automatic: when num_candidates < D, the largest
    divisor P of D with P <= D // num_candidates (so D / P >= num_candidates
    candidate slots, and every device busy when num_candidates divides D);
    otherwise 1 (the devices are already busy with whole candidates).

  Raises:
    ValueError: `requested` is not an integer in [1, D] that divides D (the
      devices form a (D / P) x P mesh).
  """
  num_devices = _validate.integer("num_devices", num_devices, low=1)
  if requested is not None:
    degree = _validate.integer("data_parallel", requested)
    divisors = [p for p in range(1, num_devices + 1) if num_devices % p == 0]
    if degree not in divisors:
      raise ValueError(f"data_parallel must be an integer in [1, {num_devices}] that divides the "
                       f"{num_devices} devices the engine uses (one of {divisors}), got {requested!r}")
    return degree
  num_candidates = _validate.integer("num_candidates", num_candidates, low=1)
  if num_candidates >= num_devices:
    return 1
  most = num_devices // num_candidates
  return max(p for p in range(1, most + 1) if num_devices % p == 0)


def _mesh(devices: tuple, data_parallel: int) -> Mesh:
  """Devices as a (D / P) x P mesh: consecutive devices share a candidate."""
  return Mesh(np.array(devices).reshape(len(devices) // data_parallel, data_parallel),
              ("candidates", "data"))


def _build_program(spec: LoopSpec, devices: tuple, per_device: int, data_parallel: int):
  """The jitted `program.run_segment` for one chunk of `per_device * len(devices) / data_parallel`
  candidates."""
  # Data parallelism is an axis name for the pure program: it shares out the
  # batch and adds the clipped shares before the noise (build_train_loop).
  run = functools.partial(program.run_segment, spec,
                          axis_name="data" if data_parallel > 1 else None)
  # Per candidate: plan, hyperparameters, key, state, fresh. Shared: the data, the public
  # start, the stop.
  batched = (True, True, True, False, False, False, False, True, True, False)
  if per_device == 1:
    # One candidate per device runs the lone program itself: under vmap its
    # while loops and conds would become selects over the candidate axis,
    # which costs time and gains nothing for a single candidate.
    def fn(*args):
      args = [jax.tree.map(lambda x: x[0], a) if b else a for a, b in zip(args, batched)]
      return jax.tree.map(lambda x: x[None], run(*args))
  else:
    # The very program `train_candidate` runs, vmapped: a batched candidate
    # equals a lone run given `candidate.key()`.
    fn = jax.vmap(run, in_axes=tuple(0 if b else None for b in batched))
  # Candidates are split over "candidates" and replicated over "data": every
  # device of a candidate gets its plan, hyperparameters, key and state, and
  # returns the same (replicated) outputs. Only the clipped-gradient psum
  # crosses devices, so the replication checks (which reject the init params
  # in the loop carry) are off.
  fn = jax.shard_map(fn, mesh=_mesh(devices, data_parallel),
                     in_specs=tuple(P("candidates") if b else P() for b in batched),
                     out_specs=P("candidates"), check_vma=False)
  return jax.jit(fn)


_PROGRAMS = LruCache(32)


def _compiled_chunk(spec: LoopSpec, devices: tuple, per_device: int, data_parallel: int,
                    args: tuple, persist: bool):
  """(executable, seconds spent compiling it now: 0.0 when it was cached). `persist`: whether
  the program may be written to the persistent compilation cache (`_persistable`)."""
  jitted = _PROGRAMS.get_or_build((spec, devices, per_device, data_parallel),
                                  lambda: _build_program(spec, devices, per_device, data_parallel))
  return program.compile_cached(jitted, args, persist=persist and padding.persistable(spec.task))


def _persistable(plan: TaskPlan, group: "_Group", largest: int, num_devices: int) -> bool:
  """Whether every search on this plan compiles this program, whatever it drew: K and which
  candidates are secret, and whether an entry is written must not tell them. So the plan has
  one program, and the layout is the same for every K >= 1: one candidate per device
  (`largest` == 1, CPU's default), and a data-parallel degree given, or one device (the
  automatic degree is chosen for K). A layout chosen for K is never written (a limitation:
  on an accelerator `largest` is usually above 1)."""
  programs = {(run.spec, run.config.execution.data_parallel) for run in plan.runs}
  requested = group.run.config.execution.data_parallel
  return len(programs) == 1 and largest == 1 and (requested is not None or num_devices == 1)


@dataclasses.dataclass(frozen=True)
class _Group:
  """Candidates (by index) that share one `LoopSpec` and data-parallel degree, hence one
  compiled program. With data parallelism the spec's common path is cut into a multiple
  of `data_parallel` microbatches (`LoopSpec.for_data_parallel`)."""
  spec: LoopSpec
  indices: list
  run: RunPlan
  data_parallel: int = 1


@dataclasses.dataclass(frozen=True)
class _Job:
  """A dispatched chunk: its candidates, its (not yet fetched) outputs, when it left, and the
  step each resumed candidate's training picked up from (candidate index -> step)."""
  indices: list
  outputs: tuple
  dispatched: float
  compile_time_s: float
  resumed: dict


def check_options(max_candidates_per_device: Optional[int] = None,
                  devices: Optional[Sequence[jax.Device]] = None, progress: bool = False,
                  on_chunk: Optional[Callable[[list], None]] = None) -> tuple:
  """The devices to use, after checking the engine's options (tuners check theirs here too,
  before anything is drawn)."""
  if max_candidates_per_device is not None:
    _validate.integer("max_candidates_per_device", max_candidates_per_device, low=1)
  if devices is not None and (isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence)
                              or not devices or not all(isinstance(d, jax.Device) for d in devices)):
    empty = " (devices must not be empty)" if isinstance(devices, Sequence) and not devices else ""
    raise ValueError(f"devices must be a non-empty sequence of jax.Device (None: all), got "
                     f"{devices!r}{empty}")
  if not isinstance(progress, (bool, np.bool_)):
    raise ValueError(f"progress must be a bool (True or False), got {progress!r}")
  if on_chunk is not None and not callable(on_chunk):
    raise ValueError(f"on_chunk must be a callable or None, got {on_chunk!r}")
  return tuple(devices) if devices is not None else tuple(jax.devices())


def check_layout(plan: TaskPlan, devices: Optional[Sequence[jax.Device]] = None) -> None:
  """Raises ValueError unless every run's `ExecutionConfig.data_parallel` divides the devices
  this engine would use: a tuner asks before it draws, so the failure never depends on K."""
  num_devices = len(check_options(devices=devices))
  for run in plan.runs:
    data_parallel_degree(run.config.execution.data_parallel, 1, num_devices)


def _groups(candidates, plan: TaskPlan, num_devices: int, search_size: Optional[int]) -> list:
  """Candidates grouped by `LoopSpec` and `ExecutionConfig.data_parallel`, in first-seen
  order, from the plan's runs. The automatic degree is chosen for `search_size` candidates
  (default: the group's) and checked for every group before any trains."""
  by_spec: dict = {}
  for i, cand in enumerate(candidates):
    run = plan.run_of(cand.config)
    by_spec.setdefault((run.spec, cand.config.execution.data_parallel), (run, []))[1].append(i)
  groups = []
  for (spec, requested), (run, indices) in by_spec.items():
    degree = data_parallel_degree(requested, search_size or len(indices), num_devices)
    groups.append(_Group(spec.for_data_parallel(degree), indices, run, degree))
  return groups


def _chunk_inputs(candidates, padded: list, plan: TaskPlan, spec: LoopSpec, sharding):
  """(DP-SGD plans, traced hyperparameters, keys) of one chunk, sharded over the candidate axis
  (and replicated over the data axis)."""
  configs = [candidates[i].config for i in padded]
  dp_plan = jax.tree.map(lambda *xs: np.asarray(xs, np.float32),
                         *[plan.run_of(c).dp_plan for c in configs])
  traced = {name: np.asarray([c.hparams[name] for c in configs], np.float32)
            for name in spec.traced_names}
  # Keyed by (grid point, seed): equal seeds at two points must not share noise.
  keys = candidate_keys([candidates[i] for i in padded])
  return jax.device_put((dp_plan, traced, keys), sharding)


class _Cadence:
  """When a chunk's loop stops to save checkpoints (`ExecutionConfig.checkpoint_every`).

  S >= 1: after every step that is a multiple of S. 0: never. None: by wall
  time: a first segment of `checkpoints.PROBE_STEPS` steps is timed (once per
  group), then segments of about `checkpoints.AUTO_SECONDS` each.
  """

  def __init__(self, every: Optional[int]):
    self.every = every
    self.seconds_per_step: Optional[float] = None

  @property
  def probing(self) -> bool:
    return self.every is None and self.seconds_per_step is None

  def next_stop(self, at: int, total: int) -> int:
    if self.every == 0:
      return total
    if self.every is not None:
      return min(total, (at // self.every + 1) * self.every)
    if self.seconds_per_step is None:
      return min(total, at + checkpoints.PROBE_STEPS)
    return min(total, at + max(1, int(checkpoints.AUTO_SECONDS / max(self.seconds_per_step, 1e-9))))


def _cadence(group: "_Group", candidates) -> _Cadence:
  """A group's cadence: the most frequent any of its configurations asks for (0 = never)."""
  asked = {candidates[i].config.execution.checkpoint_every for i in group.indices}
  fixed = sorted(a for a in asked if a)
  return _Cadence(fixed[0] if fixed else (None if None in asked else 0))


def _layout(group: "_Group", candidates, plan: TaskPlan, splits: tuple, devices: tuple,
            per_device: int) -> tuple:
  """What a group's chunks share: (sharding, candidates per chunk, `arguments(inputs, state,
  fresh, stop)` the program's arguments, the empty state, its device copy with the fresh rows)."""
  mesh = _mesh(devices, group.data_parallel)
  chunk = per_device * mesh.shape["candidates"]
  sharding = NamedSharding(mesh, P("candidates"))
  train, test, validation = splits
  initial = group.run.initial
  if initial is not None:  # replicated once per group
    initial = jax.device_put(initial, NamedSharding(mesh, P()))
  # What a fresh candidate's state input is (ignored by the program): on the devices once.
  key_dtype = candidates[group.indices[0]].key().dtype  # a search's candidates share its impl
  empty = program.empty_state(group.spec, plan.data.train, rows=chunk, key_dtype=key_dtype)
  empty_on_device = jax.device_put((empty, np.ones(chunk, bool), np.zeros(chunk, bool)), sharding)

  def arguments(inputs, state, fresh, stop) -> tuple:
    return (*inputs, train, test, validation, initial, state, fresh, np.int32(stop))
  return sharding, chunk, arguments, empty, empty_on_device


def _dispatch_group(group: _Group, candidates, plan: TaskPlan, splits: tuple, devices: tuple,
                    per_device: int, bar, saver: Optional[ChunkSaver], persist: bool) -> Iterator[_Job]:
  """Dispatches the group's chunks one by one. Without checkpoints each returns at once (the
  devices run asynchronously); with them, a chunk stops after each segment to save."""
  sharding, chunk, arguments, empty, empty_on_device = _layout(group, candidates, plan, splits,
                                                               devices, per_device)
  executable, compile_s = None, 0.0

  def compiled(args):
    nonlocal executable, compile_s
    if executable is None:
      bar.set_postfix_str("compiling")
      executable, compile_s = _compiled_chunk(group.spec, devices, per_device, group.data_parallel,
                                              args, persist)
      bar.set_postfix_str(f"compiled in {compile_s:.1f} s")
    return executable

  def run(inputs, state, fresh, stop):
    args = arguments(inputs, state, fresh, stop)
    return compiled(args)(*args)

  total = group.spec.num_steps
  cadence = _cadence(group, candidates)
  for start in range(0, len(group.indices), chunk):
    part = group.indices[start:start + chunk]
    padded = part + [part[-1]] * (chunk - len(part))  # copies fill the last chunk: one compilation
    inputs = _chunk_inputs(candidates, padded, plan, group.spec, sharding)
    dispatched = time.perf_counter()
    state, fresh, not_fresh = empty_on_device
    resumed = {}
    if saver is not None:
      restored, rows, resumed = saver.resume(padded, empty)
      if resumed:
        state, fresh = jax.device_put((restored, rows), sharding)
    if saver is None:
      state, scores = run(inputs, state, fresh, total)
    else:
      step = lambda state, fresh, stop: run(inputs, state, fresh, stop)
      warm = lambda state, fresh, stop: compiled(arguments(inputs, state, fresh, stop))
      state, scores = _segments(step, warm, state, (fresh, not_fresh), padded, resumed, cadence,
                                saver, total)
    yield _Job(part, (program.output(state), *scores), dispatched, compile_s, resumed)


def _segments(step, warm, state, fresh: tuple, padded: list, resumed: dict, cadence: _Cadence,
              saver: ChunkSaver, total: int) -> tuple:
  """(state, scores) of a chunk run to `total` as segments of the one compiled program, saving
  checkpoints at the cadence's stops: where the loop stops changes nothing it computes.

  `step(state, fresh, stop)` runs the program to `stop`; `warm` compiles it without running
  (so a probe times the step, not its compilation nor the queue); `fresh` is (the first
  segment's freshness rows, every later segment's).
  """
  first, later = fresh
  at = min(resumed.get(i, 0) for i in padded)
  while at < total:
    stop = cadence.next_stop(at, total)
    probing = cadence.probing
    if probing:
      warm(state, first, stop)
      jax.block_until_ready(state)
      began = time.perf_counter()
    state, scores = step(state, first, stop)
    first = later
    if probing:
      jax.block_until_ready(state)
      cadence.seconds_per_step = (time.perf_counter() - began) / (stop - at)
    elif stop < total:
      saver.save(padded, state, stop)
    at = stop
  return state, scores


class _Collector:
  """Turns finished jobs into `CandidateResult`s in the input order, and hands each
  chunk's results to `on_chunk` as soon as they are there."""

  def __init__(self, candidates, plan: TaskPlan, keep_params: bool,
               on_chunk: Optional[Callable[[list], None]], bar, saver: Optional[ChunkSaver]):
    self.candidates, self.plan, self.keep_params, self.saver = candidates, plan, keep_params, saver
    self.on_chunk, self.bar = on_chunk, bar
    self.results: list = [None] * len(candidates)
    self.last_done = time.perf_counter()

  def finish(self, job: _Job) -> None:
    out, score, test_score, test_loss = job.outputs
    if not self.keep_params:
      out = out._replace(params=None)
    out, score, test_score, test_loss = jax.tree.map(np.asarray, (out, score, test_score, test_loss))
    now = time.perf_counter()
    # The chunk's time from when the devices could start it, shared by its candidates.
    elapsed = (now - max(job.dispatched, self.last_done)) / len(job.indices)
    self.last_done = now
    done = []
    for j, i in enumerate(job.indices):
      params = jax.tree.map(lambda leaf, j=j: leaf[j], out.params) if self.keep_params else None
      one = LoopOutput(params=params, steps=out.steps[j], finite=out.finite[j])
      self.results[i] = result_of(self.plan.run_of(self.candidates[i].config), one, score[j],
                                  test_score[j], test_loss[j], elapsed, params=params,
                                  compile_time_s=job.compile_time_s,
                                  resumed_step=job.resumed.get(i, 0))
      done.append((self.candidates[i], self.results[i]))
    if self.saver is not None:  # their last saves complete before anyone may remove them
      self.saver.store.release(self.candidates[i].id for i in job.indices)
    if self.on_chunk is not None:
      self.on_chunk(done)
    self.bar.update(len(job.indices))


def train_candidates(candidates: Sequence[Candidate], data: Union[Dataset, TaskPlan], *,
                     max_candidates_per_device: Optional[int] = None,
                     devices: Optional[Sequence[jax.Device]] = None,
                     keep_params: bool = False, progress: bool = False,
                     on_chunk: Optional[Callable[[list], None]] = None,
                     search_size: Optional[int] = None,
                     initial_params: Optional[Any] = None,
                     checkpoint_dir: Optional[str] = None) -> list[CandidateResult]:
  """Trains every candidate; returns their `CandidateResult` in the input order.

  Chunks are dispatched asynchronously: while the devices train one chunk,
  the host turns the previous chunk's outputs into results and hands them to
  `on_chunk`. The data are copied to the devices once per call.

  Args:
    candidates: the candidates (grid point, config, seed).
    data: the `jaxdp.sweep.TaskPlan` the candidates belong to (a tuner's:
      nothing is checked or derived again), or a `jaxdp.data.Dataset`
      (private train split; the score reads the public test split or, for a
      DP score, the private validation split), of which the plan is built
      here (`TaskPlan.for_candidates`).
    max_candidates_per_device: candidates vmapped on one device (or, with
      data parallelism, one group of devices) at once; None picks
      `auto_candidates_per_device`.
    devices: devices to shard the candidate axis over (default: all). Each
      candidate uses P of them (`ExecutionConfig.data_parallel`).
    keep_params: keep each candidate's final parameters in its result.
    progress: show a progress bar with ETA (and each group's compile time).
    on_chunk: called with the list of (candidate, result) pairs of every chunk
      as soon as it finishes (the durable pool appends them to disk).
    initial_params: None, or public parameters every candidate starts from:
      all of the model's or some (a pretrained backbone; the rest is
      initialised from each candidate's key), see
      `jaxdp.train.checks.check_initial_params`. Checked against every
      group's model before anything trains. Only with a `Dataset`: a
      `TaskPlan` holds its own.
    search_size: the number of candidates the automatic layout is chosen for
      (None: each group's own): the data-parallel degree P
      (`data_parallel_degree`) and how many candidates a chunk holds. The
      layout decides the order of float additions, hence the parameters'
      last bits. A caller that trains one search in several calls (a resume
      that trains only what is missing, Ray tasks) passes the whole search's
      size to every call: each candidate then runs in the same program and
      gets the same bits as in one call (a short call pads its chunk with
      copies).
    checkpoint_dir: None (no checkpoints), or the directory of the
      candidates' checkpoints (`jaxdp.sweep.checkpoints`; a durable store
      passes `<run_dir>/checkpoints`): every candidate resumes from its
      newest valid checkpoint there, and saves one as its configuration's
      `ExecutionConfig.checkpoint_every` asks. A resumed candidate computes
      what it computes uninterrupted (bit for bit on the same machine and
      layout). Checkpoints are not removed here (the store removes them once
      the candidate's record is stored).

  Returns:
    One `jaxdp.train.CandidateResult` per candidate; `wall_time_s` is the
    chunk's wall time (from when the devices could start it to its results)
    divided by its number of candidates, and `compile_time_s` is the time
    spent compiling its group's program in this call (0.0 if it was cached).

  Raises:
    ValueError: a bad argument, a task that does not fit the data, or an
      `ExecutionConfig.data_parallel` that does not divide the number of
      devices; before anything trains.
  """
  devices = check_options(max_candidates_per_device, devices, progress, on_chunk)
  plan = task_plan_of(candidates, data, initial_params)
  if search_size is not None:
    search_size = _validate.integer("search_size", search_size, low=1)
  if checkpoint_dir is not None and not isinstance(checkpoint_dir, (str, os.PathLike)):
    raise ValueError(f"checkpoint_dir must be None or a directory path, got {checkpoint_dir!r}")
  groups = _groups(candidates, plan, len(devices), search_size)
  mesh = Mesh(np.array(devices), ("devices",))
  # Once per call (and per way the tasks pad their validation split), replicated on every
  # device: no host round-trip per chunk.
  placed = {}

  def splits_of(task):
    how = (task.private_score, padding.validation_capacity(task))
    if how not in placed:
      placed[how] = _placed_splits(plan, task, mesh)
    return placed[how]
  store = None if checkpoint_dir is None else checkpoints.Checkpoints(checkpoint_dir)
  saver = None if store is None else ChunkSaver(store, plan, candidates)
  with contextlib.ExitStack() as stack, candidates_bar(len(candidates), progress) as bar:
    if store is not None:
      stack.enter_context(store)  # pending saves finish before the call returns
    collector = _Collector(candidates, plan, keep_params, on_chunk, bar, saver)
    pending = None
    for group in groups:
      splits = splits_of(group.spec.task)
      largest = max_candidates_per_device or auto_candidates_per_device(
          group.spec, devices[0], padding.rows_of(splits[0]))
      slots = len(devices) // group.data_parallel  # candidates trained side by side
      per_device = min(largest, math.ceil((search_size or len(group.indices)) / slots))
      persist = _persistable(plan, group, largest, len(devices))
      for job in _dispatch_group(group, candidates, plan, splits, devices, per_device, bar, saver,
                                 persist):
        if pending is not None:
          collector.finish(pending)  # the host's work overlaps the job just dispatched
        pending = job
    if pending is not None:
      collector.finish(pending)
  return collector.results


def _placed_splits(plan: TaskPlan, task, mesh: Mesh) -> tuple:
  """The data splits `task` reads, replicated on every device of `mesh`."""
  return jax.device_put(device_splits(plan.data, task), NamedSharding(mesh, P()))


def compile_unrun(stand_in: Candidate, plan: TaskPlan, *,
                  max_candidates_per_device: Optional[int] = None,
                  devices: Optional[Sequence[jax.Device]] = None) -> None:
  """Compiles, without running, the program `train_candidates` would write to the persistent
  compilation cache for a search of `stand_in`'s plan, if it writes one.

  A search that drew K = 0 calls it with any candidate of its plan (which trains nothing), so
  it leaves the entries a search of K >= 1 leaves: whether one is written tells nothing of K.
  """
  devices = check_options(max_candidates_per_device, devices)
  plan.check_candidates([stand_in])
  if compilation_cache.cache_dir() is None:
    return
  (group,) = _groups([stand_in], plan, len(devices), None)
  if not padding.persistable(group.spec.task):
    return
  splits = _placed_splits(plan, group.spec.task, Mesh(np.array(devices), ("devices",)))
  largest = max_candidates_per_device or auto_candidates_per_device(
      group.spec, devices[0], padding.rows_of(splits[0]))
  if not _persistable(plan, group, largest, len(devices)):
    return
  sharding, chunk, arguments, _, (state, fresh, _) = _layout(group, [stand_in], plan, splits,
                                                             devices, 1)
  inputs = _chunk_inputs([stand_in], [0] * chunk, plan, group.spec, sharding)
  _compiled_chunk(group.spec, devices, 1, group.data_parallel,
                  arguments(inputs, state, fresh, group.spec.num_steps), True)


def host_device_flag(n: Optional[int] = None) -> str:
  """The XLA flag that exposes `n` (default: all cores) CPU cores as devices.

  It only works if set before JAX initialises its backend, so entry points set
  `os.environ["XLA_FLAGS"]` with it at start-up.
  """
  n = n or os.cpu_count() or 1
  return f"--xla_force_host_platform_device_count={int(n)}"
