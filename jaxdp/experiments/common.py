"""Shared plumbing for the experiment scripts: start-up, outputs, manifests."""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Optional


def expose_host_devices() -> None:
  """Expose every CPU core as a JAX device.

  XLA reads the flag when JAX initialises its backend (the first
  `jax.devices()` or computation), not when `jax` is imported, so call this
  first thing in a script's `main()` or a notebook; afterwards it has no
  effect. On CPUs the sweep engine gets its parallelism from devices; on
  accelerators the flag only affects the (unused) host platform. A device
  count already in `XLA_FLAGS` is kept.
  """
  if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
    return
  from jaxdp.sweep.engine import host_device_flag  # pylint: disable=g-import-not-at-top
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + host_device_flag()).strip()


def use_headless_matplotlib() -> None:
  """The scripts only write files: select the Agg backend (from `main()`, so
  that importing a figure module in a notebook leaves its backend alone)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")


class UsageError(ValueError):
  """A bad command-line value; the scripts print it and exit with code 2."""


#: Overrides where the figures' profiles are read from: a directory holding `<figure>.py` files.
EXPERIMENTS_ENV = "JAXDP_EXPERIMENTS"


def experiments_dir() -> Optional[str]:
  """The directory of the figures' profiles and launch scripts, None if there is none.

  `$JAXDP_EXPERIMENTS` when set, else the top-level experiments/ of the clone
  this jaxdp was imported from (an editable install, or a clone on PYTHONPATH
  or as the working directory). The wheel does not ship that directory, so an
  installed jaxdp has none; the pyproject.toml beside it tells a clone from an
  unrelated `experiments` package next to a jaxdp in site-packages.
  """
  env = os.environ.get(EXPERIMENTS_ENV)
  if env:
    return env
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  if os.path.isfile(os.path.join(root, "pyproject.toml")) and os.path.isdir(os.path.join(root, "experiments")):
    return os.path.join(root, "experiments")
  return None


def figure_script(figure: str):
  """The module experiments/<figure>.py, where the figure's profiles are defined.

  Loaded by path (once per file), so it needs no `experiments` package on
  sys.path. Raises UsageError where there is no such file (an installed wheel
  without `$JAXDP_EXPERIMENTS`).
  """
  where = experiments_dir()
  path = None if where is None else os.path.join(where, f"{figure}.py")
  if path is None or not os.path.isfile(path):
    raise UsageError(
        f"the profiles of {figure!r} are defined in experiments/{figure}.py of the jaxdp repository, "
        + ("which this installed jaxdp does not include" if path is None else f"and {path} does not exist")
        + f": run from a clone (`pip install -e .` there) or set {EXPERIMENTS_ENV} to a clone's experiments/")
  return _load_script(os.path.realpath(path), figure)


@functools.lru_cache(maxsize=None)
def _load_script(path: str, figure: str):
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location(f"experiments.{figure}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def figure_profiles(figure: str) -> dict:
  """`PROFILES` of experiments/<figure>.py: profile name -> the pipeline's Profile."""
  return figure_script(figure).PROFILES


def profile_parser(prog: str, doc: str, profiles: dict, figure: str):
  """The options every figure pipeline shares: --profile, --out, --dry-run."""
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--profile", default="quick", choices=sorted(profiles),
                      help=f"one of the profiles defined (and described) in experiments/{figure}.py "
                           "(default: quick)")
  parser.add_argument("--out", default="figures", help="output directory (default: figures)")
  parser.add_argument("--dry-run", action="store_true",
                      help="build the profile's configuration and run one DP step, then stop")
  return parser


def check_writable_dir(path: str, what: str = "--out") -> str:
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as err:
    raise UsageError(f"{what} {path!r} cannot be created: {err.strerror}") from None
  if not os.path.isdir(path) or not os.access(path, os.W_OK):
    raise UsageError(f"{what} {path!r} is not a writable directory")
  return path


@contextlib.contextmanager
def staged_outputs(out_dir: str):
  """Files are written into a staging directory and moved into `out_dir` only
  when the block succeeds, so a failed run never leaves a partial figure that
  looks complete."""
  stage = tempfile.mkdtemp(prefix=".staging-", dir=out_dir)
  try:
    yield stage
    for name in sorted(os.listdir(stage)):
      os.replace(os.path.join(stage, name), os.path.join(out_dir, name))
  finally:
    shutil.rmtree(stage, ignore_errors=True)


def package_versions() -> dict:
  out = {"python": sys.version.split()[0]}
  for name in ("jaxdp", "jax", "jaxlib", "flax", "optax", "dp-accounting", "numpy", "scipy", "matplotlib"):
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  return out


def device_list() -> list:
  import jax  # pylint: disable=g-import-not-at-top
  return [f"{d.platform}:{d.id} {getattr(d, 'device_kind', '')}".strip() for d in jax.devices()]


class Stopwatch:
  """Wall time per named stage, for the manifest."""

  def __init__(self):
    self.stages = {}

  @contextlib.contextmanager
  def stage(self, name: str):
    t0 = time.perf_counter()
    print(f"[{name}] ...", flush=True)
    yield
    self.stages[name] = round(time.perf_counter() - t0, 2)
    print(f"[{name}] done in {self.stages[name]:.1f} s", flush=True)


def write_json(path: str, obj) -> None:
  with open(path, "w") as f:
    json.dump(obj, f, indent=2, default=str)
    f.write("\n")


#: Every data set of the figure pipelines (MNIST, FashionMNIST, the digits) has 10 classes.
NUM_CLASSES = 10


@functools.lru_cache(maxsize=None)
def classifier_task(num_classes: int = NUM_CLASSES, conv_impl: str = "im2col"):
  """The papers' classifier preset (`jaxdp.train.presets.classifier`), one object per arguments.

  Tasks compare by identity and key the compiled programs, so every config of
  a pipeline shares this one object (a new task per search space would
  recompile the same program). Its name records the preset's arguments, so
  manifests and pool fingerprints say which task ran.
  """
  from jaxdp.train import presets  # pylint: disable=g-import-not-at-top
  return presets.classifier(num_classes, conv_impl=conv_impl,
                            name=f"classifier(num_classes={num_classes}, conv_impl={conv_impl})")


def run_one_dp_step(config, dataset: str) -> None:
  """Dry run: one DP step of `config` on `dataset`, or on the offline MNIST
  digits with the same model and hyperparameters when TFDS cannot download."""
  import jax  # pylint: disable=g-import-not-at-top
  from jaxdp.data import DatasetUnavailableError, load_dataset  # pylint: disable=g-import-not-at-top
  from jaxdp.train import train_candidate  # pylint: disable=g-import-not-at-top
  try:
    data = load_dataset(dataset)
  except DatasetUnavailableError as err:
    print(f"  {err}\n  -> dry run continues on 'mnist_offline' with the same model and hyperparameters")
    data = load_dataset("mnist_offline")
  one_step = config.replace(steps=1)  # clears epochs
  res = train_candidate(one_step, data, jax.random.key(0))
  print(f"  one DP step ran: steps={res.steps}, test score {res.test_score:.3f}, "
        f"{res.wall_time_s:.1f} s (compilation included)")
