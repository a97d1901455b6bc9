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

On CPUs XLA runs a model vmapped over a parameter axis more slowly than the
same candidates one by one, so the automatic default there is one candidate
per device (which then runs the lone program, without vmap) and the
parallelism comes from the devices: start Python with
`XLA_FLAGS=--xla_force_host_platform_device_count=<cores>` (the experiments do
this) to expose each core as a device. On accelerators the default packs as
many candidates per device as fit a quarter of its memory.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from typing import Callable, Iterator, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from tqdm.auto import tqdm

from jaxdp import _validate
from jaxdp._cache import LruCache
from jaxdp.data import Dataset
from jaxdp.sweep.space import Candidate
from jaxdp.train import checks, program
from jaxdp.train.program import LoopOutput, LoopSpec
from jaxdp.train.trainer import CandidateResult, device_splits, result_of

# Memory model of one candidate on an accelerator (`auto_candidates_per_device`):
# float32 parameters, and about 8 parameter-sized float32 buffers around them
# (parameters, gradient sum, noise, update, two Adam moments, the loop carry's
# copies), on top of one microbatch of per-example working set.
_FLOAT_BYTES = 4
_PARAMETER_COPIES = 8
_MEMORY_SHARE = 4          # candidates may take a quarter of the device memory
_UNKNOWN_MEMORY = 8 << 30  # a device that reports no memory limit
_MAX_PER_DEVICE = 256      # vmapping more buys nothing measurable


def _param_shapes(spec: LoopSpec, train) -> list:
  return jax.tree.leaves(jax.eval_shape(functools.partial(program.init_params, spec),
                                        jax.random.key(0), train))


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
  size = sum(math.prod(x.shape) for x in _param_shapes(spec, train))
  per_example = program.per_example_bytes(spec, train) or _FLOAT_BYTES * size
  per_candidate = per_example * spec.microbatch_size + _FLOAT_BYTES * _PARAMETER_COPIES * size
  budget = (device.memory_stats() or {}).get("bytes_limit", _UNKNOWN_MEMORY) // _MEMORY_SHARE
  return int(max(1, min(_MAX_PER_DEVICE, budget // max(per_candidate, 1))))


def _build_program(spec: LoopSpec, devices: tuple, per_device: int):
  """The jitted program for one chunk of `per_device * len(devices)` candidates."""
  run = functools.partial(program.run_candidate, spec)
  if per_device == 1:
    # One candidate per device runs the lone program itself: under vmap its
    # while loops and conds would become selects over the candidate axis,
    # which costs time and gains nothing for a single candidate.
    def fn(plan, traced, keys, train, test, validation):
      one = jax.tree.map(lambda x: x[0], (plan, traced, keys))
      return jax.tree.map(lambda x: x[None], run(*one, train, test, validation))
  else:
    # The very program `train_candidate` runs, vmapped: a batched candidate
    # equals a lone run given `candidate.key()`.
    fn = jax.vmap(run, in_axes=(0, 0, 0, None, None, None))
  mesh = Mesh(np.array(devices), ("candidates",))
  # Each device trains its own candidates; nothing crosses devices, so the
  # replication checks (which reject the init params in the loop carry) are off.
  fn = jax.shard_map(fn, mesh=mesh, in_specs=(P("candidates"), P("candidates"), P("candidates"),
                                              P(), P(), P()),
                     out_specs=P("candidates"), check_vma=False)
  return jax.jit(fn)


_PROGRAMS = LruCache(32)


def _compiled_chunk(spec: LoopSpec, devices: tuple, per_device: int, args: tuple):
  """(executable, seconds spent compiling it now: 0.0 when it was cached)."""
  jitted = _PROGRAMS.get_or_build((spec, devices, per_device),
                                  lambda: _build_program(spec, devices, per_device))
  return program.compile_cached(jitted, args)


@dataclasses.dataclass(frozen=True)
class _Group:
  """Candidates (by index) that share one `LoopSpec`, hence one compiled program."""
  spec: LoopSpec
  indices: list


@dataclasses.dataclass(frozen=True)
class _Job:
  """A dispatched chunk: its candidates, its (not yet fetched) outputs, when it left."""
  indices: list
  outputs: tuple
  dispatched: float
  compile_time_s: float


def _check_arguments(candidates, data: Dataset, max_candidates_per_device, devices) -> tuple:
  """The devices to use, after checking every argument (nothing trains before)."""
  for c in candidates:
    if not isinstance(c, Candidate):
      raise ValueError(f"candidates must be Candidate objects, got {type(c).__name__}")
  for task in {id(c.config.task): c.config.task for c in candidates}.values():
    checks.check_data(task, data)
  if max_candidates_per_device is not None:
    _validate.integer("max_candidates_per_device", max_candidates_per_device, low=1)
  devices = tuple(devices) if devices is not None else tuple(jax.devices())
  if not devices:
    raise ValueError("devices must not be empty")
  return devices


def _groups(candidates, data: Dataset) -> list:
  """Candidates grouped by `LoopSpec`, in first-seen order; every group's task is
  checked against the data before any group trains."""
  by_spec: dict = {}
  for i, cand in enumerate(candidates):
    by_spec.setdefault(LoopSpec.from_config(cand.config, data), []).append(i)
  for spec in by_spec:
    checks.check_task(spec, data)
  return [_Group(spec, indices) for spec, indices in by_spec.items()]


def _chunk_inputs(candidates, part: list, chunk: int, n: int, spec: LoopSpec, mesh: Mesh):
  """(plans, traced hyperparameters, keys) of one chunk, sharded over the candidate axis."""
  padded = part + [part[-1]] * (chunk - len(part))  # copies fill the last chunk: one compilation
  configs = [candidates[i].config for i in padded]
  plans = [c.plan(n).for_device() for c in configs]
  plan = jax.tree.map(lambda *xs: np.asarray(xs, np.float32), *plans)
  traced = {name: np.asarray([c.hparams[name] for c in configs], np.float32)
            for name in spec.traced_names}
  # Keyed by (grid point, seed): equal seeds at two points must not share noise.
  keys = jnp.stack([candidates[i].key() for i in padded])
  return jax.device_put((plan, traced, keys), NamedSharding(mesh, P("candidates")))


def _dispatch_group(group: _Group, candidates, data: Dataset, splits: tuple, mesh: Mesh,
                    per_device: int, bar) -> Iterator[_Job]:
  """Dispatches the group's chunks one by one (asynchronously: each returns at once)."""
  devices = tuple(mesh.devices.flat)
  chunk = per_device * len(devices)
  compile_s = None
  for start in range(0, len(group.indices), chunk):
    part = group.indices[start:start + chunk]
    args = (*_chunk_inputs(candidates, part, chunk, data.num_examples, group.spec, mesh), *splits)
    if compile_s is None:
      bar.set_postfix_str("compiling")
      executable, compile_s = _compiled_chunk(group.spec, devices, per_device, args)
      bar.set_postfix_str(f"compiled in {compile_s:.1f} s")
    dispatched = time.perf_counter()
    yield _Job(part, executable(*args), dispatched, compile_s)


class _Collector:
  """Turns finished jobs into `CandidateResult`s in the input order, and hands each
  chunk's results to `on_chunk` as soon as they are there."""

  def __init__(self, candidates, num_examples: int, keep_params: bool,
               on_chunk: Optional[Callable[[list], None]], bar):
    self.candidates, self.num_examples, self.keep_params = candidates, num_examples, keep_params
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
      self.results[i] = result_of(self.candidates[i].config, self.num_examples, one, score[j],
                                  test_score[j], test_loss[j], elapsed, params=params,
                                  compile_time_s=job.compile_time_s)
      done.append((self.candidates[i], self.results[i]))
    if self.on_chunk is not None:
      self.on_chunk(done)
    self.bar.update(len(job.indices))


def train_candidates(candidates: Sequence[Candidate], data: Dataset, *,
                     max_candidates_per_device: Optional[int] = None,
                     devices: Optional[Sequence[jax.Device]] = None,
                     keep_params: bool = False, progress: bool = False,
                     on_chunk: Optional[Callable[[list], None]] = None) -> list[CandidateResult]:
  """Trains every candidate; returns `CandidateResult`s in the input order.

  Chunks are dispatched asynchronously: while the devices train one chunk,
  the host turns the previous chunk's outputs into results and hands them to
  `on_chunk`. The data are copied to the devices once per call.

  Args:
    candidates: the candidates (grid point, config, seed).
    data: a `jaxdp.data.Dataset`: private train split; the score reads the
      public test split (or, for a DP score, the private validation split).
    max_candidates_per_device: candidates vmapped on one device at once; None
      picks `auto_candidates_per_device`.
    devices: devices to shard the candidate axis over (default: all).
    keep_params: keep each candidate's final parameters in its result.
    progress: show a progress bar with ETA (and each group's compile time).
    on_chunk: called with the list of (candidate, result) pairs of every chunk
      as soon as it finishes (the durable pool appends them to disk).

  Returns:
    One `jaxdp.train.CandidateResult` per candidate; `wall_time_s` is the
    chunk's wall time (from when the devices could start it to its results)
    divided by its number of candidates, and `compile_time_s` is the time
    spent compiling its group's program in this call (0.0 if it was cached).
  """
  devices = _check_arguments(candidates, data, max_candidates_per_device, devices)
  groups = _groups(candidates, data)
  mesh = Mesh(np.array(devices), ("candidates",))
  # Once per call, replicated on every device: no host round-trip per chunk.
  splits = jax.device_put(device_splits(data), NamedSharding(mesh, P()))
  with tqdm(total=len(candidates), disable=not progress, desc="candidates", unit="cand") as bar:
    collector = _Collector(candidates, data.num_examples, keep_params, on_chunk, bar)
    pending = None
    for g, group in enumerate(groups):
      bar.set_description(f"candidates (group {g + 1}/{len(groups)})")
      per_device = max_candidates_per_device or auto_candidates_per_device(group.spec, devices[0],
                                                                            splits[0])
      per_device = min(per_device, math.ceil(len(group.indices) / len(devices)))
      for job in _dispatch_group(group, candidates, data, splits, mesh, per_device, bar):
        if pending is not None:
          collector.finish(pending)  # the host's work overlaps the job just dispatched
        pending = job
    if pending is not None:
      collector.finish(pending)
  return collector.results


def host_device_flag(n: Optional[int] = None) -> str:
  """The XLA flag that exposes `n` (default: all cores) CPU cores as devices.

  It only works if set before JAX initialises its backend, so entry points set
  `os.environ["XLA_FLAGS"]` with it at start-up.
  """
  n = n or os.cpu_count() or 1
  return f"--xla_force_host_platform_device_count={int(n)}"
