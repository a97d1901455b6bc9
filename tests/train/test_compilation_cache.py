"""`jaxdp.train.compilation_cache`: off unless asked for, a second process compiles nothing, no
data value is baked into what the cache holds, and the number of rows is (why it is secret).

The cache is per process state of JAX, so every case runs in a fresh interpreter
with the test session's cache settings removed from its environment.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A search of a DP logistic regression on digits whose inputs are replaced by
# random float32 values of the given seed (every 4 bytes distinct): the bytes a
# baked-in constant would leave in an executable. A user's own jit compiles
# first, so the cache must be turned on after JAX's first compilation.
_SEARCH = textwrap.dedent("""
    import dataclasses, json, sys, time
    import jax, numpy as np
    jax.jit(lambda a: a + 1)(np.ones(3))
    from jaxdp import accounting as acc
    from jaxdp.data import DataSplit, Dataset, load_dataset
    from jaxdp.train import TrainConfig, compilation_cache, presets, train_candidate
    from jaxdp.tuning import random_search
    digits = load_dataset("digits")
    rng = np.random.default_rng(int(sys.argv[1]))
    def noise(split):
      return DataSplit(rng.standard_normal(split.inputs.shape).astype(np.float32), split.labels)
    data = dataclasses.replace(digits, train=noise(digits.train), test=noise(digits.test))
    if len(sys.argv) > 3:  # a neighbour: one more training row, the same declared size
      extra = noise(digits.train)
      data = dataclasses.replace(data, train=DataSplit(
          np.concatenate([data.train.inputs, extra.inputs[:1]]),
          np.concatenate([data.train.labels, extra.labels[:1]])))
    np.save(sys.argv[2], np.concatenate([data.train.inputs.ravel(), data.test.inputs.ravel()]))
    config = TrainConfig(task=presets.classifier(10), l2_clip_norm=1.0, noise_multiplier=1.0,
                         sampling_prob=0.05, steps=5, hparams=dict(learning_rate=1.0, model="logreg"))
    lone = train_candidate(config, data, jax.random.key(0))
    start = time.perf_counter()
    result = random_search(config, {"learning_rate": [0.5, 2.0]}, data, distribution=acc.Fixed(2),
                           key=jax.random.key(1))
    print(json.dumps({"dir": compilation_cache.cache_dir(), "lone_compile_s": lone.compile_time_s,
                      "search_s": time.perf_counter() - start, "score": result.score}))
""")

# A program that closes over an array: XLA bakes it in as a constant. The scan
# below must find it (else it could not find a baked-in data array either).
_BAKED = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    from jaxdp.train import compilation_cache
    compilation_cache.enable()
    x = np.random.default_rng(7).standard_normal((64, 16)).astype(np.float32)
    np.save(sys.argv[1], x.ravel())
    jax.jit(lambda w: jnp.tanh(jnp.asarray(x) @ w)).lower(np.ones(16, np.float32)).compile()
""")


def _env(tmp_path, **extra):
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE", "JAXDP_COMPILATION"))}
  env.pop("XLA_FLAGS", None)
  env.update(PYTHONPATH=ROOT, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", **extra)
  return env


def _python(script: str, *args: str, env) -> str:
  proc = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True,
                        text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout


def _entries(directory):
  from jax._src import compilation_cache as jax_cc  # pylint: disable=g-import-not-at-top
  for name in sorted(os.listdir(directory)):
    if name.endswith("-cache"):
      with open(os.path.join(directory, name), "rb") as f:
        yield name, jax_cc.decompress_executable(f.read())


def _holds_any_of(blob: bytes, values: np.ndarray, width: int = 4) -> bool:
  """Whether `blob` holds `width` consecutive float32 values of `values` as their bytes, at
  any byte offset (the values are random, so distinct: a value's bits give its position)."""
  bits = values.astype("<f4").view("<u4")
  order = np.argsort(bits)
  ordered = bits[order]
  for offset in range(4):
    words = np.frombuffer(blob, "<u4", count=(len(blob) - offset) // 4, offset=offset)
    at = np.minimum(np.searchsorted(ordered, words), len(ordered) - 1)
    position = np.where(ordered[at] == words, order[at], -2)
    follows = (position[1:] == position[:-1] + 1) & (position[:-1] >= 0)
    if (np.convolve(follows, np.ones(width - 1), "valid") >= width - 1).any():
      return True
  return False


@pytest.mark.slow  # four fresh interpreters compiling a search: about a minute on 2 cores
def test_a_second_process_compiles_nothing_and_no_data_value_is_in_the_cache(tmp_path):
  directory = str(tmp_path / "cache")
  env = _env(tmp_path, JAXDP_COMPILATION_CACHE_DIR=directory)
  first = json.loads(_python(_SEARCH, "0", str(tmp_path / "data0.npy"), env=env).splitlines()[-1])
  assert first["dir"] == directory and oct(os.stat(directory).st_mode & 0o777) == oct(0o700)
  entries = dict(_entries(directory))
  assert entries and first["lone_compile_s"] > 0.3
  # Other data (same shapes): every program is read back, none compiled again.
  second = json.loads(_python(_SEARCH, "1", str(tmp_path / "data1.npy"), env=env).splitlines()[-1])
  assert set(dict(_entries(directory))) == set(entries)
  assert second["lone_compile_s"] < first["lone_compile_s"] / 3
  for seed in (0, 1):
    data = np.load(tmp_path / f"data{seed}.npy")
    for name, blob in _entries(directory):
      # XLA may fold x - c into x + (-c): both signs.
      assert not (_holds_any_of(blob, data) or _holds_any_of(blob, -data)), (
          f"data of run {seed} found in cache entry {name}")
  # The scan finds an array a program does close over.
  _python(_BAKED, str(tmp_path / "baked.npy"), env=env)
  baked = np.load(tmp_path / "baked.npy")
  assert [name for name, blob in _entries(directory) if _holds_any_of(blob, baked)]
  # But a program is compiled for its shapes: one more private row, other programs. This is
  # why the cache is off by default and, when on, secret like the data (module docstring).
  before = set(os.listdir(directory))
  _python(_SEARCH, "2", str(tmp_path / "data2.npy"), "neighbour", env=env)
  assert set(os.listdir(directory)) - before


def _resolved(tmp_path, **extra) -> list:
  script = ("import jax; from jaxdp.train import compilation_cache as c; "
            "print(c.enable()); print(jax.config.jax_compilation_cache_dir)")
  return _python(script, env=_env(tmp_path, **extra)).split()


def test_off_unless_asked_for_and_where_it_lives(tmp_path):
  assert _resolved(tmp_path) == ["None", "None"]
  mine = str(tmp_path / "mine")
  assert _resolved(tmp_path, JAXDP_COMPILATION_CACHE_DIR=mine) == [mine, mine]
  assert oct(os.stat(mine).st_mode & 0o777) == oct(0o700)
  # A directory the user gave JAX is used as it is; JAX's own switch turns it off.
  theirs = str(tmp_path / "theirs")
  assert _resolved(tmp_path, JAX_COMPILATION_CACHE_DIR=theirs, JAXDP_COMPILATION_CACHE_DIR=mine) == [
      theirs, theirs]
  assert not os.path.exists(theirs)  # left to JAX, which creates it at its first compilation
  assert _resolved(tmp_path, JAX_ENABLE_COMPILATION_CACHE="false",
                   JAXDP_COMPILATION_CACHE_DIR=mine)[0] == "None"


def test_a_directory_open_to_other_users_is_warned_about(tmp_path):
  shared = tmp_path / "shared"
  shared.mkdir(mode=0o755)
  os.chmod(shared, 0o755)
  script = ("import warnings; warnings.simplefilter('error'); "
            "from jaxdp.train import compilation_cache as c; c.enable()")
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                        env=_env(tmp_path, JAXDP_COMPILATION_CACHE_DIR=str(shared)), check=False)
  assert proc.returncode != 0 and "open to other users (mode 755)" in proc.stderr
  assert "chmod 700" in proc.stderr
