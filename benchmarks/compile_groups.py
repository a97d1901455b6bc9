"""Compiling a search's groups one after another vs concurrently (issue 44, item 3); prints JSON.

A grid over a static hyperparameter (the classifier's `activation`: each
value builds another model) makes one compiled group per value. The sweep
engine (`jaxdp.sweep.engine.train_candidates`) compiles them one after the
other, each just before it runs. This script first runs the search once (one
step) through the engine, recording each group's program and arguments, then
compiles fresh copies of those programs (new `jax.jit` objects: nothing is
reused from the first run; JAX's persistent cache is off) in three ways, in
this order:

* `sequential`: `jitted.lower(*args).compile()` for each group in turn;
* `threads`: one thread per group doing the same (XLA's compilation
  releases the GIL; tracing and lowering hold it);
* `lower_then_threads`: every group lowered in turn, then the compilations
  in one thread per group (`compile_s` of this row is the compilations alone).

Each row has its wall time and `cores_busy` (process CPU time over wall time).
`loadavg` is the machine's 1-minute load when the script started (other
processes share the cores: compare the rows, not the seconds).

  python -m benchmarks.compile_groups [--model opacus_cnn] [--activations relu tanh tempered_sigmoid]
                                      [--rows 2000] [--quick]

`--quick` (mlp, two activations, 200 rows) only checks that the script still runs; its numbers mean
nothing.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import time


def _timed(fn) -> dict:
  wall, cpu = time.perf_counter(), time.process_time()
  out = fn()
  wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
  return {"wall_s": round(wall, 3), "cores_busy": round(cpu / wall, 2), **(out or {})}


def _recorded_groups(args) -> tuple:
  """(the engine's first-run seconds, its compile seconds, [(spec, devices, per_device,
  data_parallel, args)] per group)."""
  from benchmarks._data import mnist_sized  # pylint: disable=g-import-not-at-top
  from jaxdp.sweep import SearchSpace, engine, grid_candidates  # pylint: disable=g-import-not-at-top
  from jaxdp.train import TrainConfig, presets  # pylint: disable=g-import-not-at-top

  data = mnist_sized(args.rows)
  base = TrainConfig(task=presets.classifier(10), l2_clip_norm=1.0, noise_multiplier=1.1,
                     sampling_prob=64 / args.rows, steps=1, hparams=dict(learning_rate=0.5, model=args.model))
  cands = grid_candidates(SearchSpace(base, {"activation": list(args.activations)}), seeds=[0])
  recorded, original = [], engine._compiled_chunk  # pylint: disable=protected-access

  def record(*call):
    recorded.append(call)
    return original(*call)

  engine._compiled_chunk = record  # pylint: disable=protected-access
  try:
    start = time.perf_counter()
    results = engine.train_candidates(cands, data)
    first = time.perf_counter() - start
  finally:
    engine._compiled_chunk = original  # pylint: disable=protected-access
  # One candidate per group: each result's compile time is its group's.
  return first, sum(r.compile_time_s for r in results), recorded


def _fresh(recorded: list) -> list:
  from jaxdp.sweep import engine  # pylint: disable=g-import-not-at-top
  return [(engine._build_program(*call[:4]), call[4]) for call in recorded]  # pylint: disable=protected-access


def _compile_all(recorded: list, threads: bool, lower_first: bool) -> dict:
  pairs = _fresh(recorded)
  if lower_first:
    lowered = [jitted.lower(*a) for jitted, a in pairs]
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(lowered)) as pool:
      list(pool.map(lambda low: low.compile(), lowered))
    return {"compile_s": round(time.perf_counter() - start, 3)}
  one = lambda pair: pair[0].lower(*pair[1]).compile()
  if threads:
    with concurrent.futures.ThreadPoolExecutor(len(pairs)) as pool:
      list(pool.map(one, pairs))
  else:
    for pair in pairs:
      one(pair)
  return None


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="opacus_cnn", help="the classifier preset's model")
  parser.add_argument("--activations", nargs="+", default=["relu", "tanh", "tempered_sigmoid"],
                      help="grid of activations: one compiled group each")
  parser.add_argument("--rows", type=int, default=2000, help="training rows (random MNIST-sized images)")
  parser.add_argument("--quick", action="store_true", help="smoke run: --model mlp --activations relu tanh --rows 200")
  args = parser.parse_args(argv)
  if args.quick:
    args.model, args.activations, args.rows = "mlp", ["relu", "tanh"], 200
  os.environ["JAXDP_COMPILATION_CACHE"] = "0"  # every compilation below is a real one
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_enable_compilation_cache", False)
  loadavg = os.getloadavg()[0]
  first, engine_compile_s, recorded = _recorded_groups(args)
  rows = {name: _timed(lambda t=threads, f=first_lower: _compile_all(recorded, t, f))
          for name, threads, first_lower in (("sequential", False, False), ("threads", True, False),
                                             ("lower_then_threads", True, True))}
  print(json.dumps({
      "model": args.model, "groups": len(recorded), "rows": args.rows,
      "engine_first_run_s": round(first, 3), "engine_compile_s": round(engine_compile_s, 3),
      **rows, "speedup_threads": round(rows["sequential"]["wall_s"] / rows["threads"]["wall_s"], 3),
      "loadavg": loadavg, "cpu_count": os.cpu_count(), "backend": jax.default_backend(),
      "jax_version": jax.__version__, "quick": bool(args.quick),
      "command": "python -m benchmarks.compile_groups" + (" --quick" if args.quick else ""),
  }, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
