"""Batched vs sequential candidate training, and the trial simulator's speed.

Prints one JSON object. Candidates/hour are measured in one process after a
warm-up run of each path (compilation excluded), for N small-CNN candidates
with the same steps: `batched` is the sweep engine's default (candidates
sharded over host devices, one per device on CPU), `vmap_one_device` packs all
N on one device, `sequential` calls `train_candidate` N times.

  python -m benchmarks.sweep_throughput [--candidates 8] [--steps 20] [--model opacus_cnn]
                                        [--batch 64] [--quick]

`compile_seconds_per_group` is each path's compilation of the group's
program (`CandidateResult.compile_time_s` of its warm-up run); `cores_busy`
is each path's process CPU time over its wall time (on a CPU: how many cores
it kept busy, so `speedup` can be at most about cpu_count / the sequential
path's value).

`--quick` (2 logistic-regression candidates, 2 steps, 5 simulated trials on
2 means) only checks that the script still runs; its numbers mean nothing.
"""

from __future__ import annotations

import os
import sys

if "jax" not in sys.modules:  # expose every core as a device before JAX starts
  _n = os.cpu_count() or 1
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + f" --xla_force_host_platform_device_count={_n}").strip()

import argparse  # pylint: disable=g-import-not-at-top,wrong-import-position
import json
import time

import jax
import numpy as np

from jaxdp import accounting as acc
from jaxdp.data import load_dataset
from jaxdp.sweep import SearchSpace, engine, grid_candidates, simulate
from jaxdp.sweep.simulate import PoolTable
from jaxdp.train import LoopSpec, TrainConfig, presets, train_candidate


def _timed(fn, cores: dict | None = None, name: str = ""):
  t0, c0 = time.perf_counter(), time.process_time()
  fn()
  wall = time.perf_counter() - t0
  if cores is not None:  # CPU seconds per wall second: how many cores the path kept busy
    cores[name] = round((time.process_time() - c0) / wall, 2)
  return wall


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--candidates", type=int, default=8)
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--model", default="opacus_cnn")
  parser.add_argument("--batch", type=float, default=64, help="expected batch size q*N")
  parser.add_argument("--trials", type=int, default=500, help="simulated searches per point")
  parser.add_argument("--means", type=int, default=20, help="number of E[K] values simulated")
  parser.add_argument("--quick", action="store_true",
                      help="smoke run: --candidates 2 --steps 2 --model logreg --trials 5 --means 2")
  args = parser.parse_args(argv)
  if args.quick:
    args.candidates, args.steps, args.model, args.trials, args.means = 2, 2, "logreg", 5, 2

  data = load_dataset("mnist_offline")
  base = TrainConfig(task=presets.classifier(data.num_classes), l2_clip_norm=1.0, noise_multiplier=1.1,
                     sampling_prob=args.batch / data.num_examples, steps=args.steps,
                     hparams=dict(learning_rate=0.5, model=args.model))
  lrs = list(np.geomspace(0.05, 2.0, args.candidates))
  cands = grid_candidates(SearchSpace(base, {"learning_rate": lrs}), seeds=[0])
  devices = jax.devices()

  runs, compile_s, cores = {}, {}, {}
  for name, kwargs in (("batched", dict(devices=devices)),
                       ("vmap_one_device", dict(devices=devices[:1],
                                                max_candidates_per_device=len(cands)))):
    warm = engine.train_candidates(cands, data, **kwargs)  # compiles the group's program
    compile_s[name] = round(max(r.compile_time_s for r in warm), 3)
    runs[name] = _timed(lambda kwargs=kwargs: engine.train_candidates(cands, data, **kwargs), cores, name)
  compile_s["sequential"] = round(train_candidate(cands[0].config, data, jax.random.key(0)).compile_time_s, 3)
  runs["sequential"] = _timed(lambda: [train_candidate(c.config, data, jax.random.key(c.seed)) for c in cands],
                              cores, "sequential")
  per_hour = {k: len(cands) / v * 3600 for k, v in runs.items()}

  # Trial simulator: `trials` trials x `means` means x 5 distributions on a 20 x 5 pool.
  rng = np.random.default_rng(0)
  vals = rng.uniform(size=(20, 5))
  table = PoolTable(tuple({"i": i} for i in range(20)), vals, vals, np.full(20, 5))
  means = np.geomspace(1.5, 100, args.means)
  families = [acc.Poisson, lambda m: acc.TruncatedNegativeBinomial(-0.5, mean=m),
              lambda m: acc.TruncatedNegativeBinomial(0.0, mean=m),
              lambda m: acc.TruncatedNegativeBinomial(0.5, mean=m), acc.Geometric]
  dists = [f(m) for f in families for m in means]
  sim_seconds = _timed(lambda: [simulate(table, d, args.trials, rng) for d in dists])

  print(json.dumps({
      "candidates": len(cands), "steps": args.steps, "model": args.model, "batch": args.batch,
      "microbatch_size": LoopSpec.from_config(base, data).microbatch_size,
      "devices": [str(d) for d in devices],
      "batched_candidates_per_hour": round(per_hour["batched"], 1),
      # Expected examples through DP steps per second (scoring time included).
      "batched_examples_per_s": round(per_hour["batched"] / 3600 * args.steps * args.batch, 1),
      "vmap_one_device_candidates_per_hour": round(per_hour["vmap_one_device"], 1),
      "sequential_candidates_per_hour": round(per_hour["sequential"], 1),
      "speedup": round(per_hour["batched"] / per_hour["sequential"], 3),
      "compile_seconds_per_group": compile_s,  # one group: all candidates share a program
      "cores_busy": cores,  # CPU time / wall time of each path (on CPU)
      "vmap_speedup": round(per_hour["vmap_one_device"] / per_hour["sequential"], 3),
      "simulator_trials": args.trials, "simulator_means": args.means,
      "simulator_seconds": round(sim_seconds, 3),  # trials x means x 5 distributions
      "quick": bool(args.quick),
  }))
  return 0


if __name__ == "__main__":
  sys.exit(main())
