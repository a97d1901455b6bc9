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

import functools
import math
import os
import time
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from tqdm.auto import tqdm

from jaxdp import _validate
from jaxdp.data import Dataset
from jaxdp.sweep.space import Candidate
from jaxdp.train import trainer as tr


def _group_key(cand: Candidate, data: Dataset) -> tr.LoopSpec:
  return tr.LoopSpec.from_config(cand.config, data)


def _param_shapes(spec: tr.LoopSpec, train) -> list:
  return jax.tree.leaves(jax.eval_shape(functools.partial(tr.init_params, spec), jax.random.key(0), train))


def auto_candidates_per_device(spec: tr.LoopSpec, device: jax.Device, train) -> int:
  """How many candidates one device trains at once when the caller does not say.

  CPU: 1. Measured with `benchmarks/sweep_throughput.py` (jax 0.10, 2-core
  Xeon): vmapping candidates on one host device costs 1.3-1.5x the time of
  running them one after the other, for CNNs and MLPs alike, so the
  parallelism comes from host devices, one candidate each (see the module
  docstring). Other platforms: as many as fit a quarter of the device
  memory, one candidate costing a microbatch of per-example working set
  (`jaxdp.train.microbatching`) plus parameters and optimizer state.
  """
  if device.platform == "cpu":
    return 1
  shapes = _param_shapes(spec, train)
  per_example = tr.per_example_bytes(spec, train) or 4 * sum(math.prod(x.shape) for x in shapes)
  per_candidate = per_example * spec.microbatch_size + 4 * 8 * sum(math.prod(x.shape) for x in shapes)
  stats = device.memory_stats() or {}
  budget = stats.get("bytes_limit", 8 << 30) // 4
  return int(max(1, min(256, budget // max(per_candidate, 1))))


@functools.lru_cache(maxsize=32)
def _program(spec: tr.LoopSpec, devices: tuple, per_device: int):
  """The jitted program for one chunk of `per_device * len(devices)` candidates."""
  run = functools.partial(tr.run_candidate, spec)
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


def _compiled_batch(spec: tr.LoopSpec, devices: tuple, per_device: int, args: tuple):
  """(executable, seconds spent compiling it now: 0.0 when it was cached)."""
  return tr.compile_cached(_program(spec, devices, per_device), args)


def _chunk_inputs(candidates, part: list, chunk: int, n: int, spec: tr.LoopSpec, mesh: Mesh):
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


def train_candidates(candidates: Sequence[Candidate], data: Dataset, *,
                     max_candidates_per_device: Optional[int] = None,
                     devices: Optional[Sequence[jax.Device]] = None,
                     keep_params: bool = False, progress: bool = False,
                     on_chunk: Optional[Callable[[list], None]] = None) -> list:
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
  for c in candidates:
    if not isinstance(c, Candidate):
      raise ValueError(f"candidates must be Candidate objects, got {type(c).__name__}")
  for task in {id(c.config.task): c.config.task for c in candidates}.values():
    tr.check_data(task, data)
  if max_candidates_per_device is not None:
    _validate.integer("max_candidates_per_device", max_candidates_per_device, low=1)
  devices = tuple(devices) if devices is not None else tuple(jax.devices())
  if not devices:
    raise ValueError("devices must not be empty")

  groups: dict = {}
  for i, cand in enumerate(candidates):
    groups.setdefault(_group_key(cand, data), []).append(i)
  for spec in groups:  # every group's task fits the data before any group trains
    tr.check_task(spec, data)

  n = data.num_examples
  results: list = [None] * len(candidates)
  bar = tqdm(total=len(candidates), disable=not progress, desc="candidates", unit="cand")
  mesh = Mesh(np.array(devices), ("candidates",))
  # Once per call, replicated on every device: no host round-trip per chunk.
  splits = jax.device_put(tr.device_splits(data), NamedSharding(mesh, P()))
  pending = None
  last_done = time.perf_counter()

  def finish(job):
    nonlocal last_done
    part, outputs, dispatched, compile_s = job
    out, score, test_score, test_loss = outputs
    out = jax.tree.map(np.asarray, out) if keep_params else tr.LoopOutput(
        params=None, steps=np.asarray(out.steps), finite=np.asarray(out.finite))
    score, test_score, test_loss = np.asarray(score), np.asarray(test_score), np.asarray(test_loss)
    now = time.perf_counter()
    elapsed = (now - max(dispatched, last_done)) / len(part)
    last_done = now
    done = []
    for j, i in enumerate(part):
      params = jax.tree.map(lambda leaf, j=j: leaf[j], out.params) if keep_params else None
      one = tr.LoopOutput(params=params, steps=out.steps[j], finite=out.finite[j])
      results[i] = tr.result_of(candidates[i].config, n, one, score[j], test_score[j], test_loss[j],
                                elapsed, params=params, compile_time_s=compile_s)
      done.append((candidates[i], results[i]))
    if on_chunk is not None:
      on_chunk(done)
    bar.update(len(part))

  for g, (spec, idx) in enumerate(groups.items()):
    per_dev = max_candidates_per_device or auto_candidates_per_device(spec, devices[0], splits[0])
    per_dev = min(per_dev, math.ceil(len(idx) / len(devices)))
    chunk = per_dev * len(devices)
    compile_s = None
    for start in range(0, len(idx), chunk):
      part = idx[start:start + chunk]
      args = (*_chunk_inputs(candidates, part, chunk, n, spec, mesh), *splits)
      if compile_s is None:
        bar.set_postfix_str(f"compiling group {g + 1}/{len(groups)}")
        program, compile_s = _compiled_batch(spec, devices, per_dev, args)
        bar.set_postfix_str(f"group {g + 1}/{len(groups)} compiled in {compile_s:.1f} s")
      dispatched = time.perf_counter()
      outputs = program(*args)  # asynchronous: returns before the devices finish
      if pending is not None:
        finish(pending)
      pending = (part, outputs, dispatched, compile_s)
  if pending is not None:
    finish(pending)
  bar.close()
  return results


def host_device_flag(n: Optional[int] = None) -> str:
  """The XLA flag that exposes `n` (default: all cores) CPU cores as devices.

  It only works if set before JAX initialises its backend, so entry points set
  `os.environ["XLA_FLAGS"]` with it at start-up.
  """
  n = n or os.cpu_count() or 1
  return f"--xla_force_host_platform_device_count={int(n)}"
