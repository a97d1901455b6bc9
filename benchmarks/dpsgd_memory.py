"""Memory and speed of a DP-SGD step on each clipping path; prints JSON.

Models (`--model`):
  * `mlp` (default): an MLP 784 -> W -> W -> 10 of `flax.linen.Dense` layers
    (tanh), W = 3072 by default (11.9M parameters), where ghost clipping
    needs a fraction of the vmap path's memory;
  * `cnn`: the Papernot-Steinke all-convolutional CNN of `jaxdp.models` on
    28x28x1 (102,570 parameters), where per-example gradients are faster.
Both with softmax cross-entropy. One DP step is one `jax.jit`: the clipped
gradient sum, Gaussian noise of std sigma x C, and an SGD update.  Paths:

  * `vmap`: `jaxdp.train.clipped_grad_sum` over the whole batch in one call,
    which materialises b per-example gradients of every parameter;
  * `vmap_microbatched`: `Task(clipping="vmap")` as `train_candidate` runs
    it, in microbatches of the library's automatic size (a `lax.scan`);
  * `ghost`: `Task(clipping="ghost")` as `train_candidate` runs it: ghost
    norms for every eligible layer, microbatched the same way (the working
    set then counts no ghost layer's per-example gradient);
  * `auto`: `Task(clipping="auto")`, the default: ghost norms or per-example
    gradients per layer by the cost model of
    `jaxdp.train.ghost.ghost_clipped_grad_sum(auto=True)`, microbatched the
    same way. `ratios` compares it with the faster and the smaller of
    `vmap_microbatched` and `ghost`.

For each (path, batch) the step is compiled first and its peak memory read
from XLA (`compiled.memory_analysis()`: temp + argument + output - aliased
bytes; no execution needed, so it is reported even for configurations too
large to run).  A configuration runs only if that fits the budget: by
default half the machine's RAM on CPU, the device's `bytes_limit` on an
accelerator (`--max-gib` overrides); otherwise it is reported as
`"skipped": "needs X GiB ..."`.  Configurations that run report the median
examples/s of `--repeats` timed steps after one warm-up step, and, where the
backend tracks it (GPU), the device's `peak_bytes_in_use`.  Each
configuration runs in its own process, so that peak belongs to it alone.

  python -m benchmarks.dpsgd_memory [--model mlp|cnn] [--width 3072] [--batches 32,256,1024]
                                    [--repeats 3] [--max-gib G] [--quick]

`--quick` (width 64 or 8x8 images, batch 8, one repeat) only checks that the
script still runs; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATHS = ("vmap", "vmap_microbatched", "ghost", "auto")
#: Path -> `Task.clipping` it runs (in microbatches of the library's size); "vmap" is one call.
METHODS = {"vmap_microbatched": "vmap", "ghost": "ghost", "auto": "auto"}
INPUT_DIM, NUM_CLASSES = 784, 10
L2_CLIP_NORM, NOISE_MULTIPLIER, LEARNING_RATE = 1.0, 1.0, 0.1
GIB = 2.0 ** 30


def _budget_bytes(max_gib: float | None) -> tuple[int, str]:
  import jax  # pylint: disable=g-import-not-at-top
  if max_gib is not None:
    return int(max_gib * GIB), "--max-gib"
  stats = jax.devices()[0].memory_stats() or {}
  if "bytes_limit" in stats:
    return int(stats["bytes_limit"]), "device bytes_limit"
  return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2), "half of RAM"


def _measure(path: str, batch: int, model_name: str, width: int, image_size: int, repeats: int,
             max_gib: float | None) -> dict:
  """Compiles one DP step, reads its memory, and times it when it fits the budget."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top

  from jaxdp.models import get_model  # pylint: disable=g-import-not-at-top
  from jaxdp.train import DpSgdPlan, ghost_analysis, microbatching  # pylint: disable=g-import-not-at-top

  class WideMLP(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = jnp.tanh(nn.Dense(width)(x))
      x = jnp.tanh(nn.Dense(width)(x))
      return nn.Dense(NUM_CLASSES)(x)

  if model_name == "mlp":
    model, shape = WideMLP(), (INPUT_DIM,)
  else:
    model, shape = get_model("papernot_steinke_cnn", num_classes=NUM_CLASSES), (image_size, image_size, 1)

  def loss_fn(params, data):
    x, y = data
    return optax.softmax_cross_entropy_with_integer_labels(model.apply(params, x), y)

  params = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1,) + shape))
  data = (jax.random.normal(jax.random.key(1), (batch,) + shape), jnp.arange(batch) % NUM_CLASSES)
  micro, method = batch, METHODS.get(path)
  if method is not None:  # the library's own microbatch, as train_candidate picks it
    split = (None if method == "vmap"
             else ghost_analysis.ghost_layers(loss_fn, params, data, auto=method == "auto"))
    micro = microbatching.microbatch_size_for(loss_fn, params, data, without=split.ghost_leaves if split else (),
                                              extra=split.norm_bytes if split else 0)
  plan = DpSgdPlan(l2_clip_norm=L2_CLIP_NORM, noise_multiplier=NOISE_MULTIPLIER, sampling_prob=1.0,
                   num_steps=1, num_examples=batch)
  summed = plan.clipped_grad(loss_fn, method=method or "vmap").fn

  def clipped_sum(params, data, mask):
    if micro == batch:
      return summed(params, data, mask)
    split = lambda a: a.reshape((batch // micro, micro) + a.shape[1:])

    def add(total, part):
      return jax.tree.map(jnp.add, total, summed(params, *part)), None
    total, _ = jax.lax.scan(add, jax.tree.map(jnp.zeros_like, params), jax.tree.map(split, (data, mask)))
    return total

  def dp_step(params, data, mask, key):
    grad_sum = clipped_sum(params, data, mask)
    leaves, treedef = jax.tree.flatten(grad_sum)
    keys = jax.random.split(key, len(leaves))
    noisy = [g + NOISE_MULTIPLIER * L2_CLIP_NORM * jax.random.normal(k, g.shape, g.dtype)
             for g, k in zip(leaves, keys)]
    # q = 1 here: the expected batch size is the batch.
    return jax.tree.map(lambda p, g: p - LEARNING_RATE * g / batch, params,
                        jax.tree.unflatten(treedef, noisy))

  mask = jnp.ones((batch,), bool)
  key = jax.random.key(2)
  t0 = time.perf_counter()
  lowered = jax.jit(dp_step).lower(params, data, mask, key)
  compiled = lowered.compile()
  compile_s = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  peak = (mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes
          - mem.alias_size_in_bytes)
  budget, budget_source = _budget_bytes(max_gib)
  device = jax.devices()[0]
  out = {
      "path": path, "clipping": method, "batch": batch, "microbatch_size": micro,
      # Equal hashes: the same program (e.g. auto choosing ghost norms everywhere), so their
      # timings differ by noise alone.
      "program_sha256": hashlib.sha256(lowered.as_text(debug_info=False).encode()).hexdigest()[:16], "compiled_peak_bytes": int(peak),
      "compiled_peak_gib": peak / GIB, "temp_bytes": int(mem.temp_size_in_bytes),
      "argument_bytes": int(mem.argument_size_in_bytes),
      "output_bytes": int(mem.output_size_in_bytes), "alias_bytes": int(mem.alias_size_in_bytes),
      "compile_s": compile_s, "skipped": None, "step_s": None, "examples_per_s": None,
      "device_peak_bytes": None,
      # Machine facts travel with each result: the parent never starts a backend.
      "_num_params": sum(int(leaf.size) for leaf in jax.tree.leaves(params)),
      "_budget_bytes": budget, "_budget_source": budget_source,
      "_backend": jax.default_backend(), "_devices": len(jax.devices()),
      "_device_kind": device.device_kind,
  }
  if peak > budget:
    out["skipped"] = f"needs {peak / GIB:.1f} GiB (budget {budget / GIB:.1f} GiB, {budget_source})"
    return out
  jax.block_until_ready(compiled(params, data, mask, key))  # warm-up
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(compiled(params, data, mask, key))
    times.append(time.perf_counter() - t)
  out["step_s"] = statistics.median(times)
  out["examples_per_s"] = batch / out["step_s"]
  stats = device.memory_stats() or {}
  if "peak_bytes_in_use" in stats:
    out["device_peak_bytes"] = int(stats["peak_bytes_in_use"])
  return out


def _child(path: str, batch: int, args) -> dict:
  """Runs `_measure` in a fresh interpreter: its own device peak, its own RAM."""
  cmd = [sys.executable, "-m", "benchmarks.dpsgd_memory", "--one", path, str(batch),
         "--model", args.model, "--width", str(args.width), "--image-size", str(args.image_size),
         "--repeats", str(args.repeats)]
  if args.max_gib is not None:
    cmd += ["--max-gib", str(args.max_gib)]
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
  if proc.returncode != 0:
    return {"path": path, "batch": batch, "error": (proc.stderr or proc.stdout)[-2000:]}
  return json.loads(proc.stdout)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp",
                      help="the wide MLP or the Papernot-Steinke CNN (see above)")
  parser.add_argument("--width", type=int, default=3072, help="hidden width W of the MLP")
  parser.add_argument("--image-size", type=int, default=28, help="height = width of the CNN's inputs")
  parser.add_argument("--batches", default="32,256,1024",
                      help="comma-separated batch sizes (32 is small enough for the vmap path "
                           "to run on a 24 GiB CPU machine)")
  parser.add_argument("--repeats", type=int, default=3, help="timed steps per configuration")
  parser.add_argument("--max-gib", type=float, default=None,
                      help="run a configuration only if its compiled peak fits this many GiB "
                           "(default: device bytes_limit, or half of RAM on CPU)")
  parser.add_argument("--quick", action="store_true",
                      help="smoke run: --width 64 --image-size 8 --batches 8 --repeats 1")
  parser.add_argument("--one", nargs=2, metavar=("PATH", "BATCH"), help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.one:
    print(json.dumps(_measure(args.one[0], int(args.one[1]), args.model, args.width, args.image_size,
                              args.repeats, args.max_gib)))
    return 0
  if args.quick:
    args.width, args.image_size, args.batches, args.repeats = 64, 8, "8", 1
  batches = [int(b) for b in args.batches.split(",")]

  results = [_child(path, batch, args) for batch in batches for path in PATHS]
  facts = dict(next((r for r in results if "error" not in r), {}))
  for r in results:
    for k in [k for k in r if k.startswith("_")]:
      del r[k]
  ratios = []
  for batch in batches:
    by_path = {r["path"]: r for r in results if r["batch"] == batch and "error" not in r}
    if not {"ghost", "vmap_microbatched", "auto"} <= set(by_path):
      continue
    ghost, auto = by_path["ghost"], by_path["auto"]
    ratio = {"batch": batch}
    for name in ("vmap", "vmap_microbatched"):
      if name in by_path:
        other = by_path[name]
        ratio[f"memory_ghost_over_{name}"] = ghost["compiled_peak_bytes"] / other["compiled_peak_bytes"]
        ratio[f"speed_ghost_over_{name}"] = (ghost["examples_per_s"] / other["examples_per_s"]
                                            if ghost["examples_per_s"] and other["examples_per_s"] else None)
    paths = [by_path["vmap_microbatched"], ghost]
    # The default against the better of the two paths it chooses between, on each measure.
    ratio["memory_auto_over_smaller"] = auto["compiled_peak_bytes"] / min(p["compiled_peak_bytes"] for p in paths)
    speeds = [p["examples_per_s"] for p in paths if p["examples_per_s"]]
    ratio["speed_auto_over_faster"] = (auto["examples_per_s"] / max(speeds)
                                       if auto["examples_per_s"] and speeds else None)
    ratio["auto_same_program_as"] = [p["path"] for p in paths if p["program_sha256"] == auto["program_sha256"]]
    ratios.append(ratio)
  import jax  # pylint: disable=g-import-not-at-top  (only for its version: no backend starts)
  result = {
      "model": (f"mlp {INPUT_DIM}-{args.width}-{args.width}-{NUM_CLASSES} (flax Dense, tanh)"
                if args.model == "mlp" else
                f"papernot_steinke_cnn ({args.image_size}x{args.image_size}x1, tanh)"),
      "num_params": facts.get("_num_params"), "batches": batches, "repeats": args.repeats,
      "l2_clip_norm": L2_CLIP_NORM, "noise_multiplier": NOISE_MULTIPLIER,
      "budget_bytes": facts.get("_budget_bytes"), "budget_source": facts.get("_budget_source"),
      "results": results, "ratios": ratios, "quick": bool(args.quick),
      "backend": facts.get("_backend"), "devices": facts.get("_devices"),
      "device_kind": facts.get("_device_kind"), "cpu_count": os.cpu_count(),
      "jax_version": jax.__version__,
  }
  print(json.dumps(result, indent=2))
  return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
  sys.exit(main())
