"""Run sweep chunks as Ray tasks, on one machine or a cluster (`pip install jaxdp[ray]`).

Same signature and results as `jaxdp.sweep.train_candidates`, so
`run_sweep(..., trainer=train_candidates_ray)` fills the same durable pool:
results are appended chunk by chunk as tasks finish (in completion order), and
a rerun after a crash resumes from the pool like a local sweep. Each task runs
the local engine on its chunk, on whatever devices its worker sees.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from tqdm.auto import tqdm

from jaxdp import _validate
from jaxdp.sweep import engine


def _require_ray():
  try:
    import ray  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ValueError("the Ray backend needs Ray: pip install 'jaxdp[ray]'") from None
  return ray


def _train_chunk(chunk, data, engine_kwargs):
  return engine.train_candidates(chunk, data, **engine_kwargs)


def train_candidates_ray(candidates: Sequence, data, *, chunk_size: int = 4, num_cpus: float = 1,
                         num_gpus: float = 0, progress: bool = False,
                         on_chunk: Optional[Callable[[list], None]] = None,
                         keep_params: bool = False, **engine_kwargs) -> list:
  """Trains candidates in Ray tasks of `chunk_size` candidates each.

  Args:
    candidates: the candidates.
    data: the `Dataset` (put in Ray's object store once).
    chunk_size: candidates per task (>= 1); a killed task loses at most these.
    num_cpus, num_gpus: resources each task asks Ray for.
    progress: progress bar with ETA.
    on_chunk: called with (candidate, result) pairs as each task finishes.
    keep_params: return parameters too (they travel back through Ray).
    **engine_kwargs: passed to `engine.train_candidates` inside each task.

  Returns:
    Results in input order. Ray must be initialised (`ray.init(...)`), or a
    local instance is started.
  """
  ray = _require_ray()
  chunk_size = _validate.integer("chunk_size", chunk_size, low=1)
  if not ray.is_initialized():
    ray.init()
  remote = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(_train_chunk)
  data_ref = ray.put(data)
  kwargs = dict(engine_kwargs, keep_params=keep_params)
  pending = {}
  for start in range(0, len(candidates), chunk_size):
    idx = list(range(start, min(start + chunk_size, len(candidates))))
    pending[remote.remote([candidates[i] for i in idx], data_ref, kwargs)] = idx
  results: list = [None] * len(candidates)
  with tqdm(total=len(candidates), disable=not progress, desc="candidates (ray)", unit="cand") as bar:
    while pending:
      ready, _ = ray.wait(list(pending), num_returns=1)
      idx = pending.pop(ready[0])
      chunk = ray.get(ready[0])
      for i, res in zip(idx, chunk):
        results[i] = res
      if on_chunk is not None:
        on_chunk([(candidates[i], res) for i, res in zip(idx, chunk)])
      bar.update(len(idx))
  return results
