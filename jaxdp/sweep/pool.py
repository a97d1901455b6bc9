"""A durable pool of trained candidates: one checksummed JSON line per candidate.

A run directory holds `manifest.json` (what the pool is for: a fingerprint of
the search space, data and code-relevant settings, plus the pool format and
how candidate keys were derived) and `results.jsonl`. Each record carries the
sha256 of its own canonical JSON, so damage anywhere in the file is detected,
not only a torn last line; tampering is not (a run directory is trusted like
code and secret like the data: `jaxdp.sweep.store`).

Guarantees:
  - Nothing valid is lost. A line that fails its checksum (flipped byte, torn
    write) is appended to `results.jsonl.quarantine` with a warning naming the
    line, every valid record before *and after* it is kept, and the pool file
    is rewritten atomically (temporary file, fsync, `os.replace`): a crash
    during the repair leaves either the old or the new file, never a
    truncated one.
  - One writer. Opening a pool for writing takes an exclusive, non-blocking
    `flock` on `<run_dir>/.writer.lock` for as long as the pool is open (the
    kernel drops it when the process dies, even by SIGKILL); a second writer
    gets `PoolLockedError` at once instead of training the same candidates
    again.
  - Each candidate counts once: a record whose id is already in the pool is
    quarantined as a repeat, the first one is kept.
  - Appends are one write and one fsync per chunk, so a crash loses at most
    the chunk in flight; rerunning the sweep resumes where it stopped.
  - A directory made for another configuration, by an older pool format or
    with the old seed-only candidate keys is refused, never mixed.
  - The same mechanism or nothing. The manifest also records, per grid
    point, the candidates' DpEvent (their DP score's included) and the
    digest of the program they run (`jaxdp.train.digest`: the model, loss,
    score, optimizer, clipping path and trainable set as traced): a pool
    opened with a `mechanism` that differs at a point it has recorded raises
    `SearchMismatchError` naming the part and the point, before anything
    trains; new points are added. Every stored record's `dp_event` is checked
    against its point's too (a record that disagrees is refused, naming it).
  - Parameters, when a pool keeps them (`append(..., params=...)`), are
    written and fsynced (one file per chunk under `params/`) before the
    records that point to them; each record holds the file's sha256, so a
    damaged or missing file is detected on reading, and `drop` moves the
    records it would cost to the quarantine, to be trained again.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import json
import math
import os
import warnings
from typing import Any, Iterable, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp.sweep import manifest
from jaxdp.sweep.manifest import (ABSENT, DATA_KEY, INITIAL_KEY, checked_mechanism, difference,
                                  mismatch_message)
from jaxdp.sweep.space import KEY_DERIVATION, point_key

MANIFEST = "manifest.json"
RESULTS = "results.jsonl"
PARAMS_DIR = "params"
QUARANTINE = RESULTS + ".quarantine"
LOCK = ".writer.lock"
#: 1: unchecked JSON lines, candidate key = key(seed). 2: sha256 per record,
#: candidate key from (point, seed). 3: any task; records hold `test_score`
#: (was `test_accuracy`) and `score_source`. 4: the manifest records each grid
#: point's DpEvent and program digest (`jaxdp_mechanism`). 5: a search's candidates hold keys
#: split from the search key (records' `seed` is None; `id` hashes the key).
POOL_FORMAT = 5
_CHECKSUM = "sha256"
_RESERVED = "jaxdp_pool"
#: The manifest's record of what each grid point computes: part -> point key -> value.
_MECHANISM = "jaxdp_mechanism"
#: Why a pool of another sweep is refused (`jaxdp.sweep.store` says it of a search).
_WHY = "Resuming it would mix candidates of another sweep or mechanism with this one's."


class PoolMismatchError(ValueError):
  """The run directory belongs to a different sweep configuration (or format)."""


class SearchMismatchError(PoolMismatchError):
  """`run_dir` holds another search or sweep: resuming it now would run another mechanism (or
  another draw) than the one its stored candidates ran, so it is refused, naming what differs.

  Attributes:
    parts: the parts of the manifest that differ (`()` when the error is not a manifest's).
    changes: a line per change, `name: stored X, now Y` (public values only).
  """

  def __init__(self, message: str, parts: Sequence[str] = (), changes: Sequence[str] = ()):
    super().__init__(message)
    self.parts, self.changes = tuple(parts), tuple(changes)


class PoolLockedError(RuntimeError):
  """Another writer (another process, or an open `ResultPool`) holds the run directory."""


class ParamsDamagedError(ValueError):
  """A record's parameter file is missing or fails its checksum (the record can be dropped)."""


def _json_safe(value):
  if isinstance(value, np.generic):
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return repr(value)  # "nan", "inf": JSON has no literal for them
  return value


def _from_json(value):
  if value in ("nan", "inf", "-inf"):
    return float(value)
  return value


def _canonical(obj) -> str:
  return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _checksum(record: Mapping[str, Any]) -> str:
  return hashlib.sha256(_canonical(record).encode()).hexdigest()


def _fsync_dir(path: str) -> None:
  # Makes a rename or a new file's directory entry durable, not only its bytes.
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def _atomic_write(path: str, data: bytes) -> None:
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
  _fsync_dir(os.path.dirname(path) or ".")


def _lines(records: Iterable[Mapping[str, Any]]) -> bytes:
  """Records as the pool file stores them: canonical JSON with their checksum, one per line."""
  out = []
  for r in records:
    safe = {k: _json_safe(v) for k, v in r.items()}
    out.append(_canonical(dict(safe, **{_CHECKSUM: _checksum(safe)})) + "\n")
  return "".join(out).encode()


def _parse_line(raw: bytes):
  """(record, None) for a valid line, else (None, why it is not)."""
  try:
    obj = json.loads(raw.decode("utf-8"))
  except (UnicodeDecodeError, ValueError):
    return None, "not valid JSON"
  if not isinstance(obj, dict):
    return None, "not a JSON object"
  stored = obj.pop(_CHECKSUM, None)
  if stored is None:
    return None, f"no {_CHECKSUM} field"
  if stored != _checksum(obj):
    return None, "checksum mismatch"
  if not isinstance(obj.get("id"), str):
    return None, "no candidate id"
  return obj, None


class ResultPool:
  """Finished candidates of one sweep, persisted in `run_dir`.

  Use it as a context manager (or call `close()`) so the writer lock is
  released; `run_sweep` does this itself.

  Args:
    run_dir: directory (created if missing, unless `read_only`).
    fingerprint: JSON-serialisable mapping describing the sweep; must match
      the one stored in an existing directory.
    read_only: read the pool without taking the writer lock, repairing or
      writing anything (e.g. while a sweep is filling it, or from a read-only
      copy). Damaged lines are reported and skipped, but left in place.
    mechanism: None, or what each grid point's candidates compute
      (`jaxdp.sweep.SearchPlan.mechanism`: part -> point key -> value).
      Points the manifest records must agree; the others are added (not in
      `read_only`). None checks nothing of it (a reader); a reader may also
      leave out the data and initial-parameter digests `run_sweep` adds to
      the fingerprint.

  Raises:
    SearchMismatchError: `run_dir` holds another fingerprint, another
      mechanism at a recorded point, or a record whose `dp_event` is not its
      point's; the message names each part that differs and where.
    PoolMismatchError: `run_dir` holds an older pool format, a damaged
      manifest, or results without a manifest.
    PoolLockedError: another writer holds `run_dir`.
    ValueError: `run_dir` cannot be created or written, or `fingerprint` is
      not a mapping.
  """

  def __init__(self, run_dir: str, fingerprint: Mapping[str, Any], *, read_only: bool = False,
               mechanism: Optional[Mapping[str, Mapping[str, str]]] = None):
    self.run_dir = os.fspath(run_dir)
    self.read_only = bool(read_only)
    if not isinstance(fingerprint, Mapping):
      raise ValueError(f"fingerprint must be a mapping, got {type(fingerprint).__name__}")
    for reserved in (_RESERVED, _MECHANISM):
      if reserved in fingerprint:
        raise ValueError(f"fingerprint must not use the reserved key {reserved!r}")
    self.fingerprint = json.loads(json.dumps(fingerprint, sort_keys=True, default=str))
    self.mechanism = checked_mechanism(mechanism)
    self._path = os.path.join(self.run_dir, RESULTS)
    self.quarantine_path = os.path.join(self.run_dir, QUARANTINE)
    self._lock_fd: Optional[int] = None
    if self.read_only:
      if not os.path.isdir(self.run_dir):
        raise ValueError(f"run_dir={self.run_dir!r} is not a directory")
    else:
      try:
        os.makedirs(self.run_dir, exist_ok=True)
      except OSError as err:
        raise ValueError(f"run_dir={self.run_dir!r} cannot be created: {err}") from None
      self._lock()
    try:
      self._check_manifest()
      self._records, self._size = self._load()
      self._check_records()
    except BaseException:
      self.close()
      raise
    self._ids = {r["id"] for r in self._records}

  # -- writer lock ------------------------------------------------------------

  def _not_writable(self, err: OSError) -> ValueError:
    return ValueError(
        f"run_dir={self.run_dir!r} is not writable ({err.strerror or err}); a sweep writes its "
        "results and a lock file there. Nothing was changed. To read the pool, use "
        "ResultPool(run_dir, fingerprint, read_only=True)")

  def _lock(self) -> None:
    path = os.path.join(self.run_dir, LOCK)
    try:
      fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
      raise self._not_writable(err) from None
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
      holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
      os.close(fd)
      if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        raise
      who = ("another ResultPool in this process (close it first)" if holder == str(os.getpid())
             else f"another process (pid {holder})")
      raise PoolLockedError(
          f"run directory {self.run_dir!r} is locked: {who} is writing it. Two writers would "
          "train the same candidates twice; wait for it to finish or use another directory"
      ) from None
    self._lock_fd = fd
    try:
      # A lock file can stay writable in a directory that is not: probe the
      # directory and the results file before any training is spent.
      probe = os.path.join(self.run_dir, f".write-probe-{os.getpid()}")
      os.close(os.open(probe, os.O_WRONLY | os.O_CREAT, 0o644))
      os.unlink(probe)
      if os.path.exists(self._path):
        os.close(os.open(self._path, os.O_WRONLY))
      os.ftruncate(fd, 0)
      os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as err:
      self.close()
      raise self._not_writable(err) from None

  def close(self) -> None:
    """Releases the writer lock; records stay readable, appends are refused."""
    if self._lock_fd is not None:
      fd, self._lock_fd = self._lock_fd, None
      try:
        fcntl.flock(fd, fcntl.LOCK_UN)
      finally:
        os.close(fd)

  def __enter__(self) -> "ResultPool":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def __del__(self):
    try:
      self.close()
    except Exception:  # pylint: disable=broad-except
      pass  # interpreter shutdown: the kernel drops the lock with the process

  # -- manifest ---------------------------------------------------------------

  def _expected_manifest(self) -> dict:
    return dict(self.fingerprint, **{_RESERVED: {"format": POOL_FORMAT, "candidate_keys": KEY_DERIVATION},
                                     _MECHANISM: self.mechanism})

  def _check_manifest(self) -> None:
    path = os.path.join(self.run_dir, MANIFEST)
    expected = self._expected_manifest()
    self.existed = os.path.exists(path)
    if not self.existed:
      if os.path.exists(self._path) and os.path.getsize(self._path):
        raise PoolMismatchError(
            f"run directory {self.run_dir!r} holds results but no {MANIFEST}, so what they were "
            "trained for is unknown; use a new directory, or delete this one to start over")
      if self.read_only:
        raise PoolMismatchError(f"run directory {self.run_dir!r} holds no pool (no {MANIFEST})")
      self._write_manifest(path, expected)
      return
    try:
      stored = manifest.read(path, self.run_dir, expected[_RESERVED], reserved=_RESERVED)
    except manifest.ManifestError as err:
      raise PoolMismatchError(str(err)) from None
    recorded = stored.pop(_MECHANISM, None) or {}
    del expected[_MECHANISM]
    if self.read_only:  # a reader need not restate what run_sweep added (it writes nothing)
      for key in (DATA_KEY, INITIAL_KEY):
        if key not in expected:
          stored.pop(key, None)
    diff, details = manifest.differences(stored, expected)
    parts, part_details, merged, added = manifest.merged_mechanism(recorded, self.mechanism)
    if diff or parts:
      raise SearchMismatchError(
          mismatch_message(self.run_dir, diff + parts, details + part_details, _WHY),
          diff + parts, details + part_details)
    self.mechanism = merged
    if added and not self.read_only:
      # New grid points: recorded before any of their candidates is stored.
      self._write_manifest(path, dict(stored, **{_MECHANISM: merged}))

  def _write_manifest(self, path: str, manifest: Mapping[str, Any]) -> None:
    try:
      _atomic_write(path, json.dumps(manifest, indent=2, sort_keys=True).encode())
    except OSError as err:
      raise self._not_writable(err) from None

  def _check_records(self) -> None:
    """Every stored record's `dp_event` is its grid point's (defence in depth: the manifest
    agrees already, unless it or a record was written by something else)."""
    events = self.mechanism.get("dp_events", {})
    for r in self._records:
      point = r.get("point")
      key = point_key(point) if isinstance(point, Mapping) and point else None
      if key in events and r.get("dp_event") != events[key]:
        raise SearchMismatchError(
            f"run directory {self.run_dir!r} holds a different sweep (differs in: dp_event of a stored "
            f"candidate; " + difference(f"its grid point {key}", r.get("dp_event", ABSENT),
                                                   events[key])
            + "); its score was computed by another mechanism than the one accounted now; use a "
            "new directory, or delete this one to start over")

  # -- records ----------------------------------------------------------------

  def _load(self) -> tuple:
    if not os.path.exists(self._path):
      return [], 0
    with open(self._path, "rb") as f:
      data = f.read()
    lines = data.split(b"\n")
    unterminated = lines[-1] != b""
    if not unterminated:
      lines.pop()
    kept, records, bad, first_line = [], [], [], {}
    for number, raw in enumerate(lines, start=1):
      if not raw.strip():
        continue
      record, why = _parse_line(raw)
      if why is not None and number == len(lines) and unterminated:
        why += ", unterminated last line (a write cut short)"
      if why is None and record["id"] in first_line:
        bad.append((number, raw, f"repeated record: it repeats the candidate first stored "
                                 f"at line {first_line[record['id']]}, which is kept"))
        continue
      if why is not None:
        bad.append((number, raw, f"corrupted line ({why}); this candidate will be trained again"))
        continue
      first_line[record["id"]] = number
      kept.append(raw)
      records.append({k: _from_json(v) for k, v in record.items()})
    clean = b"".join(raw + b"\n" for raw in kept)
    if clean == data:
      return records, len(data)
    if self.read_only:
      for number, _, why in bad:
        warnings.warn(f"{self._path}, line {number}: {why}; skipped here, the file is left "
                      "unchanged (read_only)", stacklevel=3)
      return records, len(data)
    if bad:
      # Quarantine first, then replace: a crash in between duplicates a bad
      # line into the quarantine but can never lose it.
      with open(self.quarantine_path, "ab") as f:
        f.write(b"".join(raw + b"\n" for _, raw, _ in bad))
        f.flush()
        os.fsync(f.fileno())
      for number, _, why in bad:
        warnings.warn(f"{self._path}, line {number}: {why}; the line was moved to "
                      f"{self.quarantine_path} and every valid record is kept", stacklevel=3)
    _atomic_write(self._path, clean)
    return records, len(clean)

  @property
  def records(self) -> list:
    """Every finished candidate, as dicts, in completion order, one per id."""
    return list(self._records)

  def done_ids(self) -> set:
    return set(self._ids)

  def _check_writable(self) -> None:
    if self.read_only or self._lock_fd is None:
      state = "read_only" if self.read_only else "closed"
      raise ValueError(f"the pool of {self.run_dir!r} is {state}; open a new ResultPool to write")

  def append(self, records: Iterable[Mapping[str, Any]],
             params: Optional[Mapping[str, Any]] = None) -> None:
    """Appends records durably: one write and one fsync for the whole batch.

    Args:
      records: the records (each a mapping with a string `id`).
      params: optional id -> parameter pytree for some of them: written to
        one file (fsynced) before the records, which then point to it.

    Raises:
      ValueError: a record has no string `id`, repeats an id already in the
        pool or in the batch, or the pool is read-only or closed.
    """
    self._check_writable()
    records = [dict(r) for r in records]
    if params:
      stored = self._write_params(params)
      records = [dict(r, params=stored[r["id"]]) if r.get("id") in stored else r for r in records]
    normal, ids = [], set()
    for r in records:
      safe = {str(k): _json_safe(v) for k, v in dict(r).items()}
      # The round trip makes memory hold exactly what a reload will read back.
      safe = json.loads(_canonical(safe))
      rid = safe.get("id")
      if not isinstance(rid, str):
        raise ValueError(f"every record needs a string 'id', got {rid!r}")
      if rid in self._ids or rid in ids:
        raise ValueError("a record's id is already in the pool; each candidate is stored once")
      safe.pop(_CHECKSUM, None)
      ids.add(rid)
      normal.append(safe)
    if not normal:
      return
    data = _lines(normal)
    created = not os.path.exists(self._path)
    fd = os.open(self._path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
      # Written at the end of the known-good data (not O_APPEND), so the bytes
      # of an earlier failed write are overwritten rather than glued to a record.
      try:
        view = memoryview(data)
        offset = self._size
        while view:
          n = os.pwrite(fd, view, offset)
          view, offset = view[n:], offset + n
        os.ftruncate(fd, self._size + len(data))
        os.fsync(fd)
      except OSError:
        os.ftruncate(fd, self._size)
        raise
    finally:
      os.close(fd)
    if created:
      _fsync_dir(self.run_dir)
    self._size += len(data)
    self._ids |= ids
    self._records.extend({k: _from_json(v) for k, v in r.items()} for r in normal)


  # -- parameters -------------------------------------------------------------

  def _write_params(self, params: Mapping[str, Any]) -> dict:
    """Writes every tree's leaves to one file (as raw bytes: any dtype); id -> its record field."""
    arrays, layout = {}, {}
    for rid, tree in params.items():
      leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]
      layout[rid] = [[str(leaf.dtype), list(leaf.shape)] for leaf in leaves]
      for i, leaf in enumerate(leaves):
        arrays[f"{rid}/{i}"] = np.ascontiguousarray(leaf).reshape(-1).view(np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    data = buffer.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    name = f"{PARAMS_DIR}/{digest[:24]}.npz"
    directory = os.path.join(self.run_dir, PARAMS_DIR)
    os.makedirs(directory, exist_ok=True)
    _atomic_write(os.path.join(self.run_dir, name), data)
    return {rid: {"file": name, "sha256": digest, "leaves": layout[rid]} for rid in params}

  def load_params(self, records: Sequence[Mapping[str, Any]]) -> dict:
    """id -> the list of parameter leaves of each record, checked against its file's sha256.

    Raises:
      ParamsDamagedError: a record has no parameters, or its file is missing or
        damaged; `error.ids` lists every record of `records` it costs.
    """
    out, files, damaged = {}, {}, {}
    for r in records:
      ref = r.get("params")
      if not isinstance(ref, Mapping):
        damaged[r["id"]] = "the record holds no parameters"
        continue
      if ref["file"] not in files:
        files[ref["file"]] = self._read_params_file(ref)
      found = files[ref["file"]]
      if isinstance(found, str):
        damaged[r["id"]] = found
        continue
      out[r["id"]] = [np.frombuffer(found[f"{r['id']}/{i}"].tobytes(), dtype=jnp.dtype(dtype)).reshape(shape).copy()
                      for i, (dtype, shape) in enumerate(ref["leaves"])]
    if damaged:
      err = ParamsDamagedError(f"{len(damaged)} record(s) of {self.run_dir!r} lost their parameters: "
                               + "; ".join(sorted(set(damaged.values()))))
      err.ids = sorted(damaged)
      raise err
    return out

  def _read_params_file(self, ref: Mapping[str, Any]):
    path = os.path.join(self.run_dir, ref["file"])
    try:
      with open(path, "rb") as f:
        data = f.read()
    except OSError as err:
      return f"{ref['file']} cannot be read ({err.strerror or err})"
    if hashlib.sha256(data).hexdigest() != ref["sha256"]:
      return f"{ref['file']} fails its checksum"
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
      return {k: npz[k] for k in npz.files}

  def drop(self, ids: Iterable[str], why: str) -> None:
    """Moves the records of `ids` to the quarantine (with `why`), so they are trained again.

    The quarantine is written and fsynced first, then the pool file is
    replaced atomically: a crash in between duplicates a record into the
    quarantine but never loses one.
    """
    self._check_writable()
    ids = set(ids)
    if not ids & self._ids:
      return
    keep = [r for r in self._records if r["id"] not in ids]
    gone = [r for r in self._records if r["id"] in ids]
    with open(self.quarantine_path, "ab") as f:
      f.write(_lines(gone))
      f.flush()
      os.fsync(f.fileno())
    data = _lines(keep)
    _atomic_write(self._path, data)
    warnings.warn(f"{self._path}: {len(gone)} record(s) moved to {self.quarantine_path} ({why}); "
                  "they will be trained again", stacklevel=2)
    self._records, self._size, self._ids = keep, len(data), {r["id"] for r in keep}
