"""One bounded cache type for the whole package, and one way to empty every cache.

Accounting keeps PLDs, RDP curves and profiles by event; training keeps
compiled programs, shape checks and traced working sets by static structure.
Each is an `LruCache`; `clear_caches()` empties them all (tests compare cached
and uncached numbers; a long-lived process may free memory with it).
"""

from __future__ import annotations

import collections
import math
import threading

_ALL_CACHES: list = []


class LruCache:
  """A least-recently-used map bounded by entries and by the bytes its values hold.

  `get` returns None for a missing key (so None values are never cached).
  Thread-safe: one lock around each operation (values are built outside it,
  so two threads may build the same value; both are the same numbers).
  """

  def __init__(self, max_entries: int, max_bytes: float = math.inf):
    self.max_entries, self.max_bytes = max_entries, max_bytes
    self._items: collections.OrderedDict = collections.OrderedDict()
    self._bytes = 0
    self._lock = threading.Lock()
    _ALL_CACHES.append(self)  # so that `clear_caches` reaches every one

  def get(self, key):
    with self._lock:
      if key not in self._items:
        return None
      self._items.move_to_end(key)
      return self._items[key][0]

  def put(self, key, value, nbytes: int = 0) -> None:
    if value is None or nbytes > self.max_bytes:
      return  # a value over the whole budget is not kept at all
    with self._lock:
      if key in self._items:
        self._bytes -= self._items.pop(key)[1]
      self._items[key] = (value, nbytes)
      self._bytes += nbytes
      while len(self._items) > self.max_entries or self._bytes > self.max_bytes:
        self._bytes -= self._items.popitem(last=False)[1][1]

  def get_or_build(self, key, build):
    """The value at `key`, built by `build()` and kept if missing (entries only, no bytes)."""
    value = self.get(key)
    if value is None:
      value = build()
      self.put(key, value)
    return value

  def clear(self) -> None:
    with self._lock:
      self._items.clear()
      self._bytes = 0

  def __len__(self) -> int:
    return len(self._items)


def clear_caches() -> None:
  """Empties every `LruCache` of jaxdp (accounting and training alike)."""
  for cache in _ALL_CACHES:
    cache.clear()
