"""Run sweep chunks as Ray tasks, on one machine or a cluster (`pip install jaxdp[ray]`).

Same signature and results as `jaxdp.sweep.train_candidates`, so
`run_sweep(..., trainer=train_candidates_ray)` fills the same durable pool:
results are appended chunk by chunk as tasks finish (in completion order), and
a rerun after a crash resumes from the pool like a local sweep. Each task runs
the local engine on its chunk, on whatever devices its worker sees.
"""

from __future__ import annotations

import socket
import sys
from typing import Callable, Optional, Sequence

from tqdm.auto import tqdm

from jaxdp import _validate
from jaxdp._cache import LruCache
from jaxdp.sweep import checkpoints
from jaxdp.sweep import engine
from jaxdp.sweep.plan import as_plan
from jaxdp.sweep.progress import candidates_bar
from jaxdp.sweep.store import local_trainer


def _require_ray():
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


def _shared(box: list):
  """(candidates, plan, engine kwargs, checkpoint token) of the call whose object ref `box` holds
  (a list, so Ray passes the ref itself)."""
  ref = box[0]
  return _SHARED.get_or_build(ref.binary(), lambda: _require_ray().get(ref))


def _check_reachable(address: Optional[str], timeout_s: float = 5.0) -> None:
  """Raises ValueError unless a TCP connection to a "host:port" address opens within `timeout_s`.

  `ray.init` itself retries an unreachable head for minutes; a user who gave
  a wrong address wants to hear it at once. None, "auto" and "local" are left
  to Ray (which answers those at once).
  """
  if address is None or address in ("auto", "local"):
    return
  host, sep, port = address.removeprefix("ray://").rpartition(":")
  if not sep or not port.isdigit():
    raise ValueError(f"address must be None, 'auto', 'local' or 'host:port' of a Ray head, got {address!r}")
  try:
    socket.create_connection((host, int(port)), timeout=timeout_s).close()
  except OSError as err:
    raise ValueError(f"cannot reach Ray at address={address!r} ({err.strerror or err}): is a head "
                     f"running there (`ray start --head --port={port}`)?") from None


def _train_chunk(box: list, indices: list) -> list:
  candidates, plan, engine_kwargs, token = _shared(box)
  if engine_kwargs.get("checkpoint_dir") is not None:
    checkpoints.check_reachable(engine_kwargs["checkpoint_dir"], token)
  return local_trainer(plan)([candidates[i] for i in indices], plan, **engine_kwargs)


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


def train_candidates_ray(candidates: Sequence, data, *, chunk_size: int = 4, num_cpus: float = 1,
                         num_gpus: float = 0, address: Optional[str] = None, max_retries: int = 3,
                         progress: bool = False, on_chunk: Optional[Callable[[list], None]] = None,
                         keep_params: bool = False, initial_params=None, **engine_kwargs) -> list:
  """Trains candidates in Ray tasks of `chunk_size` candidates each.

  Args:
    candidates: the candidates.
    data: their `jaxdp.sweep.SearchPlan` (or `jaxdp.sweep.functions.FunctionPlan`: a
      training function, shipped to the workers by cloudpickle, so its module must be
      importable there or registered with `cloudpickle.register_pickle_by_value`), or a
      `Dataset` of which the plan is
      built here, on the driver (checked once); the plan is put in Ray's
      object store once, with the candidates, and each worker deserialises
      them once per call and checks nothing again.
    chunk_size: candidates per task (>= 1); a killed task loses at most these.
    num_cpus, num_gpus: resources each task asks Ray for.
    address: the cluster to join when Ray is not initialised yet ("auto", or
      "host:port" of a head started with `ray start --head`); None starts a
      local instance. Ignored when `ray.init` was called already.
    max_retries: how many times Ray reruns a task whose worker or node died
      (the rerun trains the same candidates with the same keys: the same results).
    progress: progress bar with ETA.
    on_chunk: called with (candidate, result) pairs as each task finishes.
    keep_params: return parameters too (they travel back through Ray).
    initial_params: as in `engine.train_candidates` (only with a `Dataset`).
    **engine_kwargs: passed to `engine.train_candidates` inside each task;
      its `search_size` is capped at `chunk_size` (each task lays out a full
      chunk, so a candidate gets the same bits in whichever chunk it lands).
      With `checkpoint_dir` (a durable store's `<run_dir>/checkpoints`) the
      workers write the candidates' checkpoints there, and a task that Ray
      retries after its worker or node was lost resumes them mid-way. On a
      multi-node cluster that directory must be storage every node reaches
      (a shared file system): each task checks that it sees the driver's
      (a token the driver writes there) before it trains, and fails with a
      ValueError naming its node otherwise.

  Output: one `jaxdp:` line on stderr per chunk whose candidates resumed from
  checkpoints, and one per Ray node lost during the call once Ray's GCS
  declares it dead (after `health_check_period_ms` x
  `health_check_failure_threshold`, about 15 s by default; Ray retries the
  lost tasks sooner, so a call that ends within that time shows the loss only
  as the resumed chunk's line). Ray's own worker logs stay on the workers
  (`log_to_driver=False`).

  Returns:
    Results in input order.

  Raises:
    ValueError: Ray is not installed, the cluster at `address` cannot be
      reached, a bad `chunk_size` / `max_retries`, or `devices` given (all
      before any training).
  """
  ray = _require_ray()
  chunk_size = _validate.integer("chunk_size", chunk_size, low=1)
  if engine_kwargs.get("devices") is not None:
    raise ValueError("devices names this process's jax devices, which a Ray task does not have: "
                     "each task trains on the devices its worker sees (num_gpus= asks Ray for them)")
  max_retries = _validate.integer("max_retries", max_retries, low=0)
  engine.check_options(progress=progress, on_chunk=on_chunk, max_candidates_per_device=engine_kwargs.get(
      "max_candidates_per_device"))
  plan = as_plan(candidates, data, initial_params)
  if not ray.is_initialized():
    _check_reachable(address)
    try:
      ray.init(address=address, include_dashboard=False, log_to_driver=False)
    except Exception as err:  # Ray raises ConnectionError, RuntimeError, ... by version
      raise ValueError(f"cannot start or reach Ray (address={address!r}): {type(err).__name__}: "
                       f"{err}") from err
  remote = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_retries=max_retries)(_train_chunk)
  # Every task chooses the layout of a full chunk (or of the whole, smaller
  # search), so a candidate gets the same bits in whichever chunk it lands:
  # the short last chunk, or a rerun of only what a crash left missing.
  search_size = min(chunk_size, engine_kwargs.pop("search_size", None) or chunk_size)
  kwargs = dict(engine_kwargs, keep_params=keep_params, search_size=search_size)
  token = None
  if kwargs.get("checkpoint_dir") is not None:
    token = checkpoints.mark_reachable(kwargs["checkpoint_dir"])
  box = [ray.put((list(candidates), plan, kwargs, token))]
  nodes = _alive_nodes(ray)
  pending = {}
  for start in range(0, len(candidates), chunk_size):
    idx = list(range(start, min(start + chunk_size, len(candidates))))
    pending[remote.remote(box, idx)] = idx
  results: list = [None] * len(candidates)
  with candidates_bar(len(candidates), progress, "candidates (ray)") as bar:
    while pending:
      ready, _ = ray.wait(list(pending), num_returns=1, timeout=_POLL_S)
      nodes = _report_lost(ray, nodes, max_retries, token is not None)
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
  _report_lost(ray, nodes, max_retries, token is not None)
  return results
