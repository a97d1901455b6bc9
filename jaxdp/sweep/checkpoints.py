"""Checkpoints inside long candidates: a candidate killed mid-way resumes from its last one.

A search's `run_dir` holds, under `checkpoints/<candidate id>/<step>/`, the
loop state of every candidate still training (`jaxdp.train.program.LoopState`:
step, trained parameters, optimizer state with the noise transform's PRNG key
as key data, and the divergence flag), written with orbax-checkpoint: each
save goes to a temporary directory renamed into place when it is complete
(atomic), in a background thread (asynchronous), and the last two are kept.

What makes a resume private is that it is the same mechanism: step t of a
candidate reads only the state after step t - 1 and (its key, t) (its
Poisson sample is drawn from the loop key folded with t, its noise from the
key in the state), so a candidate continued from a checkpoint draws the
samples and the noise the uninterrupted run draws, and runs them through the
same compiled step: the same bits on the same machine. A checkpoint is
resumed only when it is what was saved, by the run it was saved for, as far
as checksums tell: they detect damage, not tampering. Like everything in a
`run_dir`, checkpoints are trusted like code and secret like the data
(`jaxdp.sweep.store`): whoever can write them can forge one.

  - Every checkpoint carries the sha256 of its arrays (dtypes, shapes, bytes)
    and of its own metadata. A checkpoint that cannot be read, or whose
    arrays or metadata fail their checksum (truncated, corrupted, a write
    cut short), is moved to `checkpoints/.quarantine/` with a warning, and
    the candidate resumes from the previous valid one, or from step 0:
    never from a different draw.
  - Its metadata holds the candidate's identity (`SearchPlan.identity`: its
    id and PRNG key, its grid point's configuration, DpEvent and program
    digest, the data's sha256 and the public start's digest). A checkpoint
    of another identity is refused (`SearchMismatchError`), never resumed:
    resuming it would continue another mechanism's or another key's run.
    (The store refuses a `run_dir` of another search before this is reached.)

A checkpoint is an unreleased candidate's intermediate state: as secret as
the data. A candidate's checkpoints, quarantined ones included, are removed
once its record is durably in the pool (`CandidateStore`): they are never
needed again, they cost disk, and what is not kept cannot leak. What a
search keeps of them (`Unreleased.resumed_steps`) is the label of
the checkpoint a candidate resumed from: the step its segment was asked to
stop at (a multiple of `checkpoint_every`, or with the automatic cadence a
function of the measured step time, which like the job's duration is not
covered by the reported epsilon), never a step counter that depends on the
data (a diverged candidate's).

On a multi-node Ray cluster the checkpoints are written by the workers: the
`run_dir` must be storage that every node reaches (a shared file system);
the Ray backend checks it (`check_reachable`) before a task trains.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import time
import warnings
from typing import Any, Optional

import jax
import numpy as np

from jaxdp.sweep.records import params_digest
from jaxdp.sweep.pool import SearchMismatchError

#: The directory of checkpoints in a `run_dir`, and its subdirectory where damaged ones go.
DIRNAME = "checkpoints"
QUARANTINE = ".quarantine"
#: `ExecutionConfig(checkpoint_every=None)`: a checkpoint about this often (seconds of training).
AUTO_SECONDS = 600.0
#: Steps of the first segment of a chunk under the automatic cadence, timed to size the rest.
PROBE_STEPS = 8
_KEEP = 2  # the newest and the one before it: a damaged newest costs one interval, not the run
_REACHABLE = ".reachable"


def _named(leaves: list) -> dict:
  # Leaves by position: orbax stores a flat mapping, the caller's tree gives the structure back.
  return {f"{i:06d}": leaf for i, leaf in enumerate(leaves)}


def _meta_digest(meta: dict) -> str:
  return hashlib.sha256(json.dumps({k: v for k, v in meta.items() if k != "meta_sha256"},
                                   sort_keys=True).encode()).hexdigest()


def _orbax():
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  return ocp  # imported on first use: a search without checkpoints never pays for it


class Checkpoints:
  """The checkpoints of the candidates in one directory (`<run_dir>/checkpoints`).

  Args:
    directory: where they live (created if missing); damaged ones are moved
      to its `QUARANTINE` subdirectory.

  A checkpoint is labelled by the step its segment stopped at (a multiple of
  `checkpoint_every`, or a wall-time cadence's stop), never by the state's
  own step counter: that one stops where a candidate diverged, which depends
  on the data, while the label only says how far the loop was asked to run.

  Use it as a context manager, or `close()` it: pending asynchronous saves are
  finished there.
  """

  def __init__(self, directory: str):
    self.directory = os.fspath(directory)
    os.makedirs(self.directory, exist_ok=True)
    self.quarantine = os.path.join(self.directory, QUARANTINE)
    self._managers: dict = {}

  def __enter__(self) -> "Checkpoints":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def _path(self, candidate_id: str) -> str:
    return os.path.join(self.directory, candidate_id)

  def _manager(self, candidate_id: str):
    if candidate_id not in self._managers:
      ocp = _orbax()
      options = ocp.CheckpointManagerOptions(max_to_keep=_KEEP, enable_async_checkpointing=True,
                                             create=True, cleanup_tmp_directories=True)
      self._managers[candidate_id] = ocp.CheckpointManager(self._path(candidate_id),
                                                           options=options)
    return self._managers[candidate_id]

  def release(self, candidate_ids) -> None:
    """Finishes the candidates' pending saves and closes their writers (they finished training)."""
    for cid in candidate_ids:
      self._forget(cid)

  def _forget(self, candidate_id: str) -> None:
    manager = self._managers.pop(candidate_id, None)
    if manager is not None:
      manager.close()

  def steps(self, candidate_id: str) -> list:
    """The labels of the candidate's complete checkpoints, newest first."""
    path = self._path(candidate_id)
    if os.path.lexists(path) and not os.path.isdir(path):
      self._quarantine(candidate_id, None, "it is not a directory")
    if not os.path.isdir(path):
      return []
    return sorted(self._manager(candidate_id).all_steps(), reverse=True)

  def save(self, candidate_id: str, identity: str, step: int, state: Any) -> None:
    """Saves a candidate's loop state (a tree of host arrays) under label `step`, asynchronously.

    Returns once the arrays are handed to the writer; the write completes in
    the background (atomically: an interrupted one is never read).
    """
    ocp = _orbax()
    leaves = jax.tree.leaves(state)
    meta = {"candidate": candidate_id, "identity": identity, "step": int(step),
            "state_sha256": params_digest(leaves)}
    meta["meta_sha256"] = _meta_digest(meta)
    self._manager(candidate_id).save(int(step), args=ocp.args.Composite(
        state=ocp.args.StandardSave(_named(leaves)), meta=ocp.args.JsonSave(meta)), force=True)

  def restore(self, candidate_id: str, identity: str, template: Any) -> Optional[tuple]:
    """(label, state) of the candidate's newest valid checkpoint, or None (train from step 0).

    `template`: the candidate's fresh state (a tree of host arrays shaped like
    what `save` got). The metadata is read and checked first; a checkpoint
    that fails to load or a checksum is quarantined with a warning and the
    previous one is tried.

    Raises:
      SearchMismatchError: a checkpoint whose intact metadata names another
        candidate or identity (another mechanism, key, data or public start).
    """
    ocp = _orbax()
    like, treedef = jax.tree.flatten(template)
    for step in self.steps(candidate_id):
      manager = self._manager(candidate_id)
      try:
        meta = dict(manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"])
        valid = meta.get("meta_sha256") == _meta_digest(meta)
      except Exception as err:  # pylint: disable=broad-except
        self._quarantine(candidate_id, step, f"its metadata cannot be read ({type(err).__name__})")
        continue
      # The errors' texts are left out: they name the checkpoint's path, whose directory is the
      # candidate's id (a hash of its key).
      if not valid:
        self._quarantine(candidate_id, step, "its metadata fails its checksum")
        continue
      if meta.get("identity") != identity or meta.get("candidate") != candidate_id:
        raise SearchMismatchError(
            f"a checkpoint (step {step}) under {self.directory} is a checkpoint of another run "
            "(another candidate, mechanism, key, data or public start than this search's): "
            "continuing it would release a run that the reported epsilon does not account for. "
            "Remove it to train this candidate from step 0, or rerun the identical search")
      if meta.get("step") != step:
        self._quarantine(candidate_id, step, f"its directory says step {step}, its metadata "
                                             f"{meta.get('step')!r}")
        continue
      try:
        got = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(_named(like))))
        leaves = [np.asarray(got["state"][name]) for name in sorted(got["state"])]
      except Exception as err:  # pylint: disable=broad-except
        self._quarantine(candidate_id, step, f"its arrays cannot be read ({type(err).__name__})")
        continue
      if params_digest(leaves) != meta.get("state_sha256"):
        self._quarantine(candidate_id, step, "its arrays fail their checksum")
        continue
      return step, treedef.unflatten(leaves)
    return None

  def _quarantine(self, candidate_id: str, step: Optional[int], why: str) -> None:
    self._forget(candidate_id)  # its list of steps is stale now
    source = self._path(candidate_id) if step is None else os.path.join(self._path(candidate_id),
                                                                         str(step))
    target = os.path.join(self.quarantine, candidate_id, f"{step}-{time.time_ns()}")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.replace(source, target)
    # Named by step, not by path: a path names the candidate's id, which hashes its key.
    warnings.warn(f"a checkpoint (step {step}) under {self.directory}: {why}; moved to "
                  f"{self.quarantine}, and its candidate resumes from its previous valid checkpoint "
                  "(or from step 0)", stacklevel=3)

  def remove(self, candidate_ids) -> None:
    """Deletes the checkpoints, quarantined ones included, of candidates whose results are
    stored (waiting for their pending saves): secret states that are never needed again."""
    def failed(function, path, exc_info):
      if os.path.lexists(path):
        warnings.warn(f"could not delete a checkpoint under {self.directory} "
                      f"({type(exc_info[1]).__name__}): it holds an unreleased candidate's state, "
                      "as secret as the data; delete it by hand", stacklevel=4)
    for cid in candidate_ids:
      self._forget(cid)
      for path in (self._path(cid), os.path.join(self.quarantine, cid)):
        if os.path.isdir(path) and not os.path.islink(path):
          shutil.rmtree(path, onerror=failed)
        elif os.path.lexists(path):
          try:
            os.remove(path)
          except OSError as err:
            failed(os.remove, path, (type(err), err, None))

  def held(self) -> list:
    """Ids of the candidates with checkpoints (quarantined ones included)."""
    ids = {name for name in os.listdir(self.directory) if not name.startswith(".")}
    if os.path.isdir(self.quarantine):
      ids.update(os.listdir(self.quarantine))
    return sorted(ids)

  def wait(self) -> None:
    """Blocks until every asynchronous save has completed."""
    for manager in self._managers.values():
      manager.wait_until_finished()

  def close(self) -> None:
    while self._managers:
      self._forget(next(iter(self._managers)))


def mark_reachable(directory: str) -> str:
  """Writes a fresh token into `directory` and returns it (`check_reachable` reads it)."""
  os.makedirs(directory, exist_ok=True)
  token = secrets.token_hex(16)
  path = os.path.join(directory, _REACHABLE)
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    f.write(token)
  os.replace(path + ".tmp", path)
  return token


def check_reachable(directory: str, token: str) -> None:
  """Raises ValueError unless `directory` holds the token the driver wrote (`mark_reachable`):
  a worker on another node that does not share the driver's storage would write checkpoints
  no retry could read."""
  try:
    with open(os.path.join(directory, _REACHABLE), encoding="utf-8") as f:
      found = f.read()
  except OSError:
    found = None
  if found != token:
    import socket  # pylint: disable=g-import-not-at-top
    raise ValueError(
        f"the run_dir's checkpoint directory {directory!r} is not the driver's on node "
        f"{socket.gethostname()}: on a multi-node Ray cluster the run_dir must be storage every "
        "node reaches (a shared file system), or a task retried on another node could not resume "
        "the lost one's checkpoints")
