"""Calibration benchmark: `target_epsilon` for the README-sized search; prints one JSON object.

  python -m benchmarks.calibration [--quick] [--repeats R] [--baseline-root DIR]

The search is the example of docs/guides/tune_your_own_model.md (breast-cancer MLP,
grid {"learning_rate": [3e-3, 1e-2, 3e-2], "width": [8, 32]}, batch 64, 10
epochs, N = 400 private training examples) with a DP score instead of the
public test split: `NoisyMean` accuracy (noise multiplier 5) on 100 private
validation examples (that guide, "Where the score comes from"), K ~ Poisson(3),
target_epsilon = 3 at delta = 1e-5. Each candidate's event is DP-SGD (q =
0.16, 63 steps) composed with the score's Gaussian, and the search's event is
the best of K of them, accounted by method "best".

Each measurement is a fresh interpreter (nothing cached from an earlier
one), timed from after its imports and after building the task and data:

calibrate_seconds: `jaxdp.tuning.planning.calibrate` alone (what
  `target_epsilon=` runs before anything trains): `sigma` is its answer.
dry_run_seconds: the whole `jaxdp.tuning.dry_run(..., target_epsilon=3.0)`
  (argument and task checks, the calibration, the re-accounting of the
  search's event, the report); `epsilon` is its re-accounted epsilon ("best"),
  which must be at most 3.

Every number is the median over `--repeats` fresh processes (default 5; 1
with `--quick`), run one after another. Timings on a shared machine are
noisy: `--baseline-root DIR` (a checkout of another commit, e.g. `git worktree
add /tmp/calib_orig HEAD`) runs the same measurements on that tree's `jaxdp`,
alternating with this one's, and reports `baseline` and the ratios
this / baseline measured under the same conditions. `--quick` (one repeat)
keeps the script from rotting: the tests run it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

TARGET_EPSILON, DELTA, K_MEAN, SCORE_NOISE = 3.0, 1e-5, 3.0, 5.0
GRID = {"learning_rate": [3e-3, 1e-2, 3e-2], "width": [8, 32]}
TRAIN_N, VALIDATION_N = 400, 100
PARTS = ("calibrate", "dry_run")


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="one repeat")
  parser.add_argument("--repeats", type=int, default=None, help="fresh processes per measurement (default 5)")
  parser.add_argument("--baseline-root", default=None,
                      help="a checkout whose jaxdp to measure the same way, alternating with this one")
  parser.add_argument("--part", default=None, choices=PARTS, help=argparse.SUPPRESS)  # internal: one child
  return parser


def _search():
  """(config, grid, data, K) of the README-sized search with a NoisyMean score."""
  # pylint: disable=g-import-not-at-top
  import flax.linen as nn
  import numpy as np
  import optax
  from sklearn.datasets import load_breast_cancer

  from jaxdp import accounting as acc
  from jaxdp.data import Dataset
  from jaxdp.train import NoisyMean, Task, TrainConfig

  class MLP(nn.Module):
    width: int

    @nn.compact
    def __call__(self, x):
      return nn.Dense(1)(nn.relu(nn.Dense(self.width)(x)))[:, 0]

  def loss(logit, batch):
    return optax.sigmoid_binary_cross_entropy(logit, batch["y"])

  x, y = load_breast_cancer(return_X_y=True)
  # 400 private training, 100 private validation, 69 public test examples; a fixed split.
  train, val, test = np.split(np.random.default_rng(0).permutation(len(y)), [TRAIN_N, TRAIN_N + VALIDATION_N])
  x = ((x - x[test].mean(0)) / x[test].std(0)).astype(np.float32)  # public statistics only
  split = lambda idx: {"x": x[idx], "y": y[idx].astype(np.float32)}
  data = Dataset(train=split(train), private_validation=split(val), test=split(test), num_examples=TRAIN_N)
  score = NoisyMean(lambda logit, batch: (logit > 0) == (batch["y"] > 0.5), low=0.0, high=1.0,
                    noise_multiplier=SCORE_NOISE, num_examples=VALIDATION_N)
  task = Task(model=lambda hp: MLP(width=hp["width"]), loss=loss, score=score,
              optimizer=lambda hp: optax.chain(optax.clip_by_global_norm(1.0),
                                               optax.adamw(hp["learning_rate"], weight_decay=hp["weight_decay"])))
  config = TrainConfig(task=task, l2_clip_norm=1.0, noise_multiplier=1.0, batch_size=64, epochs=10,
                       hparams={"learning_rate": 1e-2, "weight_decay": 1e-4, "width": 16})
  return config, GRID, data, acc.Poisson(mean=K_MEAN)


def _child(part: str) -> dict:
  """One measurement, in this (fresh) process."""
  # pylint: disable=g-import-not-at-top
  import jaxdp
  from jaxdp import accounting as acc
  from jaxdp.tuning import dry_run, planning

  config, grid, data, distribution = _search()
  outer = lambda candidate: acc.RepeatAndSelect(candidate, distribution)
  if part == "calibrate":
    t0 = time.perf_counter()
    sigma = planning.calibrate(config, grid, data, outer, target_epsilon=TARGET_EPSILON, delta=DELTA)
    seconds = time.perf_counter() - t0
    # Every grid point has the same event (the grid varies neither q, steps nor the score).
    event = outer(config.replace(noise_multiplier=sigma).dp_event(data.num_examples))
    out = {"sigma": sigma, "epsilon": acc.epsilon(event, DELTA, "best")}
  else:
    t0 = time.perf_counter()
    plan = dry_run(config, grid, data, distribution=distribution, target_epsilon=TARGET_EPSILON,
                   target_delta=DELTA)
    seconds = time.perf_counter() - t0
    out = {"sigma": plan.noise_multiplier, "epsilon": plan.epsilon}
  return {"seconds": seconds, **out, "jaxdp": os.path.dirname(os.path.abspath(jaxdp.__file__))}


def _fresh(part: str, root: str) -> dict:
  """`_child(part)` in a fresh interpreter importing the jaxdp under `root`."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
  proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--part", part], capture_output=True,
                        text=True, check=False, env=env, cwd=root)
  if proc.returncode != 0:
    raise RuntimeError(f"{part} subprocess ({root}) failed ({proc.returncode}):\n{proc.stderr}")
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  if os.path.realpath(out["jaxdp"]) != os.path.realpath(os.path.join(root, "jaxdp")):
    raise RuntimeError(f"the {part} subprocess imported {out['jaxdp']}, not {root}/jaxdp")
  return out


def _summary(runs: dict) -> dict:
  """Medians over the repeats, the answers (the same in every repeat) and every timing."""
  out = {}
  for part, results in runs.items():
    out[f"{part}_seconds"] = round(statistics.median(r["seconds"] for r in results), 4)
    out[f"{part}_runs"] = [round(r["seconds"], 4) for r in results]
  out["sigma"] = runs["calibrate"][0]["sigma"]
  out["epsilon"] = runs["dry_run"][0]["epsilon"]
  out["calibrate_epsilon"] = runs["calibrate"][0]["epsilon"]
  out["same_answers"] = all(r["sigma"] == out["sigma"] for results in runs.values() for r in results)
  return out


def main(argv=None) -> int:
  args = _parser().parse_args(argv)
  if args.part is not None:
    print(json.dumps(_child(args.part)))
    return 0
  repeats = args.repeats or (1 if args.quick else 5)
  import jaxdp  # pylint: disable=g-import-not-at-top
  # The children import the same jaxdp as this process (a checkout may shadow an installed copy).
  root = os.path.dirname(os.path.dirname(os.path.abspath(jaxdp.__file__)))
  trees = {"this": root}
  if args.baseline_root:
    trees["baseline"] = os.path.abspath(args.baseline_root)
  runs = {tree: {part: [] for part in PARTS} for tree in trees}
  for _ in range(repeats):  # alternating, so both trees see the same load
    for part in PARTS:
      for tree, path in trees.items():
        runs[tree][part].append(_fresh(part, path))
  result = _summary(runs["this"])
  if "baseline" in runs:
    base = _summary(runs["baseline"])
    result["baseline"] = base
    result["baseline_root"] = trees["baseline"]
    for part in PARTS:
      result[f"{part}_ratio"] = round(result[f"{part}_seconds"] / base[f"{part}_seconds"], 3)
    result["sigma_relative_change"] = result["sigma"] / base["sigma"] - 1.0
  result.update({
      "search": (f"README MLP, grid {GRID}, batch 64, 10 epochs, N={TRAIN_N}; NoisyMean(noise_multiplier="
                 f"{SCORE_NOISE:g}, num_examples={VALIDATION_N}) on private validation; K~Poisson(mean="
                 f"{K_MEAN:g}); target_epsilon={TARGET_EPSILON:g}, delta={DELTA:g}, method=best"),
      "repeats": repeats,
      "quick": bool(args.quick),
      "python": platform.python_version(),
      "machine": platform.machine(),
      "cpu_count": os.cpu_count(),
  })
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  sys.exit(main())
