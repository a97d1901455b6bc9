"""Test-session set-up shared by all tests, and the suite's rule for numbers.

**Exact only within one process.** Machines of the same kind differ in their
processors (AVX-512 or AVX2, Intel or AMD), so numpy's SIMD dispatch (exp,
log, ...), OpenBLAS's kernels and XLA's generated code round differently. A
test may compare two computations exactly (or to a few ulps) only when both
run in the same process: cold vs warm cache, vectorised vs reference path,
batched vs lone candidate, a rerun with the same key. A number recorded from
another run (a literal in a test, a quoted README number, anything computed
on another machine) is compared with a tolerance derived from its numerics and
stated next to it, e.g.:

  * RDP epsilons (float64 closed forms): relative 1e-10;
  * PLD epsilons by FFT, and profiles or "best" built on PLDs: relative 1e-6
    (5e-9 measured between an AVX-512 and an AVX2 machine);
  * the root of a search over such epsilons (a calibrated sigma, a largest
    E[K]): the search's own tolerance, or 1e-5 relative when it is tighter;
  * float32 JAX training: thresholds, or a few test examples of a score;
  * references printed to d decimals: one unit of the last digit.

Every recorded epsilon is also checked on the privacy side, which holds
exactly on any machine: delta(epsilon) <= the target, in this process.
`make test-cpu-paths` runs the suite with numpy, OpenBLAS and XLA held to
AVX2 code paths, as on a processor without AVX-512.
"""

import atexit
import os
import shutil
import tempfile

import pytest

# Two host CPU devices, so the sweep engine's sharded path runs on CPU too. XLA
# reads the flag when JAX initialises, which happens after this file is imported.
_FLAG = "--xla_force_host_platform_device_count=2"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

# One XLA compilation cache for this run, shared by the pytest-xdist workers
# and the notebooks, README snippet and benchmarks run in subprocesses (they
# inherit the environment): a program compiled by one of them is not compiled
# again by another. Entries are keyed by the program, the compile options, the
# backend and the JAX version, so a hit is the executable a compilation would
# give on this machine. The directory is made per run and removed at its end
# (by the process that made it), so nothing is shared between runs or machines.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _CACHE_DIR = tempfile.mkdtemp(prefix="jaxdp-tests-xla-cache-")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE_DIR
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
  atexit.register(shutil.rmtree, _CACHE_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
def digits():
  """scikit-learn's 8x8 digits (offline): 1,437 train / 360 test."""
  from jaxdp.data import load_dataset  # pylint: disable=g-import-not-at-top
  return load_dataset("digits")


@pytest.fixture(scope="session")
def base_config():
  """A DP logistic regression that trains in about a second."""
  from jaxdp.train import TrainConfig, presets  # pylint: disable=g-import-not-at-top
  return TrainConfig(task=presets.classifier(10), l2_clip_norm=1.0, noise_multiplier=1.0,
                     sampling_prob=0.05, steps=30, hparams=dict(learning_rate=1.0, model="logreg"))


@pytest.fixture(scope="session")
def two_devices():
  import jax  # pylint: disable=g-import-not-at-top
  devices = jax.devices()
  assert len(devices) >= 2, "tests/conftest.py should expose two host devices"
  return devices[:2]


# End-to-end runs shared by several test files: each is the smallest run that
# exercises its whole pipeline, computed once per session instead of once per
# test (a subset-tuning run compiles a training loop per distinct data size).

SEARCH_GRID = {"learning_rate": [0.3, 1.0, 3.0]}


@pytest.fixture(scope="session")
def tiny_random_search(digits, base_config, two_devices):
  """`random_search` over SEARCH_GRID, K ~ Poisson(4), key 5, and the warnings it raised."""
  import warnings  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  from jaxdp.tuning import LocalTrainer, RunConfig, random_search  # pylint: disable=g-import-not-at-top
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    result = random_search(base_config, SEARCH_GRID, digits, distribution=acc.Poisson(mean=4),
                           key=jax.random.key(5),
                           run_config=RunConfig(trainer=LocalTrainer(devices=two_devices)))
  return result, tuple(caught)


@pytest.fixture(scope="session")
def tiny_subsampled(digits, base_config, two_devices):
  """`subsampled_search` variant 1 over SEARCH_GRID, q=0.3, K ~ Poisson(3), key 3."""
  import jax  # pylint: disable=g-import-not-at-top
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  from jaxdp.tuning import (LocalTrainer, RunConfig, SubsetTuning,  # pylint: disable=g-import-not-at-top
                            subsampled_search)
  # One candidate per device: every K reuses one compilation.
  return subsampled_search(base_config, SEARCH_GRID, digits, distribution=acc.Poisson(mean=3),
                           subset=SubsetTuning(0.3, 1), key=jax.random.key(3),
                           run_config=RunConfig(trainer=LocalTrainer(
                               devices=two_devices, max_candidates_per_device=1)))


@pytest.fixture(scope="session")
def random_params():
  """`make(module, x, seed)`: random parameters of `module` for inputs like `x`, without compiling.

  Only the tree's shapes come from flax (`jax.eval_shape` traces `init` but
  compiles nothing); the values are NumPy normals scaled by 1/sqrt(fan-in),
  so tests that only need *some* parameters skip a costly `init` compile.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  def make(module, x, seed=0):
    shapes = jax.eval_shape(module.init, jax.random.key(0), x)
    rng = np.random.default_rng(seed)

    def leaf(s):
      fan_in = max(1, int(np.prod(s.shape[:-1]))) if len(s.shape) > 1 else 10
      return jax.numpy.asarray(rng.normal(size=s.shape) / np.sqrt(fan_in), s.dtype)
    return jax.tree.map(leaf, shapes)
  return make


@pytest.fixture
def one_download_try(monkeypatch):
  """TFDS tries a download 10 times with exponential backoff: 3.5 minutes before an offline
  machine gets `DatasetUnavailableError` (measured). jaxdp fails at once when the download host
  cannot be reached, but not behind a proxy (it does not check one). The paper-profile dry runs
  only need the outcome, so one try; a machine with network still downloads."""
  from tensorflow_datasets.core.download import downloader  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(downloader, "MAX_RETRIES", 1)


# --- Checked before any work: every tuner refuses a bad argument before it draws or trains. ---

class WorkStarted(AssertionError):
  """A tuner drew K or trained before it had checked all of its arguments."""


@pytest.fixture
def no_work(monkeypatch):
  """Makes drawing K (any distribution) or any training raise `WorkStarted`.

  With it, a ValueError from a tuner proves the argument was rejected before
  K was drawn and before any training, whatever K would have been. Training
  is blocked at every entry point (a training function's call, the batched engine, the lone trainer the
  subsampled search's final run uses, and the compiled programs behind both),
  and so is drawing the subsampled search's subset. Shape checks
  (`jax.eval_shape`) and accounting stay allowed: they are the checks.
  """
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  from jaxdp.sweep import engine, functions  # pylint: disable=g-import-not-at-top
  from jaxdp.train import trainer  # pylint: disable=g-import-not-at-top
  from jaxdp.tuning import subsampled  # pylint: disable=g-import-not-at-top

  def started(what):
    def fail(*args, **kwargs):
      raise WorkStarted(f"{what} before every argument was checked")
    return fail
  stack = [acc.KDistribution]
  while stack:  # every distribution class, however deep
    cls = stack.pop()
    stack.extend(cls.__subclasses__())
    if "sample" in vars(cls):
      monkeypatch.setattr(cls, "sample", started("K drawn"))
  monkeypatch.setattr(engine, "train_candidates", started("candidates trained"))
  monkeypatch.setattr(engine, "_compiled_chunk", started("a batched program compiled"))
  monkeypatch.setattr(subsampled, "run_planned", started("final model trained"))
  monkeypatch.setattr(trainer, "train_candidate", started("a candidate trained"))
  monkeypatch.setattr(trainer, "compiled", started("a candidate program compiled"))
  monkeypatch.setattr(subsampled, "poisson_mask", started("subset drawn"))
  monkeypatch.setattr(functions, "call", started("a training function called"))


# --- A user's own task (issue 12): every tuner must take it like a preset. ---
# Its own Flax module with a `width` read by the model factory (static), its
# own per-example loss and score over dict batches, an optax chain built from
# the hyperparameters (learning_rate and weight_decay are traced), and plain
# NumPy dict data. Session-scoped, so every test shares its compilations
# (the compiled programs are keyed by the task's identity).

USER_N = 200  # training examples


def user_mlp(width):
  import flax.linen as nn  # pylint: disable=g-import-not-at-top

  class MLP(nn.Module):
    width: int

    @nn.compact
    def __call__(self, x):
      hidden = nn.tanh(nn.Dense(self.width, name="hidden")(x))
      return nn.Dense(1, name="out")(hidden)

  return MLP(width=width)


def user_loss(outputs, batch):
  import optax  # pylint: disable=g-import-not-at-top
  return optax.sigmoid_binary_cross_entropy(outputs[:, 0], batch["y"])


def user_correct(outputs, batch):
  """Per example: 1.0 where the sign of the logit is the label."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  return ((outputs[:, 0] > 0) == (batch["y"] > 0.5)).astype(jnp.float32)


def user_accuracy(outputs, batch):
  return user_correct(outputs, batch).mean()


def user_optimizer(hp):
  import optax  # pylint: disable=g-import-not-at-top
  return optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(hp["learning_rate"], weight_decay=hp["weight_decay"]))


def make_user_task(**changes):
  """The user task; `changes` override Task fields (score, name, ...)."""
  from jaxdp.train import Task, keep_hparams  # pylint: disable=g-import-not-at-top
  fields = dict(model=lambda hp: user_mlp(hp["width"]), loss=user_loss, score=user_accuracy,
                optimizer=user_optimizer, extrapolate=keep_hparams, name="user-mlp")
  fields.update(changes)
  return Task(**fields)


def user_split(rng, n, w):
  import numpy as np  # pylint: disable=g-import-not-at-top
  x = rng.normal(size=(n, w.shape[0])).astype(np.float32)
  y = (x @ w + 0.3 * rng.normal(size=n) > 0).astype(np.float32)
  return {"x": x, "y": y}


@pytest.fixture(scope="session")
def user_data():
  """Synthetic linearly separable-ish dict data: 200 train, 100 public test, 100 private validation."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jaxdp.data import Dataset  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  w = rng.normal(size=6)
  return Dataset(train=user_split(rng, USER_N, w), test=user_split(rng, 100, w),
                 private_validation=user_split(rng, 100, w), num_examples=USER_N, name="synthetic")


@pytest.fixture(scope="session")
def user_task():
  return make_user_task()


@pytest.fixture(scope="session")
def user_config(user_task):
  """Expected batch 20 of N = 200 (q = 0.1), one epoch (10 steps), DP-AdamW."""
  from jaxdp.train import TrainConfig  # pylint: disable=g-import-not-at-top
  return TrainConfig(task=user_task, l2_clip_norm=1.0, noise_multiplier=1.0, batch_size=20, epochs=1,
                     hparams=dict(learning_rate=0.05, weight_decay=1e-4, width=8))
