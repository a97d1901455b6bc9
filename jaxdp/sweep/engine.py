"""Train many DP-SGD candidates inside one compiled program.

Candidates that share every static property (model, sampling rate -> padded
batch, number of steps, optimizer, ...: a `LoopSpec`) form a group. Within a
group the per-candidate hyperparameters (learning rate, clip norm, noise
multiplier, weight decay) and PRNG keys are arrays with a leading candidate
axis: the trainer's pure inner loop is `vmap`ped over that axis, and the axis
is split across all devices with `shard_map`. Groups are cut into chunks of
`n_devices * candidates_per_device`; the last chunk is padded with copies so
every chunk reuses one compilation.

On CPUs XLA's convolutions batch poorly over a parameter axis, so the
automatic default there is one candidate per device and the parallelism comes
from the devices: start Python with
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
from jax.sharding import Mesh, PartitionSpec as P
from tqdm.auto import tqdm

from jaxdp import _validate
from jaxdp.data import Dataset
from jaxdp.sweep.space import Candidate
from jaxdp.train import trainer as tr

_TINY_MODELS = ("logreg", "mlp")


def _group_key(cand: Candidate, data: Dataset):
  spec = tr.LoopSpec.from_config(cand.config, data)
  return spec, cand.config.execution.eval_batch_size


def auto_candidates_per_device(spec: tr.LoopSpec, device: jax.Device) -> int:
  """How many candidates one device trains at once when the caller does not say.

  CPU: 1 (vmap over a parameter axis is slower than running candidates on
  separate host devices), except tiny dense models, which batch well. Other
  platforms: as many as fit a quarter of the device memory, estimating one
  candidate as its per-example gradients for a microbatch plus optimizer state.
  """
  if device.platform == "cpu":
    return 8 if spec.model in _TINY_MODELS else 1
  shapes = jax.eval_shape(functools.partial(tr.init_params, spec), jax.random.key(0))
  n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))
  per_candidate = 4 * n_params * (spec.microbatch_size + 8)
  stats = device.memory_stats() or {}
  budget = stats.get("bytes_limit", 8 << 30) // 4
  return int(max(1, min(256, budget // max(per_candidate, 1))))


@functools.lru_cache(maxsize=32)
def _compiled_batch(spec: tr.LoopSpec, eval_batch_size: int, devices: tuple):
  loop = tr.build_train_loop(spec)
  evaluate = tr.build_evaluate(spec, eval_batch_size)

  def one(hparams, key, x, y, test_x, test_y):
    # Same key use as `train_candidate`, so a batched candidate equals a lone
    # run given `candidate.key()`.
    init_key, loop_key = jax.random.split(key)
    out = loop(tr.init_params(spec, init_key), hparams, loop_key, x, y)
    accuracy, loss = evaluate(out.params, test_x, test_y)
    return out, accuracy, loss

  fn = jax.vmap(one, in_axes=(0, 0, None, None, None, None))
  if len(devices) > 1:
    mesh = Mesh(np.array(devices), ("candidates",))
    # Each device trains its own candidates; nothing crosses devices, so the
    # replication checks (which reject the init params in the loop carry) are off.
    fn = jax.shard_map(fn, mesh=mesh, in_specs=(P("candidates"), P("candidates"), P(), P(), P(), P()),
                       out_specs=P("candidates"), check_vma=False)
  return jax.jit(fn)


@functools.lru_cache(maxsize=256)
def _epsilon_of(config: tr.TrainConfig) -> float:
  return tr.epsilon(config)


def train_candidates(candidates: Sequence[Candidate], data: Dataset, *,
                     max_candidates_per_device: Optional[int] = None,
                     devices: Optional[Sequence[jax.Device]] = None,
                     keep_params: bool = False, progress: bool = False,
                     on_chunk: Optional[Callable[[list], None]] = None) -> list:
  """Trains every candidate; returns `CandidateResult`s in the input order.

  Args:
    candidates: the candidates (grid point, config, seed).
    data: training data (private) and test data (public, used for the score).
    max_candidates_per_device: candidates vmapped on one device at once; None
      picks `auto_candidates_per_device`.
    devices: devices to shard the candidate axis over (default: all).
    keep_params: keep each candidate's final parameters in its result.
    progress: show a progress bar with ETA.
    on_chunk: called with the list of (candidate, result) pairs of every chunk
      as soon as it finishes (the durable pool appends them to disk).

  Returns:
    One `jaxdp.train.CandidateResult` per candidate; `wall_time_s` is the
    chunk's wall time divided by its number of candidates.
  """
  if not isinstance(data, Dataset):
    raise ValueError(f"data must be a jaxdp.data.Dataset, got {type(data).__name__}")
  for c in candidates:
    if not isinstance(c, Candidate):
      raise ValueError(f"candidates must be Candidate objects, got {type(c).__name__}")
  if max_candidates_per_device is not None:
    _validate.integer("max_candidates_per_device", max_candidates_per_device, low=1)
  devices = tuple(devices) if devices is not None else tuple(jax.devices())
  if not devices:
    raise ValueError("devices must not be empty")

  groups: dict = {}
  for i, cand in enumerate(candidates):
    groups.setdefault(_group_key(cand, data), []).append(i)

  train_x = jnp.asarray(data.train.inputs, jnp.float32)
  train_y = jnp.asarray(data.train.labels, jnp.int32)
  test_x = jnp.asarray(data.test.inputs, jnp.float32)
  test_y = jnp.asarray(data.test.labels, jnp.int32)
  results: list = [None] * len(candidates)
  bar = tqdm(total=len(candidates), disable=not progress, desc="candidates", unit="cand")
  for (spec, eval_bs), idx in groups.items():
    tr.check_model_input(spec)
    per_dev = max_candidates_per_device or auto_candidates_per_device(spec, devices[0])
    per_dev = min(per_dev, math.ceil(len(idx) / len(devices)))
    chunk = per_dev * len(devices)
    fn = _compiled_batch(spec, eval_bs, devices)
    for start in range(0, len(idx), chunk):
      part = idx[start:start + chunk]
      padded = part + [part[-1]] * (chunk - len(part))
      t0 = time.perf_counter()
      hps = [candidates[i].config.hparams() for i in padded]
      hparams = tr.HParams(*(jnp.stack(x) for x in zip(*hps)))
      # Keyed by (grid point, seed): equal seeds at two points must not share noise.
      keys = jnp.stack([candidates[i].key() for i in padded])
      out, accuracy, loss = fn(hparams, keys, train_x, train_y, test_x, test_y)
      accuracy, loss = np.asarray(accuracy), np.asarray(loss)
      finite, steps = np.asarray(out.finite), np.asarray(out.steps)
      elapsed = (time.perf_counter() - t0) / len(part)
      done = []
      for j, i in enumerate(part):
        cfg = candidates[i].config
        diverged = not (bool(finite[j]) and math.isfinite(float(loss[j])))
        acc_j = float("nan") if diverged else float(accuracy[j])
        params = jax.tree.map(lambda leaf, j=j: leaf[j], out.params) if keep_params else None
        results[i] = tr.CandidateResult(
            score=acc_j, test_accuracy=acc_j, test_loss=float("nan") if diverged else float(loss[j]),
            steps=int(steps[j]), planned_steps=cfg.num_steps, epsilon=_epsilon_of(cfg),
            delta=float(cfg.target_delta), diverged=diverged, wall_time_s=elapsed, params=params)
        done.append((candidates[i], results[i]))
      if on_chunk is not None:
        on_chunk(done)
      bar.update(len(part))
  bar.close()
  return results


def host_device_flag(n: Optional[int] = None) -> str:
  """The XLA flag that exposes `n` (default: all cores) CPU cores as devices.

  It only works if set before JAX initialises its backend, so entry points set
  `os.environ["XLA_FLAGS"]` with it at start-up.
  """
  n = n or os.cpu_count() or 1
  return f"--xla_force_host_platform_device_count={int(n)}"
