"""JAX's persistent compilation cache, on request: a second process compiles nothing twice.

Every program jaxdp compiles goes through `jaxdp.train.program.compile_cached`,
which calls `enable()` first. The cache is JAX's own
(`jax.experimental.compilation_cache`), keyed by the program, its compile
options, the XLA flags, the backend and the JAX version, in one directory:

  1. the directory the user gave JAX (`JAX_COMPILATION_CACHE_DIR`, or
     `jax.config.update("jax_compilation_cache_dir", ...)`), used as it is;
  2. else `$JAXDP_COMPILATION_CACHE_DIR`, made with mode 0o700 if missing;
  3. else none: the cache is off.

JAX's own switch (`jax_enable_compilation_cache=False`) turns it off too, and
JAX's thresholds apply: by default only programs that took at least a second to
compile are written (`jax_persistent_cache_min_compile_time_secs`).

**Why it is off unless asked for, and secret like the data when on.** No
data value is baked into a jaxdp program: every array reaches a program as an
argument (`tests/train/test_compilation_cache.py` scans every entry for the
data's values). But a program is compiled for its arguments' shapes, so an
entry (its contents and its file name, a hash of the program) records the
number of rows of every split, the private training set's included, and of a
subset a `subsampled_search` drew: under add/remove-one neighbours, that
count is what tells the two data sets apart. The entries also show which
programs a search compiled, and when (the static hyperparameters of the
candidates drawn; for a threshold search, how many were tried). Once on,
JAX writes every later compilation of the process there, a user's own too
(a jit that closes over data bakes that data in). So a cache directory is
trusted like code and secret like the data, as a `run_dir` is: only your
user may read or write it.
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import Optional

import jax

ENV = "JAXDP_COMPILATION_CACHE_DIR"

_lock = threading.Lock()
_enabled_dir: Optional[str] = None


def cache_dir() -> Optional[str]:
  """The directory compiled programs are kept in, or None when the cache is off."""
  if not jax.config.jax_enable_compilation_cache:
    return None
  configured = jax.config.jax_compilation_cache_dir
  if configured:
    return configured
  chosen = os.environ.get(ENV, "").strip()
  return os.path.abspath(os.path.expanduser(chosen)) if chosen else None


def enable() -> Optional[str]:
  """Turns JAX's persistent compilation cache on at `cache_dir()` (once per process).

  Returns the directory in use, or None when the cache is off or the
  directory cannot be created (then programs compile as without a cache).
  Warns when other users may read or write the directory.
  """
  global _enabled_dir
  with _lock:
    path = cache_dir()
    if path is None or path == _enabled_dir:
      return path
    if path != jax.config.jax_compilation_cache_dir:
      try:
        os.makedirs(path, mode=0o700, exist_ok=True)
      except OSError:
        return None
      from jax.experimental.compilation_cache import compilation_cache  # pylint: disable=g-import-not-at-top
      compilation_cache.set_cache_dir(path)
      # JAX decides once per process, at its first compilation, whether a cache is in use;
      # anything compiled before this call (a data transform, a user's own jit) must not
      # leave it off.
      compilation_cache.reset_cache()
    _enabled_dir = path
  if os.path.isdir(path) and os.stat(path).st_mode & 0o077:
    warnings.warn(f"the compilation cache {path} is open to other users (mode "
                  f"{os.stat(path).st_mode & 0o777:o}): it records the number of training rows, "
                  f"so keep it as private as the data (chmod 700 {path})", stacklevel=2)
  return path
