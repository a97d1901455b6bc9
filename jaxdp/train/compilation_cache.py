"""JAX's persistent compilation cache, on by default: a second process compiles nothing twice.

Every program jaxdp compiles goes through `jaxdp.train.program.compile_cached`,
which calls `enable()` first. The cache is then JAX's own
(`jax.experimental.compilation_cache`), keyed by the program, its compile
options, the XLA flags, the backend and the JAX version, in one directory:

  1. the directory the user gave JAX (`JAX_COMPILATION_CACHE_DIR`, or
     `jax.config.update("jax_compilation_cache_dir", ...)`), used as it is;
  2. else `$JAXDP_COMPILATION_CACHE_DIR`; the value `off` turns the cache off;
  3. else `$XDG_CACHE_HOME/jaxdp/xla` (default `~/.cache/jaxdp/xla`).

JAX's own switch (`jax_enable_compilation_cache=False`) turns it off too, and
JAX's thresholds apply: by default only programs that took at least a second to
compile are written (`jax_persistent_cache_min_compile_time_secs`).

**What it holds.** Compiled programs only: jaxdp passes every data array to
its programs as an argument, never as a constant baked into a program, so no
example and nothing computed from one is written there
(`tests/train/test_compilation_cache.py` scans every entry for the training
data's bytes). The directory lives outside any `run_dir`: it holds the
programs' structure (model shapes, hyperparameters traced as constants when
they are static), which is no more private than the code. As JAX says of
any compilation cache, whoever can write to it can run code in your process:
keep it private to your user (it is created with mode 0o700).
"""

from __future__ import annotations

import os
import threading
from typing import Optional

import jax

ENV = "JAXDP_COMPILATION_CACHE_DIR"
_OFF = "off"

_lock = threading.Lock()
_enabled_dir: Optional[str] = None


def default_dir() -> str:
  """`$XDG_CACHE_HOME/jaxdp/xla`, or `~/.cache/jaxdp/xla` when XDG_CACHE_HOME is unset."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "jaxdp", "xla")


def cache_dir() -> Optional[str]:
  """The directory compiled programs are kept in, or None when the cache is off."""
  if not jax.config.jax_enable_compilation_cache:
    return None
  configured = jax.config.jax_compilation_cache_dir
  if configured:
    return configured
  chosen = os.environ.get(ENV, "").strip()
  if chosen.lower() == _OFF:
    return None
  return os.path.abspath(os.path.expanduser(chosen)) if chosen else default_dir()


def enable() -> Optional[str]:
  """Turns JAX's persistent compilation cache on at `cache_dir()` (once per process).

  Returns the directory in use, or None when the cache is off or the
  directory cannot be created (then programs compile as without a cache).
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
    return path
