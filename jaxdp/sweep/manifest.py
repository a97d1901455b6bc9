"""What a run directory's manifest says its search is, and how another search differs from it.

The manifest (`jaxdp.sweep.pool.MANIFEST`) holds a search's fingerprint (what
decides its draws and its release) and its mechanism per grid point (each
point's configuration, DpEvent and program digest). A search opened on a run
directory of another is refused by a diff, one `name: stored X, now Y` line per
change (nested names flattened, a change at every grid point said once), under
`LIMIT` characters; a secret (`SECRET_FIELDS`) or a program's digest is named by
what it is, never shown.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Sequence

from jaxdp.sweep.space import MECHANISM_PARTS

#: Characters of one value a mismatch message quotes, and of the whole message (issue 45: a
#: message that cuts off before the values that differ, or buries them, is not read).
_SHORT, LIMIT = 80, 800
#: What `jaxdp.sweep.SearchPlan.fingerprint` adds: the data's sha256 and the public start's digest.
DATA_KEY, INITIAL_KEY = "jaxdp_data", "jaxdp_initial_params"


class ManifestError(ValueError):
  """A manifest that no complete pool of this jaxdp wrote (the pool raises PoolMismatchError)."""


ABSENT = type("_Absent", (), {"__repr__": lambda self: "(absent)"})()


def _short(value) -> str:
  text = value if isinstance(value, str) and not isinstance(value, _Quoted) else repr(value)
  return text if len(text) <= _SHORT else text[:_SHORT - 3] + "..."


class _Quoted(str):
  """A string value of the configuration: quoted when shown (a repr's text is not)."""


#: Fingerprint fields whose values a mismatch message never shows, but says what they are: the
#: search key's digest (a seed's is found by trying seeds), a function's identity's (it digests
#: the values the function reads, which may be private), the data's and the public start's.
SECRET_FIELDS = {
    "key": "another PRNG key (its digest is not shown)",
    "train_fn": "another training function, or one that reads other values (not shown)",
    "dp_event_fn": "another dp_event function, or one that reads other values (not shown)",
    DATA_KEY: "other data (another sha256 of the rows or declared size; not shown)",
    INITIAL_KEY: "another public start (initial_params; its digest is not shown)",
}
_PROGRAM = ("the task's code as traced differs (model, loss, score, optimizer, clipping path or "
            "trainable set; or a training function's code or what it reads)")


def _leaves(path: str, stored, now) -> list:
  """[(path, stored, now)] at every place two JSON values differ, nested paths flattened
  ('execution.eval_batch_size', 'points[1].learning_rate')."""
  if stored == now:
    return []
  if isinstance(stored, dict) and isinstance(now, dict):
    return [leaf for k in sorted(set(stored) | set(now), key=str)
            for leaf in _leaves(f"{path}.{k}" if path else str(k), stored.get(k, ABSENT),
                                now.get(k, ABSENT))]
  if isinstance(stored, list) and isinstance(now, list) and len(stored) == len(now):
    return [leaf for i, (a, b) in enumerate(zip(stored, now)) for leaf in _leaves(f"{path}[{i}]", a, b)]
  quote = lambda v: _Quoted(v) if isinstance(v, str) else v
  return [(path, quote(stored), quote(now))]


def _window(stored: str, now: str) -> tuple:
  """The parts of two reprs that differ, widened to whole `name=value` items and the call
  around them ('GaussianDpEvent(noise_multiplier=1.0)'), with '...' where text is cut."""
  start = 0
  while start < min(len(stored), len(now)) and stored[start] == now[start]:
    start += 1
  end = 0
  while end < min(len(stored), len(now)) - start and stored[-1 - end] == now[-1 - end]:
    end += 1
  cut = max(stored.rfind(c, 0, start) for c in "(, [") + 1
  if cut > 0 and stored[cut - 1] == "(":  # the call's name too: 'GaussianDpEvent('
    cut = len(stored[:cut - 1].rstrip("_.ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"))

  def part(text):
    stop = len(text) - end
    closing = [i for i in (text.find(c, stop) for c in ",)]") if i >= 0]
    stop = min(closing) + (text[min(closing)] != ",") if closing else len(text)
    return ("..." if cut else "") + text[cut:stop] + ("..." if stop < len(text) else "")
  return part(stored), part(now)


def difference(path: str, stored, now) -> str:
  """'path: stored X, now Y' at each place two JSON values differ (at most three; a
  `SECRET_FIELDS` path says what it is instead of its values)."""
  if path in SECRET_FIELDS:
    return f"{path}: {SECRET_FIELDS[path]}"
  if isinstance(stored, str) and isinstance(now, str) and "(" in stored + now:
    stored, now = _window(stored, now)  # a repr (a DpEvent): the items that differ
    return f"{path}: stored {_short(stored)}, now {_short(now)}"
  lines = [f"{p}: stored {_short(a)}, now {_short(b)}" for p, a, b in _leaves(path, stored, now)]
  return "; ".join(lines[:3]) + (f"; and {len(lines) - 3} more" if len(lines) > 3 else "")


def _parsed(value):
  try:
    return json.loads(value) if isinstance(value, str) and value.startswith("{") else value
  except ValueError:
    return value


def _point_lines(part: str, old: Mapping[str, str], new: Mapping[str, str]) -> list:
  """One line per change of `part` at the common grid points, each change said once with
  where it is ('every grid point', or the first point and how many more)."""
  common = sorted(set(old) & set(new))
  where: dict = {}
  for k in common:
    if part == "programs":
      changes = [] if old[k] == new[k] else ["program: " + _PROGRAM]
    elif part == "dp_events":
      changes = [] if old[k] == new[k] else [difference("dp_event", old[k], new[k])]
    else:  # a configuration, as JSON: its fields by name (`noise_multiplier`, `task`, ...)
      changes = [difference(p, a, b) for p, a, b in _leaves("", _parsed(old[k]), _parsed(new[k]))]
    for change in changes:
      where.setdefault(change, []).append(k)
  lines = []
  for change, keys in where.items():
    at = ("every grid point" if len(keys) == len(common) > 1 else f"grid point {keys[0]}"
          + (f" and {len(keys) - 1} more" if len(keys) > 1 else ""))
    lines.append(f"{change} (at {at})")
  return lines


def mismatch_message(run_dir: str, parts: Sequence[str], lines: Sequence[str], why: str) -> str:
  """A run directory's refusal: the parts that differ, the changes (as many as fit in `LIMIT`
  characters, then how many more), `why` it is refused and the way out."""
  shown = run_dir if len(run_dir) <= 120 else "..." + run_dir[-117:]
  head = f"run directory {shown!r} holds a different search or sweep (differs in: {', '.join(parts)}):"
  tail = (f"\n{why} Use a new run_dir, or delete this one to start over; rerun the identical "
          "search to resume.")
  body, room = [], LIMIT - len(head) - len(tail) - 20
  for i, line in enumerate(lines):
    line = line if len(line) <= 240 else line[:237] + "..."
    if len(line) + 5 > room:
      body.append(f"  ... and {len(lines) - i} more")
      break
    body.append("  - " + line)
    room -= len(line) + 5
  return "\n".join([head, *body]) + tail


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
  """(the fingerprint fields that differ, a line for each place they do, nested paths
  flattened; a `SECRET_FIELDS` field says what it is instead)."""
  diff = sorted(k for k in set(stored) | set(expected) if stored.get(k) != expected.get(k))
  lines = []
  for k in diff:
    a, b = stored.get(k, ABSENT), expected.get(k, ABSENT)
    if k in SECRET_FIELDS:
      lines.append(difference(k, a, b))
    else:  # the tuner's arguments by their own names: `distribution`, not `accounted.distribution`
      prefix = "" if k == "accounted" and isinstance(a, dict) and isinstance(b, dict) else k
      lines.extend(_collapsed(_leaves(prefix, a, b)))
  return diff, lines


def _collapsed(leaves: list) -> list:
  """A line per change, one change at many indices of a list said once ('points[*].x: stored
  1.0, now 2.0 (at 8 indices)'), so a setting changed at every grid point is one line."""
  where: dict = {}
  for path, a, b in leaves:
    where.setdefault((re.sub(r"\[\d+\]", "[*]", path), repr(a), repr(b)), []).append((path, a, b))
  lines = []
  for (generic, _, _), same in where.items():
    path, a, b = same[0]
    lines.append(difference(path, a, b) if len(same) == 1
                 else f"{difference(generic, a, b)} (at {len(same)} indices)")
  return lines


def merged_mechanism(recorded: Mapping[str, Mapping[str, str]],
                     mechanism: Mapping[str, Mapping[str, str]]) -> tuple:
  """(the parts whose points clash, a line for each, the merged mechanism, whether it adds
  points): a search may add grid points, never change what a recorded point computes."""
  parts, details, merged, added = [], [], {}, False
  for part in sorted(set(recorded) | set(mechanism)):
    old, new = recorded.get(part, {}), mechanism.get(part, {})
    clash = _point_lines(part, old, new)
    if clash:
      parts.append(part)
      details.extend(clash)
    added |= bool(set(new) - set(old))
    merged[part] = {**new, **old}
  return parts, details, merged, added
