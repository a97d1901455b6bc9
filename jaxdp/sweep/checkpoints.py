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
resumed only when it is exactly what was saved, by the run it was saved for:

  - Every checkpoint carries the sha256 of its arrays (dtypes, shapes, bytes)
    and of its own metadata. A checkpoint that cannot be read, or whose
    arrays or metadata fail their checksum (truncated, corrupted, a write
    cut short), is moved to `checkpoints.quarantine/` with a warning, and
    the candidate resumes from the previous valid one, or from step 0:
    never from a different draw.
  - Its metadata holds the candidate's identity (`SearchPlan.identity`: its
    id and PRNG key, its grid point's configuration, DpEvent and program
    digest, the data's sha256 and the public start's digest). A checkpoint
    of another identity is refused (`SearchMismatchError`), never resumed:
    resuming it would continue another mechanism's or another key's run.
    (The store refuses a `run_dir` of another search before this is reached.)

A checkpoint is an unreleased candidate's intermediate state: as secret as
the data. Checkpoints are removed once the candidate's record is durably in
the pool (`CandidateStore`): they are never needed again, they cost disk, and
what is not kept cannot leak.

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

from jaxdp.sweep.pool import SearchMismatchError

#: The directory of checkpoints in a `run_dir`, and where damaged ones are moved.
DIRNAME = "checkpoints"
QUARANTINE = "checkpoints.quarantine"
#: `ExecutionConfig(checkpoint_every=None)`: a checkpoint about this often (seconds of training).
AUTO_SECONDS = 600.0
#: Steps of the first segment of a chunk under the automatic cadence, timed to size the rest.
PROBE_STEPS = 8
_KEEP = 2  # the newest and the one before it: a damaged newest costs one interval, not the run
_REACHABLE = ".reachable"


def state_digest(leaves: list) -> str:
  """sha256 of a list of host arrays: every leaf's dtype, shape and bytes, in order."""
  digest = hashlib.sha256()
  for leaf in leaves:
    leaf = np.ascontiguousarray(np.asarray(leaf))
    digest.update(f"{leaf.dtype}{leaf.shape}".encode())
    digest.update(leaf.tobytes())
  return digest.hexdigest()


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
    directory: where they live (created if missing).

  Use it as a context manager, or `close()` it: pending asynchronous saves are
  finished there.
  """

  def __init__(self, directory: str):
    self.directory = os.fspath(directory)
    os.makedirs(self.directory, exist_ok=True)
    self.quarantine = os.path.join(os.path.dirname(os.path.abspath(self.directory)), QUARANTINE)
    self._managers: dict = {}

  def __enter__(self) -> "Checkpoints":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def _manager(self, candidate_id: str):
    if candidate_id not in self._managers:
      ocp = _orbax()
      options = ocp.CheckpointManagerOptions(max_to_keep=_KEEP, enable_async_checkpointing=True,
                                             create=True, cleanup_tmp_directories=True)
      self._managers[candidate_id] = ocp.CheckpointManager(
          os.path.join(self.directory, candidate_id), options=options)
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
    """The steps of the candidate's complete checkpoints, newest first."""
    if not os.path.isdir(os.path.join(self.directory, candidate_id)):
      return []
    return sorted(self._manager(candidate_id).all_steps(), reverse=True)

  def save(self, candidate_id: str, identity: str, step: int, state: Any) -> None:
    """Saves a candidate's loop state after `step` steps (a tree of host arrays), asynchronously.

    Returns once the arrays are handed to the writer; the write completes in
    the background (atomically: an interrupted one is never read).
    """
    ocp = _orbax()
    leaves = jax.tree.leaves(state)
    meta = {"candidate": candidate_id, "identity": identity, "step": int(step),
            "state_sha256": state_digest(leaves)}
    meta["meta_sha256"] = _meta_digest(meta)
    self._manager(candidate_id).save(int(step), args=ocp.args.Composite(
        state=ocp.args.StandardSave(_named(leaves)), meta=ocp.args.JsonSave(meta)), force=True)

  def restore(self, candidate_id: str, identity: str, template: Any) -> Optional[tuple]:
    """(step, state) of the candidate's newest valid checkpoint, or None (train from step 0).

    `template`: the candidate's fresh state (a tree of host arrays shaped like
    what `save` got). A checkpoint that fails to load or its checksums is
    quarantined with a warning and the previous one is tried.

    Raises:
      SearchMismatchError: a checkpoint intact but saved for another
        identity (another mechanism, key, data or public start).
    """
    ocp = _orbax()
    like, treedef = jax.tree.flatten(template)
    for step in self.steps(candidate_id):
      try:
        got = self._manager(candidate_id).restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(_named(like)), meta=ocp.args.JsonRestore()))
        meta = dict(got["meta"])
        leaves = [np.asarray(got["state"][name]) for name in sorted(got["state"])]
        if meta.get("meta_sha256") != _meta_digest(meta):
          raise ValueError("its metadata fails its checksum")
      except Exception as err:  # pylint: disable=broad-except
        self._quarantine(candidate_id, step, f"it cannot be read ({type(err).__name__}: {err})"[:400])
        continue
      if meta.get("identity") != identity or meta.get("candidate") != candidate_id:
        raise SearchMismatchError(
            f"{self.directory}/{candidate_id}/{step} is a checkpoint of another run (another "
            "mechanism, key, data or public start than candidate "
            f"{candidate_id} of this search): continuing it would release a run that the reported "
            "epsilon does not account for. Rerun the identical search, or use a new run_dir")
      if meta.get("step") != step or state_digest(leaves) != meta.get("state_sha256"):
        self._quarantine(candidate_id, step, "its arrays fail their checksum")
        continue
      return step, treedef.unflatten(leaves)
    return None

  def _quarantine(self, candidate_id: str, step: int, why: str) -> None:
    self._forget(candidate_id)  # its list of steps is stale now
    source = os.path.join(self.directory, candidate_id, str(step))
    target = os.path.join(self.quarantine, candidate_id, f"{step}-{time.time_ns()}")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.replace(source, target)
    warnings.warn(f"checkpoint {source}: {why}; moved to {target}, and candidate {candidate_id} "
                  "resumes from its previous valid checkpoint (or from step 0)", stacklevel=3)

  def remove(self, candidate_ids) -> None:
    """Deletes the checkpoints of candidates whose results are stored (waiting for their saves)."""
    for cid in candidate_ids:
      self._forget(cid)
      shutil.rmtree(os.path.join(self.directory, cid), ignore_errors=True)

  def held(self) -> list:
    """Ids of the candidates with a checkpoint directory."""
    return sorted(name for name in os.listdir(self.directory)
                  if os.path.isdir(os.path.join(self.directory, name)))

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
