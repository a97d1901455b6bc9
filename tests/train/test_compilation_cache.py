"""`jaxdp.train.compilation_cache` and `jaxdp.train.padding`: on by default in a per-user
directory, a second process compiles nothing, neighbouring data sets (N - 1, N, N + 1 rows at one
declared N) share every program, no data value or private row count is in what the cache holds,
a user's own jit is never written there, and padding rows never change a bit of a result.

The cache is per process state of JAX, so every case runs in a fresh interpreter
with the test session's cache settings removed from its environment.
"""

import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
import types

import jax
import numpy as np
import pytest

from jaxdp.data import DataSplit, Dataset, row_capacity_for
from jaxdp.train import NoisyMean, TrainConfig, padding, presets, program
from jaxdp.train.loop_spec import traced_hparams
from jaxdp.train.run_plan import plan_runs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The searches of the cross-process test: a DP logistic regression scored by a NoisyMean on
# private validation rows, on random data (every float distinct: the bytes a baked-in constant
# would leave), declared N = digits' and validation size VAL, holding N + delta and VAL + delta
# rows. A user's jit compiles before jaxdp and another, closing over the training inputs, after.
_SEARCH = textwrap.dedent("""
    import dataclasses, json, os, sys
    import jax, jax.numpy as jnp, numpy as np
    jax.jit(lambda a: a + 1)(np.ones(3))
    from jaxdp import accounting as acc
    from jaxdp.data import DataSplit, load_dataset
    from jaxdp.train import NoisyMean, TrainConfig, compilation_cache, presets, train_candidate
    from jaxdp.tuning import random_search
    digits, out, VAL = load_dataset("digits"), sys.argv[1], 300
    def entries():
      where = compilation_cache.cache_dir()
      return set(os.listdir(where)) if os.path.isdir(where) else set()
    def noise(rows, seed):
      rng = np.random.default_rng(seed)
      return DataSplit(rng.standard_normal((rows, 8, 8, 1)).astype(np.float32),
                       rng.integers(0, 10, rows).astype(np.int32))
    accuracy = lambda logits, b: (jnp.argmax(logits, -1) == b.labels).astype(jnp.float32)
    task = dataclasses.replace(presets.classifier(10), name="noisy",
                               score=NoisyMean(accuracy, 0.0, 1.0, 2.0, num_examples=VAL))
    config = TrainConfig(task=task, l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=0.05,
                         steps=5, hparams=dict(learning_rate=1.0, model="logreg"))
    report = []
    for seed, delta in json.loads(sys.argv[2]):
      data = dataclasses.replace(digits, train=noise(digits.num_examples + delta, seed),
                                 test=noise(100, seed + 100), private_validation=noise(VAL + delta, seed + 200))
      np.savez(os.path.join(out, f"data{seed}.npz"), train=data.train.inputs,
               validation=data.private_validation.inputs, test=data.test.inputs)
      before = entries()
      lone = train_candidate(config, data, jax.random.key(seed))
      random_search(config, {"learning_rate": [0.5, 2.0]}, data, distribution=acc.Fixed(2),
                    key=jax.random.key(seed + 1))
      report.append(dict(delta=delta, lone_compile_s=lone.compile_time_s, new=len(entries() - before)))
    before, x = entries(), jnp.asarray(data.train.inputs.reshape(-1, 64))
    jax.jit(lambda w: jnp.tanh(x @ w)).lower(np.ones(64, np.float32)).compile()
    print(json.dumps({"dir": compilation_cache.cache_dir(), "runs": report,
                      "user_jit_new": len(entries() - before), "N": digits.num_examples, "VAL": VAL}))
""")

# Programs compiled as jaxdp's own (so written) that do close over data: a float array, one
# subtracted (XLA folds x - c into x + (-c)) and int tokens read by a take. The scan below must
# find each (else it could not find a baked-in data array either; adversarial review F3).
_BAKED = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    from jaxdp.train import compilation_cache
    rng = np.random.default_rng(7)
    x = rng.standard_normal((64, 16)).astype(np.float32)
    mu = rng.standard_normal(16).astype(np.float32)
    tokens = rng.integers(1000, 2**30, 64).astype(np.int32)
    np.savez(sys.argv[1], x=x, mu=mu, tokens=tokens)
    with compilation_cache.writing():
      jax.jit(lambda w: jnp.tanh(jnp.asarray(x) @ w)).lower(np.ones(16, np.float32)).compile()
      jax.jit(lambda v: v - jnp.asarray(mu)).lower(np.ones(16, np.float32)).compile()
      jax.jit(lambda t: jnp.take(t, jnp.asarray(tokens) % 4099)).lower(np.ones(4099, np.float32)).compile()
      jax.jit(lambda t: t + jnp.asarray(tokens)).lower(np.ones(64, np.int32)).compile()
""")

def _env(tmp_path, **extra):
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE", "JAXDP_COMPILATION"))}
  env.pop("XLA_FLAGS", None)
  # XDG_CACHE_HOME too: the default directory must never be the user's own home cache.
  env.update(PYTHONPATH=ROOT, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             XDG_CACHE_HOME=str(tmp_path / "xdg"))
  env.update(extra)
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




def _programs(directory) -> dict:
  """Entry name -> (float32 bit patterns of its constants, its int constants, its entry
  parameters' shapes): each entry deserialised and printed as HLO with every constant."""
  from jax._src import compilation_cache as jax_cc  # pylint: disable=g-import-not-at-top
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  from jaxlib import _hlo  # pylint: disable=g-import-not-at-top
  backend = xla_bridge.get_backend("cpu")
  options = _hlo.HloPrintOptions()
  options.print_large_constants = True
  number = re.compile(r"-?(?:\d+\.?\d*(?:e[-+]?\d+)?|inf|nan)")
  out = {}
  for name, blob in _entries(directory):
    executable, _ = jax_cc.extract_executable_and_time(blob)
    loaded = backend.deserialize_executable(executable, backend.devices()[:1], None)
    floats, ints, shapes = set(), set(), []
    for module in loaded.hlo_modules():
      text = module.to_string(options)
      for line in text.splitlines():
        if "constant(" in line:
          for token in number.findall(line[line.index("constant("):]):
            value = float(token)
            floats.add(int(np.float32(value).view(np.uint32)))
            if np.isfinite(value) and value == int(value):
              ints.add(int(value))
      entry = re.search(r"ENTRY[^\n]*\n(.*?)\n}", text, re.S)
      for dims in re.findall(r"\[([0-9,]*)\]\S* parameter\(", entry.group(1) if entry else ""):
        shapes.append(tuple(int(d) for d in dims.split(",") if d))
    out[name] = (floats, ints, shapes)
  return out


def _found(programs: dict, values: np.ndarray) -> dict:
  """Entry -> how many distinct values of `values` (floats: either sign) are its constants."""
  values = np.asarray(values).ravel()
  if values.dtype.kind == "f":
    values = values.astype(np.float32)
    wanted = set(values.view(np.uint32).tolist()) | set((-values).view(np.uint32).tolist())
    return {name: len(wanted & floats) for name, (floats, _, _) in programs.items()}
  wanted = set(values.tolist()) - set(range(-2, 65))
  return {name: len(wanted & ints) for name, (_, ints, _) in programs.items()}


@pytest.mark.slow  # three fresh interpreters compiling searches: about two minutes on 2 cores
def test_neighbours_share_every_program_and_no_data_or_row_count_is_in_the_cache(tmp_path):
  env = _env(tmp_path)  # the default directory, under XDG_CACHE_HOME
  directory = str(tmp_path / "xdg" / "jaxdp" / "xla")
  first = json.loads(_python(_SEARCH, str(tmp_path), "[[0, 0]]", env=env).splitlines()[-1])
  assert first["dir"] == directory and oct(os.stat(directory).st_mode & 0o777) == oct(0o700)
  assert first["runs"][0]["new"] > 0 and first["runs"][0]["lone_compile_s"] > 0.3
  entries = set(os.listdir(directory))
  # Another process, other data: N rows, then the neighbours N + 1 and N - 1 (one declared N):
  # every program is read back, none compiled, nothing written; nor is a user's jit.
  second = json.loads(_python(_SEARCH, str(tmp_path), "[[1, 0], [2, 1], [3, -1]]",
                              env=env).splitlines()[-1])
  assert [run["new"] for run in second["runs"]] == [0, 0, 0]
  assert all(run["lone_compile_s"] < first["runs"][0]["lone_compile_s"] / 3 for run in second["runs"])
  assert second["user_jit_new"] == 0 and set(os.listdir(directory)) == entries
  programs = _programs(directory)
  n, val = second["N"], second["VAL"]
  private_counts = {n - 1, n, n + 1, val - 1, val, val + 1}
  for name, (_, _, shapes) in programs.items():
    assert not private_counts & {d for shape in shapes for d in shape}, (name, shapes)
  assert any(row_capacity_for(n) in shape for _, _, shapes in programs.values() for shape in shapes)
  for seed in range(4):
    with np.load(tmp_path / f"data{seed}.npz") as saved:
      for split in saved.files:
        hits = {k: v for k, v in _found(programs, saved[split]).items() if v >= 4}
        assert not hits, f"{split} of run {seed} found in {hits}"
  # The scan does find arrays that programs close over, whatever their sign or type.
  _python(_BAKED, str(tmp_path / "baked.npz"), env=env)
  programs = _programs(directory)
  with np.load(tmp_path / "baked.npz") as baked:
    for array in baked.files:
      assert max(_found(programs, baked[array]).values()) >= 16, array


def _resolved(tmp_path, **extra) -> list:
  # enable() twice: the second call must keep the first's directory (it once took a directory
  # given to JAX for its own and moved to the default).
  script = ("import jax; from jaxdp.train import compilation_cache as c; "
            "first = c.enable(); assert c.enable() == first, c.enable(); "
            "print(first); print(jax.config.jax_compilation_cache_dir)")
  xdg = tmp_path / ("xdg-" + "-".join(sorted(extra)))  # a fresh XDG_CACHE_HOME per case
  resolved = _python(script, env=_env(tmp_path, **extra, XDG_CACHE_HOME=str(xdg))).split()
  if "JAX_COMPILATION_CACHE_DIR" in extra or "JAXDP_COMPILATION_CACHE" in extra:
    assert not os.path.exists(xdg)  # the default directory never made
  return resolved


def test_on_by_default_where_it_lives_and_off_with_one_setting(tmp_path):
  default = str(tmp_path / "xdg-" / "jaxdp" / "xla")
  assert _resolved(tmp_path) == [default, default]
  assert oct(os.stat(default).st_mode & 0o777) == oct(0o700)
  for off in ("0", "false", "OFF"):
    assert _resolved(tmp_path, JAXDP_COMPILATION_CACHE=off) == ["None", "None"]
  mine = str(tmp_path / "mine")
  assert _resolved(tmp_path, JAXDP_COMPILATION_CACHE_DIR=mine) == [mine, mine]
  assert oct(os.stat(mine).st_mode & 0o777) == oct(0o700)
  # A directory the user gave JAX (as this test suite and .ci/run do) comes first and is used as
  # it is; JAX's own switch turns it off.
  theirs = str(tmp_path / "theirs")
  assert _resolved(tmp_path, JAX_COMPILATION_CACHE_DIR=theirs, JAXDP_COMPILATION_CACHE_DIR=mine) == [
      theirs, theirs]
  assert not os.path.exists(theirs)  # left to JAX, which creates it at its first compilation
  assert _resolved(tmp_path, JAX_ENABLE_COMPILATION_CACHE="false",
                   JAXDP_COMPILATION_CACHE_DIR=mine)[0] == "None"
  # Given to JAX after jaxdp turned its own on: JAX's settings decide again (its threshold back).
  script = ("import sys, jax; from jaxdp.train import compilation_cache as c; c.enable(); "
            "during = jax.config.jax_persistent_cache_min_compile_time_secs; "
            "jax.config.update('jax_compilation_cache_dir', sys.argv[1]); "
            "print(during, c.enable(), jax.config.jax_persistent_cache_min_compile_time_secs)")
  assert _python(script, theirs, env=_env(tmp_path)).split() == ["inf", theirs, "0.0"]


def _noisy_task(val: int):
  def accuracy(logits, batch):
    return (jax.numpy.argmax(logits, -1) == batch.labels).astype(np.float32)
  return dataclasses.replace(presets.classifier(10), name="noisy",
                             score=NoisyMean(accuracy, 0.0, 1.0, 2.0, num_examples=val))


def _data(rows: int, val_rows: int, *, declared: int = 200, val: int = 60) -> Dataset:
  rng = np.random.default_rng(rows)
  def split(n):
    return DataSplit(rng.standard_normal((n, 6)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32))
  return Dataset(train=split(rows), test=split(40), private_validation=split(val_rows),
                 num_examples=declared, name="toy")


def _segment_args(data: Dataset, config, splits) -> tuple:
  (run,) = plan_runs([config], data)
  key = jax.random.key(3)
  return run, (run.dp_plan, traced_hparams(run.spec, config), key, *splits, run.initial,
               program.empty_state(run.spec, data.train, key_dtype=key.dtype), np.bool_(True),
               np.int32(run.spec.num_steps))


def _config(task):
  return TrainConfig(task=task, l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=0.1, steps=6,
                     hparams=dict(learning_rate=0.5, model="logreg"))


def test_neighbours_lower_to_one_program_sized_by_public_numbers_only():
  task = _noisy_task(60)
  texts = set()
  for delta in (-1, 0, 1):
    data = _data(200 + delta, 60 + delta)
    run, args = _segment_args(data, _config(task), padding.host_splits(data, task))
    texts.add(program.compiled(run.spec).segment.lower(*args).as_text())
  (text,) = texts  # one program for N - 1, N and N + 1 rows
  assert f"{row_capacity_for(200)}x6" in text and f"{row_capacity_for(60)}x6" in text
  for count in (199, 200, 201, 59, 60, 61):
    assert f"{count}x6" not in text and f"<{count}x" not in text


@pytest.mark.parametrize("rows", [200, 0])  # 0: a tuner's empty Poisson subset (padding only)
def test_padding_rows_never_change_a_bit(rows):
  task = _noisy_task(60)
  data = _data(max(rows, 1), 55)
  if rows == 0:
    data = data.with_train_rows(np.zeros(1, bool), num_examples=200, name="empty")
  run, _ = _segment_args(data, _config(task), padding.host_splits(data, task))
  segment = jax.jit(program.compiled(run.spec).segment)
  outputs = []
  for fill, int_fill in ((0, 0), (np.nan, 2**31 - 1), (np.inf, -7)):
    _, args = _segment_args(data, _config(task), padding.host_splits(data, task, fill, int_fill))
    outputs.append(jax.tree.leaves(jax.device_get(segment(*args))))
  for other in outputs[1:]:
    for a, b in zip(outputs[0], other):
      assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
  assert np.isfinite(outputs[0][-3])  # the NoisyMean score


def test_row_capacity_is_public_and_too_many_rows_fail_without_naming_them():
  assert [row_capacity_for(n) for n in (1, 200, 1437, 60000)] == [17, 216, 1536, 65536]
  for n in (1, 7, 100, 999, 12345, 10**6):
    assert row_capacity_for(n) >= n + max(16, -(-n // 16))
    assert row_capacity_for(n) <= 1.07 * (n + max(16, -(-n // 16))) + 1
  with pytest.raises(ValueError, match=r"row capacity 216 of num_examples=200") as err:
    _data(217, 60)
  assert "217" not in str(err.value)
  assert _data(216, 60).row_capacity == 216
  with pytest.raises(ValueError, match=r"row capacity 76 of its declared size NoisyMean.num_examples=60"):
    plan_runs([_config(_noisy_task(60))], _data(200, 77))
  # A Dataset given more rows after its checks is refused when planned, before anything runs.
  damaged = _data(200, 60)
  object.__setattr__(damaged, "train", DataSplit(np.zeros((217, 6), np.float32), np.zeros(217, np.int32)))
  with pytest.raises(ValueError, match=r"row capacity 216 of num_examples=200$"):
    plan_runs([_config(_noisy_task(60))], damaged)
  # A subset keeps its parent's capacity, whatever was drawn.
  sub = _data(200, 60).with_train_rows(np.arange(200) % 3 == 0, num_examples=70, name="x1")
  assert sub.row_capacity == 216


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
  # Private (0700) but another user's: their entries are executables this process would run.
  foreign = tmp_path / "foreign"
  foreign.mkdir(mode=0o700)
  script = ("import os, warnings; warnings.simplefilter('error'); os.getuid = lambda: "
            f"{os.stat(foreign).st_uid + 1}; from jaxdp.train import compilation_cache as c; c.enable()")
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                        env=_env(tmp_path, JAXDP_COMPILATION_CACHE_DIR=str(foreign)), check=False)
  assert proc.returncode != 0 and "belongs to another user" in proc.stderr


def test_a_search_program_is_persisted_only_when_its_layout_is_the_same_for_every_k():
  from jaxdp.sweep import engine  # pylint: disable=g-import-not-at-top

  def run(spec, data_parallel=None):
    return types.SimpleNamespace(spec=spec, config=types.SimpleNamespace(
        execution=types.SimpleNamespace(data_parallel=data_parallel)))
  one = types.SimpleNamespace(runs=[run("a"), run("a")])
  auto = types.SimpleNamespace(run=run("a"), data_parallel=1)
  given = types.SimpleNamespace(run=run("a", 2), data_parallel=2)
  assert engine._persistable(one, auto, largest=1, num_devices=1)
  assert engine._persistable(one, given, largest=1, num_devices=2)  # asked for: public
  # Which static hyperparameters were drawn (two programs); candidates per device chosen for K
  # (up to `largest`); a data-parallel degree chosen for K (several devices, none asked for).
  two = types.SimpleNamespace(runs=[run("a"), run("b")])
  assert not engine._persistable(two, auto, largest=1, num_devices=1)
  assert not engine._persistable(one, auto, largest=4, num_devices=1)
  assert not engine._persistable(one, given, largest=4, num_devices=2)
  assert not engine._persistable(one, auto, largest=1, num_devices=2)


@pytest.mark.parametrize("max_per, devices", [(None, 1), (4, 1), (None, 2), (1, 2)])
def test_whether_a_search_asks_to_persist_never_depends_on_k(digits, monkeypatch, max_per, devices):
  """Every K from 1 to 5 (a search of 4 candidates per device once filled a chunk of 4 and was
  written, and one of 2 devices was written from K = 2 on: adversarial review 44b, G1)."""
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  from jaxdp.tuning import LocalTrainer, RunConfig, random_search  # pylint: disable=g-import-not-at-top
  asked = []
  compile_cached = program.compile_cached
  monkeypatch.setattr(program, "compile_cached", lambda jitted, args, *, persist=True: (
      asked.append(persist), compile_cached(jitted, args, persist=False))[1])
  config = TrainConfig(task=presets.classifier(10), l2_clip_norm=1.0, noise_multiplier=1.0,
                       sampling_prob=0.05, steps=2, hparams=dict(learning_rate=1.0, model="logreg"))
  trainer = LocalTrainer(devices=jax.devices()[:devices], max_candidates_per_device=max_per)
  for k in range(1, 6):
    random_search(config, {"learning_rate": [0.5, 1.0]}, digits, distribution=acc.Fixed(k),
                  key=jax.random.key(k), run_config=RunConfig(trainer=trainer))
  assert len(set(asked)) == 1 and asked[0] == (max_per in (None, 1) and devices == 1), asked


# K = 0 (nothing trains) and K = 1 under default settings, on one device; and a TrainFunction
# whose train_fn trains with jaxdp (its programs told which static values were drawn: G2).
_DRAWS = textwrap.dedent("""
    import dataclasses, json, os, sys, warnings
    import jax
    from jaxdp import accounting as acc
    from jaxdp.data import load_dataset
    from jaxdp.train import TrainConfig, compilation_cache, presets, train_candidate
    from jaxdp.tuning import TrainFunction, random_search
    warnings.simplefilter("ignore")
    digits, case = load_dataset("digits"), sys.argv[1]
    base = TrainConfig(task=presets.classifier(10), l2_clip_norm=1.0, noise_multiplier=1.0,
                       sampling_prob=0.05, steps=3, hparams=dict(learning_rate=1.0, model="logreg"))
    if case == "function":
      config = lambda h: dataclasses.replace(base, hparams=dict(h))
      def train_fn(h, seed):
        return float(train_candidate(config(h), digits, jax.random.key(seed % 2**31)).score), None
      random_search(TrainFunction(train_fn, lambda h: config(h).dp_event()),
                    {"learning_rate": [0.5], "model": ["logreg", "mlp"]}, distribution=acc.Fixed(3),
                    key=jax.random.key(0))
    else:
      law = acc.Fixed(1) if case == "one" else acc.Poisson(mean=1e-9)
      result = random_search(base, {"learning_rate": [0.3, 1.0]}, digits, distribution=law,
                             key=jax.random.key(0))
      assert result.unreleased.num_candidates == (case == "one")
    where = compilation_cache.cache_dir()
    print(json.dumps(sorted(os.listdir(where)) if os.path.isdir(where) else []))
""")


def _drawn_entries(tmp_path, case) -> list:
  return json.loads(_python(_DRAWS, case, env=_env(tmp_path / case)).splitlines()[-1])


def test_a_search_that_draws_k_0_leaves_the_entry_one_of_k_1_leaves(tmp_path):
  one = _drawn_entries(tmp_path, "one")
  assert len(one) == 1
  # K = 0 compiles (without running) the program K >= 1 writes: the same entry, by name (no
  # directory path is in the compile options, so names agree across directories: G3).
  assert _drawn_entries(tmp_path, "zero") == one


def test_jaxdp_training_inside_a_train_fn_writes_nothing(tmp_path):
  """Its programs told which static values were drawn, hence K >= 2 (review 44b, G2)."""
  assert _drawn_entries(tmp_path, "function") == []


_OPTIONS = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    from jax._src import compiler
    from jaxdp.train import compilation_cache
    seen = []
    original = compiler.get_compile_options
    def spy(*args, **kwargs):
      options = original(*args, **kwargs)
      seen.append(str(options.executable_build_options.debug_options))
      return options
    compiler.get_compile_options = spy
    where = compilation_cache.enable()
    x = jnp.ones((301, 64), np.float32)
    jax.jit(lambda w: jnp.tanh(x @ w)).lower(np.ones(64, np.float32)).compile()
    for persist in (True, False):
      with compilation_cache.writing(persist):
        jax.jit(lambda w: jnp.sin(x @ w) + persist).lower(np.ones(64, np.float32)).compile()
    print(len(seen), sum(where in options for options in seen), jax.config.jax_persistent_cache_enable_xla_caches)
""")


def test_xla_caches_stay_out_of_jaxdps_directory(tmp_path):
  """JAX points XLA's GPU autotune cache (results keyed by each fusion's HLO, shapes included)
  into the cache directory for every program, whatever `writing` says: off in jaxdp's own
  (read on CPU from the compile options; G3). A directory given to JAX keeps JAX's setting."""
  compiled, named, setting = _python(_OPTIONS, env=_env(tmp_path)).split()
  assert int(compiled) >= 3 and (named, setting) == ("0", "none")
  theirs = str(tmp_path / "theirs")
  compiled, named, setting = _python(_OPTIONS, env=_env(tmp_path, JAX_COMPILATION_CACHE_DIR=theirs)).split()
  assert int(compiled) >= 3 and named == compiled and setting != "none"


