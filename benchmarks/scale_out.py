"""Scale-out: one durable private search on the local engine, on Ray, and after a kill.

Prints one JSON object. Every path runs the same `random_search` (K fixed,
`run_dir` set, so every candidate is written to the durable pool as it
finishes) and must release the same hyperparameters:

  * `local`: the sweep engine in this process, one candidate per host device;
  * `ray_one_node`: a `RayTrainer` on a local Ray instance (one node,
    one CPU per core, every worker on one host device);
  * `ray_two_nodes`: the same on a two-node cluster on this machine
    (`ray.cluster_utils.Cluster`: two raylets, the cores split between them).

Each path runs twice, on fresh run directories: `cold` (the first search:
compilation, and for Ray the workers' start and JAX import) and `warm` (the
same search again: the local process has its program compiled, while each
Ray worker compiles once per search). Candidates per hour = K / wall seconds
of the search; `*_compile_seconds` lists each compilation the search did (the
chunks' `compile_time_s`).

`resume`: the local search in a fresh interpreter, SIGKILLed once the pool
holds about half of the candidates, then rerun: how many candidates the
rerun trained, its wall time against an uninterrupted fresh-interpreter run,
and the wall time of a third run that finds every candidate stored (the cost
of checking the fingerprint and reading the parameters back).

`one_candidate`: one candidate at a larger batch through the engine on one
host device, then on two (automatic data parallelism), compilation excluded.

  python -m benchmarks.scale_out [--candidates 8] [--steps 200] [--model opacus_cnn]
                                 [--batch 64] [--chunk-size 2] [--quick]

`--quick` (2 logistic-regression candidates, 2 steps) only checks that the
script still runs; its numbers mean nothing.
"""

from __future__ import annotations

import os
import sys

if "jax" not in sys.modules:  # expose every core as a device before JAX starts
  _n = os.cpu_count() or 1
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + f" --xla_force_host_platform_device_count={_n}").strip()

import argparse  # pylint: disable=g-import-not-at-top,wrong-import-position
import dataclasses
import json
import signal
import subprocess
import tempfile
import time

import jax
import numpy as np

from jaxdp import accounting as acc
from jaxdp.data import load_dataset
from jaxdp.sweep import Candidate, LocalTrainer, RayTrainer, engine
from jaxdp.train import TrainConfig, presets
from jaxdp.tuning import RunConfig, random_search

KILL_TIMEOUT_S = 600
# Ray workers train on one host device each (the node's CPUs are the parallelism).
WORKER_ENV = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1"}


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--candidates", type=int, default=8, help="K (fixed) of the search")
  parser.add_argument("--steps", type=int, default=200, help="DP steps per candidate")
  parser.add_argument("--model", default="opacus_cnn")
  parser.add_argument("--batch", type=float, default=64, help="expected batch size q*N")
  parser.add_argument("--one-candidate-batch", type=float, default=256,
                      help="expected batch of the 1-vs-2-devices candidate")
  parser.add_argument("--chunk-size", type=int, default=2, help="candidates per Ray task")
  parser.add_argument("--quick", action="store_true",
                      help="smoke run: --candidates 2 --steps 2 --model logreg --chunk-size 1")
  parser.add_argument("--search-only", metavar="RUN_DIR", default=None,
                      help=argparse.SUPPRESS)  # the resume measurement's child process
  return parser


def _args(argv):
  args = _parser().parse_args(argv)
  if args.quick:
    args.candidates, args.steps, args.model, args.chunk_size = 2, 2, "logreg", 1
    args.one_candidate_batch = 64
  return args


def _config(args, data, batch: float) -> TrainConfig:
  return TrainConfig(task=presets.classifier(data.num_classes), l2_clip_norm=1.0, noise_multiplier=1.1,
                     sampling_prob=batch / data.num_examples, steps=args.steps,
                     hparams=dict(learning_rate=0.5, model=args.model))


def _search(args, data, config: TrainConfig, run_dir: str, trainer):
  """The benchmark's search: K fixed, durable in `run_dir`; (result, wall seconds)."""
  grid = {"learning_rate": list(np.geomspace(0.05, 2.0, max(args.candidates, 2)))}
  start = time.perf_counter()
  result = random_search(config, grid, data,
                         distribution=acc.Fixed(args.candidates), key=jax.random.key(0),
                         run_config=RunConfig(run_dir=run_dir, trainer=trainer))
  return result, time.perf_counter() - start


def _cold_and_warm(args, data, config: TrainConfig, root: str, name: str, trainer) -> dict:
  out, released = {}, []
  for run in ("cold", "warm"):
    compiled = []  # each compilation of the search's program (one per process that trained)

    def on_chunk(chunk, compiled=compiled):
      compiled.extend(round(r.compile_time_s, 3) for _, r in chunk if r.compile_time_s > 0)
    # The trainer calls on_chunk (on the driver, for Ray) as each chunk ends.
    result, seconds = _search(args, data, config, os.path.join(root, f"{name}-{run}"),
                              dataclasses.replace(trainer, on_chunk=on_chunk))
    released.append(result.hyperparameters)
    out[f"{run}_seconds"] = round(seconds, 3)
    out[f"{run}_candidates_per_hour"] = round(args.candidates / seconds * 3600, 1)
    out[f"{run}_compile_seconds"] = compiled
  out["released"] = released[0]
  return out


def _ray_paths(args, data, config: TrainConfig, root: str) -> dict:
  import ray  # pylint: disable=g-import-not-at-top
  from ray.cluster_utils import Cluster  # pylint: disable=g-import-not-at-top

  cpus = os.cpu_count() or 1
  trainer = RayTrainer(chunk_size=args.chunk_size)
  init = dict(include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": WORKER_ENV})
  out = {}
  ray.init(num_cpus=cpus, **init)
  try:
    out["ray_one_node"] = _cold_and_warm(args, data, config, root, "ray1", trainer)
    out["ray_one_node"]["nodes"] = len([n for n in ray.nodes() if n["Alive"]])
  finally:
    ray.shutdown()
  cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=max(1, cpus // 2)))
  try:
    cluster.add_node(num_cpus=max(1, cpus - cpus // 2))
    ray.init(address=cluster.address, **init)
    out["ray_two_nodes"] = _cold_and_warm(args, data, config, root, "ray2", trainer)
    out["ray_two_nodes"]["nodes"] = len([n for n in ray.nodes() if n["Alive"]])
  finally:
    ray.shutdown()
    cluster.shutdown()
  return out


def _child(argv: list, run_dir: str) -> subprocess.Popen:
  cmd = [sys.executable, "-m", "benchmarks.scale_out", *argv, "--search-only", run_dir]
  return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _finish(proc: subprocess.Popen, started: float) -> dict:
  out, err = proc.communicate(timeout=KILL_TIMEOUT_S)
  if proc.returncode != 0:
    raise RuntimeError(f"the search process failed:\n{err[-3000:]}")
  return dict(json.loads(out.strip().splitlines()[-1]), process_seconds=round(time.perf_counter() - started, 3))


def _stored(run_dir: str) -> int:
  try:
    with open(os.path.join(run_dir, "results.jsonl"), "rb") as f:
      return sum(1 for line in f if line.endswith(b"}\n"))
  except FileNotFoundError:
    return 0


def _resume(argv: list, args, root: str) -> dict:
  """Uninterrupted vs killed-and-rerun, each in a fresh interpreter (JAX start and compile included)."""
  started = time.perf_counter()
  whole = _finish(_child(argv, os.path.join(root, "whole")), started)
  run_dir = os.path.join(root, "killed")
  proc, started = _child(argv, run_dir), time.perf_counter()
  target = max(1, args.candidates // 2)
  while _stored(run_dir) < target and proc.poll() is None:
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.communicate()
  killed_after = round(time.perf_counter() - started, 3)
  stored = _stored(run_dir)
  started = time.perf_counter()
  rerun = _finish(_child(argv, run_dir), started)
  started = time.perf_counter()
  noop = _finish(_child(argv, run_dir), started)
  return {"uninterrupted_process_seconds": whole["process_seconds"],
          "killed_after_seconds": killed_after, "stored_at_kill": stored,
          "rerun_trained": rerun["trained"], "rerun_process_seconds": rerun["process_seconds"],
          "rerun_search_seconds": rerun["search_seconds"],
          "all_stored_rerun_trained": noop["trained"],
          "all_stored_rerun_search_seconds": noop["search_seconds"],
          "all_stored_rerun_process_seconds": noop["process_seconds"],
          "same_release": whole["released"] == rerun["released"] == noop["released"]
                          and whole["params_sha256"] == rerun["params_sha256"] == noop["params_sha256"]}


def _search_only(args, data) -> int:
  """The resume measurement's child: one local durable search; prints what it trained."""
  import hashlib  # pylint: disable=g-import-not-at-top
  trained = []
  result, seconds = _search(args, data, _config(args, data, args.batch), args.search_only,
                            LocalTrainer(on_chunk=trained.extend))
  leaves = b"".join(np.asarray(x).tobytes() for x in jax.tree.leaves(result.params))
  print(json.dumps({"trained": len(trained), "search_seconds": round(seconds, 3),
                    "released": result.hyperparameters,
                    "params_sha256": hashlib.sha256(leaves).hexdigest()}))
  return 0


def _one_candidate(args, data) -> dict:
  """One candidate on 1 and on 2 host devices (automatic data parallelism), compile excluded."""
  cand = Candidate({"learning_rate": 0.5}, _config(args, data, args.one_candidate_batch), 0)
  devices = jax.devices()
  out = {"batch": args.one_candidate_batch}
  for n in sorted({1, min(2, len(devices))}):
    engine.train_candidates([cand], data, devices=devices[:n])  # compiles
    start = time.perf_counter()
    engine.train_candidates([cand], data, devices=devices[:n])
    seconds = time.perf_counter() - start
    out[f"devices_{n}_examples_per_s"] = round(args.steps * args.one_candidate_batch / seconds, 1)
  if len(devices) >= 2:
    out["speedup_2_over_1"] = round(out["devices_2_examples_per_s"] / out["devices_1_examples_per_s"], 3)
  return out


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  args = _args(argv)
  data = load_dataset("mnist_offline")
  if args.search_only:
    return _search_only(args, data)
  with tempfile.TemporaryDirectory(prefix="jaxdp-scale-out-") as root:
    out = {"candidates": args.candidates, "steps": args.steps, "model": args.model, "batch": args.batch,
           "chunk_size": args.chunk_size, "devices": [str(d) for d in jax.devices()],
           "cpu_count": os.cpu_count(), "jax_version": jax.__version__}
    # One config (one Task object) for every search: the local process compiles once.
    config = _config(args, data, args.batch)
    out["local"] = _cold_and_warm(args, data, config, root, "local", LocalTrainer())
    out.update(_ray_paths(args, data, config, root))
    out["same_release"] = (out["local"]["released"] == out["ray_one_node"]["released"]
                           == out["ray_two_nodes"]["released"])
    warm = out["local"]["warm_candidates_per_hour"]
    for name in ("ray_one_node", "ray_two_nodes"):
      out[f"{name}_over_local_warm"] = round(out[name]["warm_candidates_per_hour"] / warm, 3)
    out["resume"] = _resume([a for a in argv if a != "--search-only"], args, os.path.join(root, "resume"))
    out["one_candidate"] = _one_candidate(args, data)
  out["quick"] = bool(args.quick)
  print(json.dumps(out))
  return 0


if __name__ == "__main__":
  sys.exit(main())
