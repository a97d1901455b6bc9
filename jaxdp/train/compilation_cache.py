"""JAX's persistent compilation cache, on by default: a second process compiles nothing twice.

Every program jaxdp compiles goes through `jaxdp.train.program.compile_cached`,
which calls `enable()` first. The cache is JAX's own
(`jax.experimental.compilation_cache`), keyed by the program, its compile
options, the XLA flags, the backend and the JAX version, in one directory:

  1. the directory the user gave JAX (`JAX_COMPILATION_CACHE_DIR`, or
     `jax.config.update("jax_compilation_cache_dir", ...)`), used as it is:
     then JAX decides what it writes there (every program of the process
     that compiles for longer than its threshold, the user's own included);
  2. else `$JAXDP_COMPILATION_CACHE_DIR`;
  3. else `$XDG_CACHE_HOME/jaxdp/xla`, or `~/.cache/jaxdp/xla` without
     XDG_CACHE_HOME.

2 and 3 are made with mode 0o700 if missing, and there only jaxdp's own
programs are written: a user's `jax.jit` in the same process, before or after
a search, leaves nothing there, and XLA's own caches, which JAX would put
there for every program (the GPU autotune cache, keyed by each fusion's
shapes), are off (`jax_persistent_cache_enable_xla_caches="none"`).
`JAXDP_COMPILATION_CACHE=0` (or `false`, `off`, `no`) turns jaxdp's cache
off (not case 1: JAX's own switch governs that one,
`jax_enable_compilation_cache=False`, which turns either off). JAX's
thresholds apply: by default only programs that took at least a second to
compile are written (`jax_persistent_cache_min_compile_time_secs`).

**Why it holds nothing private.** No data value is baked into a jaxdp
program: every array reaches a program as an argument. And no private size
is a shape: the private splits reach every program padded to a public row
capacity with a mask of the real rows (`jaxdp.train.padding`), so data sets
of one declared size, whatever rows they hold (N, N + 1 or N - 1), share
every program and leave the same entries
(`tests/train/test_compilation_cache.py` scans the entries' constants for the
data's values and their parameter shapes for the row counts). A `DpScore`
reads its validation rows unpadded: its programs are never written.

**Nor K, nor which candidates were drawn.** Whether a search writes an
entry is the same for every draw (`jaxdp.sweep.engine._persistable`): its
program is written only when the plan has one program and the layout is the
same for every K >= 1 (one candidate per device, CPU's default, and a
data-parallel degree given or one device); a search that draws K = 0
compiles that program without running it (`engine.compile_unrun`). A layout
chosen for K (several candidates per device, an automatic data-parallel
degree on several devices) is never written: a limitation, as on an
accelerator the default layout depends on K (a layout from public numbers
only would lift it). Nothing compiled inside `unwritten()` is written: a
`TrainFunction`'s `train_fn` call (jaxdp training inside it included), a
Ray worker's chunk, another trainer than `LocalTrainer`. What the entries
show is public: the declared sizes, the code, the one program of a plan, a
lone run's configuration, and when each was first compiled. The cache is
trusted like code (an entry is an executable): only your user should write
to it, and a warning says when others may or own it.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import warnings
from typing import Iterator, Optional

import jax
# The thread-local form of a JAX setting (a context manager) is not exported by `jax.config`.
from jax._src import config as jax_config  # pylint: disable=g-importing-member
from jax.experimental.compilation_cache import compilation_cache as jax_cache

ENV = "JAXDP_COMPILATION_CACHE_DIR"
SWITCH = "JAXDP_COMPILATION_CACHE"
_OFF = ("0", "false", "off", "no")

_lock = threading.Lock()
_enabled_dir: Optional[str] = None
# jaxdp's own directory in use: JAX writes there only inside `writing` (thread-local).
_owned = False
_min_compile_s: float = 1.0  # the threshold the user set for JAX, applied inside `writing`
_xla_caches: Optional[str] = None  # the XLA caches the user let JAX enable, restored with their dir
# "Inside a search's candidate" (this thread): nothing compiled here is written (`unwritten`).
_local = threading.local()


def default_dir() -> str:
  """`$XDG_CACHE_HOME/jaxdp/xla`, or `~/.cache/jaxdp/xla` without XDG_CACHE_HOME."""
  base = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(os.path.abspath(base), "jaxdp", "xla")


def cache_dir() -> Optional[str]:
  """The directory jaxdp's compiled programs are kept in, or None when the cache is off."""
  if not jax.config.jax_enable_compilation_cache:
    return None
  configured = jax.config.jax_compilation_cache_dir
  if configured and not (_owned and configured == _enabled_dir):
    return configured  # the user's, given to JAX (one jaxdp set itself is its own)
  if os.environ.get(SWITCH, "").strip().lower() in _OFF:
    return None
  chosen = os.environ.get(ENV, "").strip()
  return os.path.abspath(os.path.expanduser(chosen)) if chosen else default_dir()


def enable() -> Optional[str]:
  """Turns JAX's persistent compilation cache on at `cache_dir()` (once per process).

  Returns the directory in use, or None when the cache is off or the
  directory cannot be created (then programs compile as without a cache).
  Warns when other users may read or write the directory.
  """
  global _enabled_dir, _owned, _min_compile_s, _xla_caches
  with _lock:
    path = cache_dir()
    if path is None or path == _enabled_dir:
      return path
    if path != jax.config.jax_compilation_cache_dir:
      try:
        os.makedirs(path, mode=0o700, exist_ok=True)
      except OSError:
        return None
      if not _owned:
        _min_compile_s = jax.config.jax_persistent_cache_min_compile_time_secs
        _xla_caches = jax.config.jax_persistent_cache_enable_xla_caches
      # Nothing is written but inside `writing`: a user's own jit (which may close over
      # data, baking it in) compiles below this process-wide threshold.
      jax.config.update("jax_persistent_cache_min_compile_time_secs", math.inf)
      # XLA's own caches (GPU autotune results keyed by each fusion's HLO, shapes included)
      # would be written for every program, whatever `writing` says: off in jaxdp's directory.
      jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
      jax_cache.set_cache_dir(path)
      # JAX decides once per process, at its first compilation, whether a cache is in use;
      # anything compiled before this call must not leave it off.
      jax_cache.reset_cache()
      _owned = True
    elif _owned:  # the user has given JAX a directory since: JAX's settings decide again
      jax.config.update("jax_persistent_cache_min_compile_time_secs", _min_compile_s)
      jax.config.update("jax_persistent_cache_enable_xla_caches", _xla_caches)
      jax_cache.reset_cache()
      _owned = False
    _enabled_dir = path
  _check_owner(path)
  return path


def _check_owner(path: str) -> None:
  """Warns when other users may write to `path` or own it: an entry is an executable."""
  if not os.path.isdir(path):
    return
  st = os.stat(path)
  if st.st_mode & 0o077:
    warnings.warn(f"the compilation cache {path} is open to other users (mode "
                  f"{st.st_mode & 0o777:o}): an entry is an executable this process "
                  f"may run, so keep it yours (chmod 700 {path})", stacklevel=3)
  elif hasattr(os, "getuid") and st.st_uid != os.getuid():
    warnings.warn(f"the compilation cache {path} belongs to another user (uid {st.st_uid}): an "
                  f"entry is an executable this process may run, so use a directory of your "
                  f"own ({ENV})", stacklevel=3)


@contextlib.contextmanager
def unwritten() -> Iterator[None]:
  """Nothing compiled in this block (this thread only) is written to the cache, whatever a
  `writing` inside it asks: a search's candidate (a training function's call, a Ray worker's
  chunk), whose programs and whether any compiles at all would tell of the draw."""
  depth = getattr(_local, "unwritten", 0)
  _local.unwritten = depth + 1
  try:
    yield
  finally:
    _local.unwritten = depth


@contextlib.contextmanager
def writing(persist: bool = True) -> Iterator[Optional[str]]:
  """Compilations in this block (this thread only) are jaxdp's own: with `persist`, the cache
  is on (`enable()`) and they are written under the user's threshold; without, none is written,
  wherever the cache is (a program whose shapes hold a private size). Yields `enable()`'s
  directory."""
  path = enable()
  if not persist or getattr(_local, "unwritten", 0):
    threshold = math.inf
  elif _owned and path is not None and path == _enabled_dir:
    threshold = _min_compile_s
  else:
    threshold = None  # the user's own JAX directory: JAX's settings decide
  if threshold is None:
    yield path
    return
  with jax_config.persistent_cache_min_compile_time_secs(threshold):
    yield path
