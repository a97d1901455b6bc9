"""Gaussian noise throughput per PRNG implementation, per leaf vs one draw; prints JSON.

  python -m benchmarks.noise_throughput [--coordinates 4600000] [--leaves 40] [--repeats 7] [--quick]

DP-SGD draws one Gaussian per trainable coordinate per step
(`jaxdp.train.noise.add_gaussian_noise`: one key split per leaf, one
`jax.random.normal` per leaf). For each PRNG implementation JAX offers
(threefry2x32, the default; rbg; unsafe_rbg), compiled once and timed
`--repeats` times (median):

* `one_draw`: `--coordinates` normals in one call;
* `per_leaf`: the same coordinates as `--leaves` leaves of equal size, one
  split key each (the library's way);
* `add`: `g + s * z` on arrays of that size with `z` given (what the noise
  costs beyond the draw: memory traffic only), the floor a generator can reach.

`msamples_per_s` = coordinates / seconds / 1e6. The default size is the
32k-vocabulary transformer of `benchmarks/transformer.py` (4.6M trainable
coordinates). `--quick` (65,536 coordinates, 4 leaves, 2 repeats) only checks
that the script runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")


def _median_seconds(fn, args, repeats: int) -> float:
  import jax  # pylint: disable=g-import-not-at-top
  jax.block_until_ready(fn(*args))  # compiles
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def measure(coordinates: int, leaves: int, repeats: int) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  size = coordinates // leaves
  total = size * leaves

  def one_draw(key):
    return jax.random.normal(key, (total,), jnp.float32)

  def per_leaf(key):
    keys = jax.random.split(key, leaves)
    return [jax.random.normal(k, (size,), jnp.float32) for k in keys]

  def add(g, z):
    return g + jnp.float32(1.5) * z

  g = jnp.ones((total,), jnp.float32)
  z = jnp.full((total,), 0.5, jnp.float32)
  floor = _median_seconds(jax.jit(add), (g, z), repeats)
  rows = []
  for impl in IMPLS:
    key = jax.random.key(0, impl=impl)
    row = {"impl": impl}
    for name, fn in (("one_draw", one_draw), ("per_leaf", per_leaf)):
      seconds = _median_seconds(jax.jit(fn), (key,), repeats)
      row[f"{name}_s"] = seconds
      row[f"{name}_msamples_per_s"] = total / seconds / 1e6
    rows.append(row)
  return {"coordinates": total, "leaves": leaves, "add_s": floor, "results": rows}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--coordinates", type=int, default=4_600_000)
  parser.add_argument("--leaves", type=int, default=40)
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--quick", action="store_true", help="65,536 coordinates, 4 leaves, 2 repeats")
  args = parser.parse_args(argv)
  if args.quick:
    args.coordinates, args.leaves, args.repeats = 65_536, 4, 2
  for name in ("coordinates", "leaves", "repeats"):
    if getattr(args, name) < 1:
      parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
  if args.leaves > args.coordinates:
    parser.error(f"--leaves ({args.leaves}) must be at most --coordinates ({args.coordinates})")
  import jax  # pylint: disable=g-import-not-at-top
  out = measure(args.coordinates, args.leaves, args.repeats)
  out.update(command="python -m benchmarks.noise_throughput " + " ".join(argv or sys.argv[1:]),
             device=str(jax.devices()[0].device_kind), backend=jax.default_backend(),
             jax_version=jax.__version__, machine=platform.machine(), cpu_count=os.cpu_count(),
             repeats=args.repeats, quick=bool(args.quick))
  print(json.dumps(out))
  return 0


if __name__ == "__main__":
  sys.exit(main())
