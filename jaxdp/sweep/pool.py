"""A durable pool of trained candidates: one JSON line per candidate, on disk.

A run directory holds `manifest.json` (what the pool is for: a fingerprint of
the search space, data and code-relevant settings) and `results.jsonl`. Each
finished chunk of candidates is appended with a single `write` followed by
`fsync`, so a crash (even SIGKILL) loses at most the chunk in flight; a torn
last line is detected, reported and dropped on the next open, and those
candidates are trained again. Rerunning the same sweep resumes: finished
candidates are skipped. A run directory made for a different configuration is
refused rather than mixed.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from jaxdp.sweep import engine
from jaxdp.sweep.space import Candidate

MANIFEST = "manifest.json"
RESULTS = "results.jsonl"


class PoolMismatchError(ValueError):
  """The run directory belongs to a different sweep configuration."""


def _json_safe(value):
  if isinstance(value, float) and not math.isfinite(value):
    return repr(value)  # "nan", "inf": JSON has no literal for them
  return value


def _from_json(value):
  if value in ("nan", "inf", "-inf"):
    return float(value)
  return value


def _atomic_write(path: str, text: str) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


class ResultPool:
  """Finished candidates of one sweep, persisted in `run_dir`.

  Args:
    run_dir: directory (created if missing).
    fingerprint: JSON-serialisable description of the sweep; must match the
      one stored in an existing directory.

  Raises:
    PoolMismatchError: `run_dir` was created for a different fingerprint.
    ValueError: `run_dir` is not a writable directory.
  """

  def __init__(self, run_dir: str, fingerprint: Mapping[str, Any]):
    self.run_dir = os.fspath(run_dir)
    try:
      os.makedirs(self.run_dir, exist_ok=True)
    except OSError as err:
      raise ValueError(f"run_dir={self.run_dir!r} cannot be created: {err}") from None
    if not os.access(self.run_dir, os.W_OK):
      raise ValueError(f"run_dir={self.run_dir!r} is not writable")
    fingerprint = json.loads(json.dumps(fingerprint, sort_keys=True, default=str))
    manifest = os.path.join(self.run_dir, MANIFEST)
    if os.path.exists(manifest):
      with open(manifest) as f:
        stored = json.load(f)
      if stored != fingerprint:
        diff = sorted(k for k in set(stored) | set(fingerprint) if stored.get(k) != fingerprint.get(k))
        raise PoolMismatchError(
            f"run directory {self.run_dir!r} holds a different sweep (differs in: {', '.join(diff)}); "
            "use a new directory, or delete this one to start over")
    else:
      _atomic_write(manifest, json.dumps(fingerprint, indent=2, sort_keys=True))
    self.fingerprint = fingerprint
    self._path = os.path.join(self.run_dir, RESULTS)
    self._records = self._load()

  def _load(self) -> list:
    if not os.path.exists(self._path):
      return []
    with open(self._path, "rb") as f:
      data = f.read()
    records, good_end = [], 0
    for line in data.split(b"\n"):
      end = good_end + len(line) + 1
      if not line.strip():
        good_end = min(end, len(data))
        continue
      try:
        record = json.loads(line)
        if end > len(data):  # no newline: the write was cut short
          raise ValueError("unterminated line")
      except ValueError:
        warnings.warn(f"{self._path}: dropping a corrupted line at byte {good_end} "
                      "(a write was interrupted); its candidate will be trained again")
        break
      records.append({k: _from_json(v) for k, v in record.items()})
      good_end = end
    if good_end < len(data):  # cut the torn tail so later appends start on a clean line
      with open(self._path, "r+b") as f:
        f.truncate(good_end)
        f.flush()
        os.fsync(f.fileno())
    return records

  @property
  def records(self) -> list:
    """Every finished candidate, as dicts, in completion order."""
    return list(self._records)

  def done_ids(self) -> set:
    return {r["id"] for r in self._records}

  def append(self, records: Iterable[Mapping[str, Any]]) -> None:
    """Appends records durably: one write and one fsync for the whole batch."""
    records = [dict(r) for r in records]
    if not records:
      return
    text = "".join(json.dumps({k: _json_safe(v) for k, v in r.items()}, sort_keys=True) + "\n"
                   for r in records)
    with open(self._path, "a") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    self._records.extend(records)


def record_of(candidate: Candidate, result) -> dict:
  """The pool record of a trained candidate (no parameters)."""
  return {
      "id": candidate.id, "point": dict(candidate.point), "seed": candidate.seed,
      "score": result.score, "test_accuracy": result.test_accuracy, "test_loss": result.test_loss,
      "steps": result.steps, "planned_steps": result.planned_steps, "diverged": result.diverged,
      "epsilon": result.epsilon, "delta": result.delta, "wall_time_s": result.wall_time_s,
      "dp_event": repr(candidate.config.dp_event()),
  }


def run_sweep(candidates: Sequence[Candidate], data, run_dir: str, fingerprint: Mapping[str, Any], *,
              progress: bool = True, trainer: Optional[Callable[..., list]] = None, **engine_kwargs) -> ResultPool:
  """Trains the candidates not yet in the pool at `run_dir`, appending each chunk as it ends.

  Args:
    candidates: all candidates of the sweep (finished ones are skipped).
    data: a `jaxdp.data.Dataset`.
    run_dir: the pool's directory.
    fingerprint: what the sweep is; a directory with another one is refused.
    progress: progress bar with ETA.
    trainer: the training backend, `engine.train_candidates` by default (the
      Ray backend has the same signature).
    **engine_kwargs: passed to the backend (`max_candidates_per_device`, ...).

  Returns:
    The `ResultPool`, now holding every candidate.
  """
  pool = ResultPool(run_dir, fingerprint)
  done = pool.done_ids()
  todo = [c for c in candidates if c.id not in done]
  if len({c.id for c in candidates}) != len(candidates):
    raise ValueError("candidates must be distinct (same grid point and seed given twice)")
  if todo:
    train = trainer or engine.train_candidates
    train(todo, data, progress=progress,
          on_chunk=lambda chunk: pool.append(record_of(c, r) for c, r in chunk), **engine_kwargs)
  return pool
