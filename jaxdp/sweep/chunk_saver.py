"""The engine's side of `jaxdp.sweep.checkpoints`: a chunk's resume and its saves
(`jaxdp.sweep.engine` runs a chunk as segments of one program and saves between them)."""

from __future__ import annotations

import jax
import numpy as np

from jaxdp.sweep import checkpoints
from jaxdp.sweep.task_plan import TaskPlan
from jaxdp.train import program


def _saved(state: program.LoopState) -> dict:
  return {field: getattr(state, field) for field in program.SAVED_FIELDS}


def _set_row(rows: np.ndarray, j: int, value) -> np.ndarray:
  rows = np.array(rows)  # a copy: the group's template stays zeros
  rows[j] = value
  return rows


class ChunkSaver:
  """The engine's side of `jaxdp.sweep.checkpoints`: a chunk's resume and its saves."""

  def __init__(self, store: checkpoints.Checkpoints, plan: TaskPlan, candidates):
    self.store, self.plan, self.candidates = store, plan, candidates
    self._identity: dict = {}
    self.last: dict = {}  # candidate id -> the step of its newest checkpoint

  def identity(self, i: int) -> str:
    cid = self.candidates[i].id
    if cid not in self._identity:
      self._identity[cid] = self.plan.identity(self.candidates[i])
    return self._identity[cid]

  def resume(self, padded: list, empty: program.LoopState) -> tuple:
    """(host state with every checkpointed candidate's saved state in its rows, the rows to
    start fresh, index -> step), or (None, None, {}) when no candidate of the chunk has one."""
    ids = [self.candidates[i].id for i in padded]
    if not any(self.store.steps(cid) for cid in set(ids)):
      return None, None, {}
    host = _saved(empty)
    fresh = np.ones(len(padded), bool)
    found, resumed = {}, {}
    for j, (i, cid) in enumerate(zip(padded, ids)):
      if cid not in found:
        found[cid] = self.store.restore(cid, self.identity(i),
                                        jax.tree.map(lambda x, j=j: np.asarray(x[j]), host))
      if found[cid] is None:
        continue
      step, saved = found[cid]
      host = jax.tree.map(lambda rows, x, j=j: _set_row(rows, j, x), host, saved)
      fresh[j] = False
      resumed[i] = self.last[cid] = step
    if not resumed:
      return None, None, {}
    return empty._replace(**host), fresh, resumed

  def save(self, padded: list, state: program.LoopState, stop: int) -> None:
    """Saves the chunk's candidates that ran to `stop` in this segment, labelled `stop` (the
    segment's public stop, not the state's step, which a diverged candidate's data decides)."""
    host = jax.device_get(_saved(state))
    for j, i in enumerate(padded):
      cid = self.candidates[i].id
      if stop > self.last.get(cid, 0):
        self.store.save(cid, self.identity(i), stop,
                        jax.tree.map(lambda x, j=j: np.asarray(x[j]), host))
        self.last[cid] = stop
