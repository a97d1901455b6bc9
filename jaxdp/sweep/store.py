"""The one durable store of trained candidates: tuners, `run_sweep` and the audit train through it.

`CandidateStore` trains what a plan's candidates still miss (any
`jaxdp.sweep.plan.SearchPlan`) through a trainer (`jaxdp.sweep.trainers`:
`LocalTrainer`, `RayTrainer`), appends each chunk to a `ResultPool` in
`run_dir` as soon as it ends (records and, when kept, parameters or
artifacts), and reads every candidate back from there. Without a `run_dir` it
only trains.

A rerun with the same arguments and key draws the same candidates, trains
only those missing, and gets what an uninterrupted run gets: the same
records, the parameters bit for bit on the same machine (read back from the
same bytes). That is the only reason resuming is private: it is the same
draw of the same mechanism. So a rerun that would be another draw, or the
same draw of another mechanism, is refused before anything trains: the
pool's manifest holds the search's fingerprint (`SearchPlan.fingerprint`,
`search_fields`:
the caller's description, the data's sha256, the public start's digest) and
its mechanism per grid point (`SearchPlan.mechanism`: the configuration,
the candidates' DpEvent, the DP score's included, and the digest of the
program they run). Any difference raises `SearchMismatchError` naming the
part. A second draw on the same data would be a second search that no
epsilon accounts for; a stored score released under a changed mechanism
(say a `NoisyMean` now given a larger noise multiplier) would be reported
with the new mechanism's epsilon, not the one that produced it.

**A `run_dir` is trusted like code and secret like the data** (the one
statement for everything in it: the pool's records and parameter files, a
training function's artifacts, the candidates' checkpoints). Secret: it holds
candidates that are never released (their scores, parameters, ids, which hash
their keys) and the checkpoints of unfinished ones. Trusted: every file
carries a sha256 that detects damage (a crash, a truncated write), not
tampering; whoever can write the directory can forge a record, a checkpoint
or a pickled artifact (which runs code when it is read) and so choose what a
resumed search releases. Keep it where only you and your job can read and
write, as you keep the data.

What a record holds is the plan's to say (`SearchPlan.record` / `result`), so
one store serves every kind of plan.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any, Callable, Mapping, Optional, Sequence

from tqdm.auto import tqdm

from jaxdp.sweep.checkpoints import DIRNAME as CHECKPOINTS, Checkpoints
from jaxdp.sweep.manifest import ABSENT, difference, mismatch_message
from jaxdp.sweep.plan import SearchPlan
from jaxdp.sweep.pool import (MANIFEST, ParamsDamagedError, PoolMismatchError, ResultPool,
                              SearchMismatchError)
from jaxdp.sweep.records import event_record, result_fields, result_from_record
from jaxdp.sweep.space import Candidate, config_record
from jaxdp.sweep.task_plan import task_plan_of
from jaxdp.sweep.trainers import LocalTrainer, Trainer, default_trainer
from jaxdp.sweep.trainers import check as check_trainer
from jaxdp.train import compilation_cache
from jaxdp.train.run_plan import RunPlan
from jaxdp.train.trainer import CandidateResult

__all__ = ["CandidateStore", "check_run_dir", "run_sweep"]


class CandidateStore:
  """Trains a plan's candidates through `trainer`, durably in `run_dir` when one is given.

  Use it as a context manager: with a `run_dir` it holds the pool's writer
  lock until it closes (a second process gets `PoolLockedError`).

  Args:
    plan: the `jaxdp.sweep.plan.SearchPlan` every candidate belongs to.
    run_dir: None (nothing on disk) or the pool's directory.
    fingerprint: what the search is (a tuner's: `SearchPlan.search_fields`);
      the data's sha256 and the public start's digest are always added
      (`SearchPlan.fingerprint`), so a store opened on other data is refused.
    points: the grid points whose mechanism the pool records (None: every
      point of the plan).
    trainer: a `jaxdp.sweep.trainers` trainer (None: `LocalTrainer()`); its own `on_chunk`
      is called after a chunk is on disk.
    keep_params: read each candidate's parameters back (`train`), and store
      them with its record.

  Raises:
    SearchMismatchError: `run_dir` holds another search, or this one run by
      another mechanism (before anything trains).
  """

  def __init__(self, plan: SearchPlan, *, run_dir: Optional[str] = None,
               fingerprint: Optional[Mapping[str, Any]] = None,
               points: Optional[Sequence[Mapping[str, Any]]] = None,
               trainer: Optional[Trainer] = None, keep_params: bool = True):
    self.plan, self.trainer = plan, default_trainer(trainer)
    self.keep_params = keep_params
    self.pool: Optional[ResultPool] = None
    self.checkpoints: Optional[Checkpoints] = None
    self._checkpoint_dir: Optional[str] = None
    if run_dir is not None:
      self.pool = _open(plan, run_dir, fingerprint, points, read_only=False)
    if run_dir is not None and plan.checkpointed:
      self.checkpoints = Checkpoints(os.path.join(run_dir, CHECKPOINTS))
      # A crash between storing a record and removing its checkpoints leaves them: gone now.
      self.checkpoints.remove(set(self.checkpoints.held()) & self.pool.done_ids())
      self._checkpoint_dir = self.checkpoints.directory
    # What the run directory held when it opened, and what this search has asked for since:
    # `resumed` counts the candidates read back from an earlier run, never a repeated draw.
    self._held = set() if self.pool is None else self.pool.done_ids()
    self._asked: set = set()
    #: Candidates trained now whose training resumed mid-way from a checkpoint: id -> step.
    self.resumed_steps: dict = {}

  def __enter__(self) -> "CandidateStore":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  @property
  def resumed(self) -> int:
    """How many distinct candidates (and lone runs) asked for were read back from the run
    directory, stored by an earlier run of the same search, instead of trained now."""
    return len(self._asked & self._held)

  def _drop(self, err: ParamsDamagedError) -> None:
    """Quarantines what lost its parameters: it is trained again, so it is not resumed."""
    self.pool.drop(err.ids, str(err))
    self._held.difference_update(err.ids)

  def close(self) -> None:
    if self.checkpoints is not None:
      self.checkpoints.close()
    if self.pool is not None:
      self.pool.close()

  def train(self, candidates: Sequence[Candidate]) -> list:
    """One `CandidateResult` (with parameters if `keep_params`) per candidate, in order.

    The trainer chooses its layout for all of `candidates` (`search_size`),
    however few of them are missing: a candidate trained on a resume gets the
    bits it gets in an uninterrupted run.
    """
    if not candidates:
      return []
    if self.pool is None:
      held = self._run_trainer(list({c.id: c for c in candidates}.values()), len(candidates),
                               lambda chunk: None)
      return [held[c.id] for c in candidates]
    for _ in range(2):  # a second pass retrains what lost its parameters file
      self.fill(candidates)
      try:
        return self._stored(candidates)
      except ParamsDamagedError as err:
        self._drop(err)
    return self._stored(candidates)

  def compile_unrun(self, stand_in: Candidate) -> None:
    """For a search that drew no candidate: compiles the program a search of this plan writes
    to the persistent compilation cache (`LocalTrainer.compile_unrun`), so that whether an
    entry is written does not tell K = 0 from K >= 1. `stand_in`: any candidate of the plan
    (it never trains)."""
    if isinstance(self.trainer, LocalTrainer):
      self.trainer.compile_unrun(stand_in, self.plan)

  def fill(self, candidates: Sequence[Candidate]) -> None:
    """Trains the candidates the pool does not hold yet, appending each chunk as it ends."""
    done = self.pool.done_ids()
    todo = list({c.id: c for c in candidates if c.id not in done}.values())
    self._asked.update(c.id for c in candidates)
    if not todo:
      return

    def store(chunk):
      stored = [(c, *self.plan.record(c, r)) for c, r in chunk]
      self.pool.append([record for _, record, _ in stored],
                       params={c.id: kept for c, _, kept in stored} if self.keep_params else None)
      if self.checkpoints is not None:  # stored durably: their checkpoints (secret) go
        self.checkpoints.remove(c.id for c, _ in chunk)
        self.resumed_steps.update({c.id: r.resumed_step for c, r in chunk if r.resumed_step})

    self._run_trainer(todo, len(candidates), store)

  def _run_trainer(self, todo: list, search_size: int, store: Callable[[list], None]) -> dict:
    """id -> result of every candidate in `todo`, as the trainer reported them to `on_chunk`
    (each chunk `store`d as it comes), with or without a `run_dir` alike.

    Raises:
      RuntimeError: the trainer broke its contract: it reported a candidate it was not given,
        one twice, a result that is not its candidate's (`SearchPlan.check_result`), or
        returned without reporting them all. Nothing it reported wrongly is stored. The
        message names no candidate and no count (both say something of K).
    """
    wanted = {c.id: c for c in todo}
    held: dict = {}

    def on_chunk(chunk):
      chunk = [(wanted.get(getattr(c, "id", None)), r) for c, r in chunk]
      if any(c is None or c.id in held for c, _ in chunk) or len({c.id for c, _ in chunk}) < len(chunk):
        raise RuntimeError("the trainer reported a candidate it was not given, or one twice")
      for c, r in chunk:
        try:
          self.plan.check_result(c, r)
        except ValueError as err:
          raise RuntimeError(f"the trainer broke its contract: {err}") from None
      store(chunk)
      held.update((c.id, r) for c, r in chunk)

    # Only jaxdp's own trainer writes to the persistent compilation cache, and it writes the
    # same entries whatever K (`compile_unrun`); another trainer's programs are never written.
    with (contextlib.nullcontext() if isinstance(self.trainer, LocalTrainer)
          else compilation_cache.unwritten()):
      returned = self.trainer(todo, self.plan, keep_params=self.keep_params,
                              search_size=search_size, on_chunk=on_chunk,
                              checkpoint_dir=self._checkpoint_dir)
    if len(held) != len(wanted) or returned is None or len(returned) != len(todo):
      raise RuntimeError("the trainer returned without reporting one result per candidate to "
                         "on_chunk: a trainer must call on_chunk for every chunk it trains and "
                         "return one result per candidate")
    return held

  def train_lone(self, record_id: str, run: RunPlan, train: Callable[[], CandidateResult]
                 ) -> CandidateResult:
    """A run outside the drawn candidates (a final model) of plan `run`, stored under
    `record_id`: `train()` trains it unless it is stored already.

    Raises:
      SearchMismatchError: the stored run's DpEvent or configuration is not
        `run`'s (e.g. another extrapolation of the tuned hyperparameters).
    """
    if self.pool is None:
      return train()
    # As a reload reads them back (JSON), so an identical rerun compares equal.
    expected = {"dp_event": event_record(run), "config": json.loads(json.dumps(config_record(run.config)))}
    self._asked.add(record_id)
    for _ in range(2):
      if record_id not in self.pool.done_ids():
        result = train()
        self.pool.append([dict(result_fields(result), id=record_id, point={}, seed=-1, **expected)],
                         params={record_id: result.params})
      record = next(r for r in self.pool.records if r["id"] == record_id)
      for field, value in expected.items():
        if record.get(field) != value:
          raise SearchMismatchError(
              f"run directory {self.pool.run_dir!r} holds {record_id!r} run with another "
              f"{field} ({difference(field, record.get(field, ABSENT), value)}): releasing it would "
              "report the mechanism of this run, not the one that produced it; rerun the "
              "identical search, or start a new search in a new run_dir")
      try:
        leaves = self.pool.load_params([record])[record_id]
      except ParamsDamagedError as err:
        self._drop(err)
        continue
      return result_from_record(record, run.treedef.unflatten(leaves))
    raise RuntimeError(f"{record_id}: its parameters could not be stored in {self.pool.run_dir!r}")

  def _stored(self, candidates: Sequence[Candidate]) -> list:
    records = {r["id"]: r for r in self.pool.records}
    if any(c.id not in records for c in candidates):  # `_run_trainer` checked the trainer
      raise RuntimeError(f"{self.pool.run_dir!r} lost candidates it had stored while the search "
                         "ran: another process changed it")
    if not self.keep_params:
      return [self.plan.result(c, records[c.id], None) for c in candidates]
    leaves = self.pool.load_params([records[c.id] for c in {c.id: c for c in candidates}.values()])
    return [self.plan.result(c, records[c.id], leaves[c.id]) for c in candidates]


def check_run_dir(plan: SearchPlan, run_dir: str, fingerprint: Optional[Mapping[str, Any]] = None,
                  points: Optional[Sequence[Mapping[str, Any]]] = None, *,
                  mechanism: bool = True) -> None:
  """What opening a `CandidateStore` in `run_dir` checks, without writing anything (a dry run).
  With `mechanism=False`, the fingerprint only (the mechanism is checked when the store opens:
  a subsampled search's programs are known only once its subset is drawn).

  Raises:
    SearchMismatchError: `run_dir` holds another search or mechanism.
    ValueError: `run_dir` is not a directory.
  """
  if os.path.isdir(run_dir) and not os.path.exists(os.path.join(run_dir, MANIFEST)):
    return  # a new search's directory (results without a manifest are refused on opening)
  if os.path.exists(run_dir):
    _open(plan, run_dir, fingerprint, points, read_only=True, mechanism=mechanism).close()


def _open(plan: SearchPlan, run_dir: str, fingerprint, points, *, read_only: bool,
          mechanism: bool = True) -> ResultPool:
  try:
    return ResultPool(run_dir, plan.fingerprint(**(fingerprint or {})), read_only=read_only,
                      mechanism=plan.mechanism(points) if mechanism else None)
  except SearchMismatchError as err:
    if not err.parts:
      raise
    raise SearchMismatchError(mismatch_message(os.fspath(run_dir), err.parts, err.changes, _WHY),
                              err.parts, err.changes) from None
  except PoolMismatchError as err:
    raise SearchMismatchError(f"{err}. {_WHY}") from None


#: Why a search is refused on a run directory of another (the way out follows it).
_WHY = ("A resume with another key, grid, configuration, law of K, data or mechanism would be a "
        "second search on the same data, whose scores the reported epsilon does not cover.")


def run_sweep(candidates: Sequence[Candidate], data, run_dir: str, fingerprint: Mapping[str, Any], *,
              trainer: Optional[Trainer] = None, initial_params: Any = None) -> ResultPool:
  """Trains the candidates not yet in the pool at `run_dir`, appending each chunk as it ends.

  Args:
    candidates: all candidates of the sweep (finished ones are skipped).
    data: a `jaxdp.data.Dataset`, or the `jaxdp.sweep.plan.SearchPlan` of the candidates.
    run_dir: the pool's directory.
    fingerprint: what the sweep is; a directory with another one is refused.
      The mechanism of every grid point among `candidates` (its
      configuration, DpEvent and program digest, `SearchPlan.mechanism`),
      the data's sha256 and the digest of `initial_params` are added to it
      here: a pool resumed with another C, hyperparameter, noise multiplier,
      DP score, clipping path, trainable set, loss, model, optimizer, data or
      public start is refused whatever `fingerprint` says; a rerun may add
      grid points and seeds.
    trainer: a `jaxdp.sweep.trainers` trainer (None: `LocalTrainer()`; `progress=True` for a
      bar). It is called only after the pool has been checked, here on the driver.
    initial_params: as in `jaxdp.sweep.train_candidates` (only with a `Dataset`).

  Returns:
    The `ResultPool`, now holding every candidate, closed (its writer lock
    released; its records stay readable).

  Raises:
    PoolLockedError: another process is writing `run_dir`.
    SearchMismatchError: `run_dir` holds another sweep or mechanism (before
      anything trains); `PoolMismatchError`: an older pool format.
    ValueError: a task does not fit `data` (before anything trains).
  """
  if len({c.id for c in candidates}) != len(candidates):
    raise ValueError("candidates must be distinct (same grid point and seed given twice)")
  if not isinstance(fingerprint, Mapping):
    raise ValueError(f"fingerprint must be a mapping, got {fingerprint!r:.200}")
  trainer = default_trainer(trainer)
  if isinstance(data, SearchPlan):
    if initial_params is not None:
      raise ValueError("initial_params is part of the plan: give it to its build, not with a plan")
    data.check_candidates(candidates)
    plan = data
  else:
    plan = task_plan_of(candidates, data, initial_params)
  check_trainer(trainer, plan)
  with CandidateStore(plan, run_dir=run_dir, fingerprint=fingerprint,
                      points=[c.point for c in candidates], trainer=trainer,
                      keep_params=False) as store:
    _report_resumed(store.pool, candidates)
    store.fill(candidates)
  return store.pool


def _report_resumed(pool: ResultPool, candidates: Sequence[Candidate]) -> None:
  """The line a rerun of `run_sweep` prints: how many of `candidates` it read back, and how many
  remain. The count is of the caller's own list (a fixed, public grid of candidates x seeds:
  `grid_candidates`), not of a private search's draw (K), which `CandidateStore` never prints."""
  held = len({c.id for c in candidates} & pool.done_ids())
  if held:
    left = len(candidates) - held
    tqdm.write(f"run_sweep: resumed {held} of {len(candidates)} candidates from {pool.run_dir} "
               f"(stored by an earlier run); {f'training the other {left}' if left else 'nothing left to train'}",
               file=sys.stderr)
