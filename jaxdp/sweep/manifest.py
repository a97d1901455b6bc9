"""What a run directory's manifest says its search is, and how another search differs from it.

The manifest (`jaxdp.sweep.pool.MANIFEST`) holds a search's fingerprint (what
decides its draws and its release) and its mechanism per grid point (each
point's configuration, DpEvent and program digest). A search opened on a run
directory of another is refused, naming the first place they differ (never a
digest of a secret: `SECRET_FIELDS`).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from jaxdp.sweep.space import MECHANISM_PARTS

#: Characters of a value a mismatch message quotes.
_SHORT = 240


class ManifestError(ValueError):
  """A manifest that no complete pool of this jaxdp wrote (the pool raises PoolMismatchError)."""


ABSENT = type("_Absent", (), {"__repr__": lambda self: "(absent)"})()


def _short(value) -> str:
  text = repr(value)
  return text if len(text) <= _SHORT else text[:_SHORT] + "..."


#: Fingerprint fields whose values a mismatch message never shows: the search key's digest (a
#: seed's is found by trying seeds) and a function's identity's (it digests the values the
#: function reads, which may be private).
SECRET_FIELDS = frozenset({"key", "train_fn", "dp_event_fn"})


def difference(path: str, stored, now) -> str:
  """'path[...]: stored X, now Y' at the first place two JSON values differ ('path: differs'
  for a `SECRET_FIELDS` path)."""
  if path in SECRET_FIELDS:
    return f"{path}: differs (its digests are not shown)"
  if isinstance(stored, dict) and isinstance(now, dict):
    for k in sorted(set(stored) | set(now), key=str):
      a, b = stored.get(k, ABSENT), now.get(k, ABSENT)
      if a != b:
        return difference(f"{path}[{k!r}]", a, b)
  if isinstance(stored, list) and isinstance(now, list) and len(stored) == len(now):
    for i, (a, b) in enumerate(zip(stored, now)):
      if a != b:
        return difference(f"{path}[{i}]", a, b)
  return f"{path}: stored {_short(stored)}, now {_short(now)}"


def checked_mechanism(mechanism) -> dict:
  """`mechanism` as plain JSON (part -> point key -> string); ValueError unless it is one."""
  if mechanism is None:
    return {}
  ok = isinstance(mechanism, Mapping) and all(
      part in MECHANISM_PARTS and isinstance(entries, Mapping)
      and all(isinstance(k, str) and isinstance(v, str) for k, v in entries.items())
      for part, entries in mechanism.items())
  if not ok:
    raise ValueError(f"mechanism must be None or a mapping part -> {{grid point key: str}} with parts "
                     f"in {MECHANISM_PARTS} (jaxdp.sweep.SearchPlan.mechanism), got {mechanism!r:.200}")
  return {part: dict(entries) for part, entries in mechanism.items()}


def read(path: str, run_dir: str, reserved_value: Any, *, reserved: str) -> dict:
  """The manifest at `path`, checked to be a JSON object of this pool format and key derivation
  (`reserved_value` under the key `reserved`).

  Raises:
    ManifestError: it is empty or not a JSON object, predates formats (no `reserved` key), or
      holds another format or key derivation.
  """
  with open(path, "rb") as f:
    text = f.read()
  try:
    stored = json.loads(text)
  except ValueError:
    stored = None
  if not isinstance(stored, dict):
    what = "is empty" if not text.strip() else "is not a JSON object"
    raise ManifestError(f"{path} {what}: this directory was not written by a complete ResultPool; "
                        "use a new directory, or delete this one to start over")
  if reserved not in stored:
    raise ManifestError(
        f"run directory {run_dir!r} holds a different sweep: a pool made by an older jaxdp "
        "(format 1), whose candidates took their PRNG key from the seed alone, so every grid "
        "point with the same seed shared its noise and batches. Those coupled runs cannot be "
        "mixed with independent ones; use a new directory, or delete this one to retrain")
  if stored[reserved] != reserved_value:
    raise ManifestError(
        f"run directory {run_dir!r} holds a different sweep: pool format/key derivation "
        f"{stored[reserved]!r}, this jaxdp writes {reserved_value!r}; use a new directory, "
        "or delete this one to start over")
  return stored


def differences(stored: Mapping[str, Any], expected: Mapping[str, Any]) -> tuple:
  """(the fingerprint fields that differ, a `difference` line for each)."""
  diff = sorted(k for k in set(stored) | set(expected) if stored.get(k) != expected.get(k))
  return diff, [difference(k, stored.get(k, ABSENT), expected.get(k, ABSENT)) for k in diff]


def merged_mechanism(recorded: Mapping[str, Mapping[str, str]],
                     mechanism: Mapping[str, Mapping[str, str]]) -> tuple:
  """(the parts whose points clash, a line for each, the merged mechanism, whether it adds
  points): a search may add grid points, never change what a recorded point computes."""
  parts, details, merged, added = [], [], {}, False
  for part in sorted(set(recorded) | set(mechanism)):
    old, new = recorded.get(part, {}), mechanism.get(part, {})
    clash = sorted(k for k in set(old) & set(new) if old[k] != new[k])
    if clash:
      parts.append(part)
      first = clash[0]
      if part == "programs":  # digests of what the code reads: never shown
        detail = (f"programs at grid point {first}: differ (the task's code as traced: model, "
                  "loss, score, optimizer, clipping path or trainable set; or a training "
                  "function's code or what it reads)")
      else:
        detail = difference(f"{part} at grid point {first}", old[first], new[first])
      details.append(detail + (f" (and {len(clash) - 1} more point(s))" if len(clash) > 1 else ""))
    added |= bool(set(new) - set(old))
    merged[part] = {**new, **old}
  return parts, details, merged, added
