"""Ray's part of `jaxdp.sweep.trainers.RayTrainer`: chunks of candidates as Ray tasks, on one
machine or a cluster (`pip install jaxdp[ray]`).

Results reach the driver chunk by chunk as tasks finish (in completion order),
so a durable store fills its pool as a local search does, and a rerun after a
crash resumes from it. Each task runs the worker's `LocalTrainer` on its
chunk, on whatever devices its worker sees.
"""

from __future__ import annotations

import io
import socket
import sys
import warnings
from typing import Callable, Optional, Sequence

import jax
import numpy as np
from tqdm.auto import tqdm

from jaxdp._cache import LruCache
from jaxdp.sweep import checkpoints
from jaxdp.sweep.progress import candidates_bar


def require_ray():
  try:
    import ray  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ValueError("the Ray backend needs Ray: pip install 'jaxdp[ray]'") from None
  return ray


# What each worker process has deserialised, by object id: the candidates, the
# plan (data and public start included) and the engine's arguments of one call are
# put in Ray's object store once, and a worker turns them into objects once. Its tasks then share the same `Task` objects, hence
# (tasks compare by identity in a `LoopSpec`) the same compiled programs: only
# a worker's first chunk of a call compiles.
_SHARED = LruCache(2)
_POLL_S = 2.0  # how often the driver looks for lost nodes while it waits
#: JAX's warning when a process that uses it forks (`jax._src.xla_bridge._at_fork`).
_FORK_WARNING = r"os\.fork\(\) was called"


def _shared(box: list):
  """(candidates, plan, engine kwargs, checkpoint token) of the call whose object ref `box` holds
  (a list, so Ray passes the ref itself)."""
  ref = box[0]
  return _SHARED.get_or_build(ref.binary(), lambda: require_ray().get(ref))


def check_address(address: Optional[str]) -> Optional[tuple]:
  """(host, port) of a "host:port" address, None for None, "auto" and "local" (left to Ray).

  Raises:
    ValueError: any other form.
  """
  if address is None or address in ("auto", "local"):
    return None
  host, sep, port = str(address).removeprefix("ray://").rpartition(":")
  if not isinstance(address, str) or not sep or not port.isdigit():
    raise ValueError(f"address must be None, 'auto', 'local' or 'host:port' of a Ray head, got {address!r}")
  return host, int(port)


def check_shippable(plan) -> None:
  """Raises ValueError unless Ray can serialise `plan` (a training function holding a lock, a
  task closing over an open file): asked before anything is drawn, so such a search fails
  whatever K is, and Ray's own error, which would list the candidates drawn, never shows.
  Arrays are left out (they always serialise), so a large data set is not serialised twice."""
  from ray import cloudpickle  # pylint: disable=g-import-not-at-top

  class ShapesOnly(cloudpickle.CloudPickler):
    def reducer_override(self, obj):
      if isinstance(obj, (np.ndarray, jax.Array)):
        return np.zeros, ((),)
      return super().reducer_override(obj)

  try:
    ShapesOnly(io.BytesIO()).dump(plan)
  except Exception as err:  # pylint: disable=broad-except  # whatever the object's own pickling raises
    raise ValueError(f"the search cannot be sent to Ray workers: serialising its trainable "
                     f"failed ({type(err).__name__}: {str(err)[:200]}); a training function "
                     "and a task must be picklable by cloudpickle") from None


def check_reachable(address: Optional[str], timeout_s: float = 5.0) -> None:
  """Raises ValueError unless a TCP connection to a "host:port" address opens within `timeout_s`
  (nothing is checked once Ray is initialised: the address is then not used).

  `ray.init` itself retries an unreachable head for minutes; a user who gave
  a wrong address wants to hear it at once. None, "auto" and "local" are left
  to Ray (which answers those at once).
  """
  hostport = check_address(address)
  if hostport is None or require_ray().is_initialized():
    return
  host, port = hostport
  try:
    socket.create_connection((host, int(port)), timeout=timeout_s).close()
  except OSError as err:
    raise ValueError(f"cannot reach Ray at address={address!r} ({err.strerror or err}): is a head "
                     f"running there (`ray start --head --port={port}`)?") from None


def _train_chunk(box: list, indices: list) -> list:
  candidates, plan, worker, kwargs, token = _shared(box)
  if kwargs.get("checkpoint_dir") is not None:
    checkpoints.check_reachable(kwargs["checkpoint_dir"], token)
  return worker([candidates[i] for i in indices], plan, **kwargs)


def _alive_nodes(ray) -> dict:
  return {n["NodeID"]: n.get("NodeManagerAddress", "?") for n in ray.nodes() if n.get("Alive")}


def _report_lost(ray, nodes: dict, max_retries: int, checkpointed: bool) -> dict:
  """Says which of `nodes` Ray's GCS now reports dead; returns the nodes alive now."""
  alive = _alive_nodes(ray)
  for node in sorted(set(nodes) - set(alive)):
    how = ("from their candidates' checkpoints" if checkpointed
           else "from the start of their candidates (no run_dir: no checkpoints)")
    _say(f"Ray node {node[:12]} ({nodes[node]}) was lost; Ray retries the tasks it ran "
         f"(max_retries={max_retries}) {how}")
  return alive


def _say(line: str) -> None:
  tqdm.write(f"jaxdp: {line}", file=sys.stderr)


def run_chunks(candidates: Sequence, plan, worker: Callable, kwargs: dict, *, options,
               on_chunk: Optional[Callable[[list], None]]) -> list:
  """Trains `candidates` of `plan` in Ray tasks of `options.chunk_size` (a `RayTrainer`), each
  running `worker(chunk, plan, **kwargs)`; results in input order.

  The candidates, the plan, the worker and `kwargs` are put in Ray's object
  store once, and each worker deserialises them once per call. With a
  `checkpoint_dir` in `kwargs` (a durable store's `<run_dir>/checkpoints`) the
  workers write the candidates' checkpoints there, and a task that Ray retries
  after its worker or node was lost resumes them mid-way. On a multi-node
  cluster that directory must be storage every node reaches (a shared file
  system): each task checks that it sees the driver's (a token the driver
  writes there) before it trains, and fails with a ValueError naming its node
  otherwise.

  Output: one `jaxdp:` line on stderr per chunk whose candidates resumed from
  checkpoints, and one per Ray node lost during the call once Ray's GCS
  declares it dead (after `health_check_period_ms` x
  `health_check_failure_threshold`, about 15 s by default; Ray retries the
  lost tasks sooner, so a call that ends within that time shows the loss only
  as the resumed chunk's line). Neither names a candidate. Ray's own worker
  logs stay on the workers (`log_to_driver=False`). JAX's "os.fork() ... deadlock"
  warning is not shown when Ray starts here: Ray forks only to exec its own programs.

  Raises:
    ValueError: Ray is not installed, or the cluster at `options.address` cannot be reached
      (before any training).
  """
  ray = require_ray()
  if not ray.is_initialized():
    check_reachable(options.address)
    try:
      with warnings.catch_warnings():
        # Ray starts its own processes (GCS, raylet, ...) with subprocess.Popen(preexec_fn=...),
        # which runs Python's at-fork hooks, so JAX's hook warns that "os.fork() ... will likely
        # lead to a deadlock". It cannot here: the child only blocks SIGINT (and asks for its
        # parent's death signal) before it execs Ray's program; no JAX code runs in it, and
        # Ray's workers are started by the raylet, not forked from this process.
        warnings.filterwarnings("ignore", message=_FORK_WARNING, category=RuntimeWarning)
        ray.init(address=options.address, include_dashboard=False, log_to_driver=False)
    except Exception as err:  # Ray raises ConnectionError, RuntimeError, ... by version
      raise ValueError(f"cannot start or reach Ray (address={options.address!r}): "
                       f"{type(err).__name__}: {err}") from err
  remote = ray.remote(num_cpus=options.num_cpus, num_gpus=options.num_gpus,
                      max_retries=options.max_retries)(_train_chunk)
  token = None
  if kwargs.get("checkpoint_dir") is not None:
    token = checkpoints.mark_reachable(kwargs["checkpoint_dir"])
  box = [ray.put((list(candidates), plan, worker, kwargs, token))]
  nodes = _alive_nodes(ray)
  pending = {}
  for start in range(0, len(candidates), options.chunk_size):
    idx = list(range(start, min(start + options.chunk_size, len(candidates))))
    pending[remote.remote(box, idx)] = idx
  results: list = [None] * len(candidates)
  with candidates_bar(len(candidates), options.progress, "candidates (ray)") as bar:
    while pending:
      ready, _ = ray.wait(list(pending), num_returns=1, timeout=_POLL_S)
      nodes = _report_lost(ray, nodes, options.max_retries, token is not None)
      if not ready:
        continue
      idx = pending.pop(ready[0])
      chunk = ray.get(ready[0])
      if token is not None and any(res.resumed_step for res in chunk):  # only checkpointed runs resume
        # No ids (they hash the candidates' keys) and no count (of K): what resumed, not which.
        _say("a chunk's candidates resumed from their checkpoints (a task Ray retried after its "
             "worker or node was lost, or a rerun)")
      for i, res in zip(idx, chunk):
        results[i] = res
      if on_chunk is not None:
        on_chunk([(candidates[i], res) for i, res in zip(idx, chunk)])
      bar.update(len(idx))
  _report_lost(ray, nodes, options.max_retries, token is not None)
  return results
