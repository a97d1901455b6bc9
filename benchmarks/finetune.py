"""Head-only private fine-tuning vs full training of the same model: speed and memory; prints JSON.

Model: a backbone MLP 784 -> W -> W (tanh, `flax.linen.Dense`; W = 1024 by
default: 1.86M parameters) and a head W -> 10, softmax cross-entropy, on the
offline MNIST (4,000 examples). Two tasks differ only in `trainable`:
`full` trains every parameter, `head_only` trains the head
(`Task(trainable=lambda path: path.startswith("params/head/"))`), so the
backbone gets no per-example gradient, no clipping share, no noise and no
update.

Each runs the library's own DP-SGD loop (`jaxdp.train.program.build_train_loop`,
what `train_candidate` and the sweep engine run: Poisson sampling at an
expected batch of `--batch`, automatic microbatches, clipping, noise, SGD)
for `--steps` steps, compiled once (`compile_s`) and then timed `--repeats`
times; examples/s = steps x expected batch / median seconds. Memory is XLA's
compiled peak of that program (`memory_analysis()`: temp + arguments +
outputs - aliased), and on a GPU the device's `peak_bytes_in_use` as well.
Each task runs in its own process.

  python -m benchmarks.finetune [--width 1024] [--batch 256] [--steps 10] [--repeats 3]
                                [--clipping vmap] [--quick]

`--quick` (width 32, batch 16, 2 steps, one repeat) only checks that the
script still runs; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from benchmarks import _child

TASKS = ("full", "head_only")


def _measure(which: str, args) -> dict:
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top

  from jaxdp.data import load_dataset  # pylint: disable=g-import-not-at-top
  from jaxdp.train import LoopSpec, Task, TrainConfig, loop_spec, program  # pylint: disable=g-import-not-at-top
  from jaxdp.train import trainable as trainable_lib  # pylint: disable=g-import-not-at-top

  width = args.width

  class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = x.reshape((x.shape[0], -1))
      x = jnp.tanh(nn.Dense(width, name="body0")(x))
      x = jnp.tanh(nn.Dense(width, name="body1")(x))
      return nn.Dense(10, name="head")(x)

  task = Task(model=Net(), loss=lambda out, b: optax.softmax_cross_entropy_with_integer_labels(out, b.labels),
              optimizer=lambda hp: optax.sgd(hp["learning_rate"]), clipping=args.clipping,
              trainable=None if which == "full" else (lambda path: path.startswith("params/head/")),
              name=f"finetune-{which}")
  data = load_dataset("mnist_offline")
  config = TrainConfig(task=task, l2_clip_norm=1.0, noise_multiplier=1.0,
                       sampling_prob=args.batch / data.num_examples, steps=args.steps,
                       hparams=dict(learning_rate=0.1))
  spec = LoopSpec.from_config(config, data)
  train = jax.tree.map(jnp.asarray, data.train)
  params = program.init_params(spec, jax.random.key(0), train)
  loop = jax.jit(program.build_train_loop(spec))
  run_args = (params, config.plan(data.num_examples).for_device(),
              loop_spec.traced_hparams(spec, config), jax.random.key(1), train)
  start = time.perf_counter()
  compiled = loop.lower(*run_args).compile()
  compile_s = time.perf_counter() - start
  mem = compiled.memory_analysis()
  peak = (mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes
          - mem.alias_size_in_bytes)
  jax.block_until_ready(compiled(*run_args))  # warm-up
  times = []
  for _ in range(args.repeats):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*run_args))
    times.append(time.perf_counter() - start)
  seconds = statistics.median(times)
  leaf_mask = task.trainable_mask(params)
  trained, _ = trainable_lib.partition(params, leaf_mask)
  stats = jax.devices()[0].memory_stats() or {}
  return {
      "task": which, "params": sum(int(x.size) for x in jax.tree.leaves(params)),
      "trainable_params": sum(int(x.size) for x in jax.tree.leaves(trained)),
      "microbatch_size": spec.microbatch_size, "padded_batch_size": spec.padded_batch_size,
      "compile_s": round(compile_s, 3), "seconds": round(seconds, 4),
      "examples_per_s": round(args.steps * args.batch / seconds, 1),
      "compiled_peak_bytes": int(peak), "temp_bytes": int(mem.temp_size_in_bytes),
      "device_peak_bytes": int(stats["peak_bytes_in_use"]) if "peak_bytes_in_use" in stats else None,
      "_backend": jax.default_backend(), "_device_kind": jax.devices()[0].device_kind,
      "_jax_version": jax.__version__,
  }


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--width", type=int, default=1024, help="backbone width W (1024: 1.86M parameters)")
  parser.add_argument("--batch", type=int, default=256, help="expected batch size q*N")
  parser.add_argument("--steps", type=int, default=10, help="DP steps per timed run")
  parser.add_argument("--repeats", type=int, default=3, help="timed runs per task")
  parser.add_argument("--clipping", default="vmap", choices=("vmap", "ghost"))
  parser.add_argument("--quick", action="store_true", help="smoke run: --width 32 --batch 16 --steps 2 --repeats 1")
  parser.add_argument("--one", choices=TASKS, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.quick:
    args.width, args.batch, args.steps, args.repeats = 32, 16, 2, 1
  if args.one:
    print(json.dumps(_measure(args.one, args)))
    return 0
  results = {which: _child.run("benchmarks.finetune", [*argv, "--one", which], which) for which in TASKS}
  facts = _child.pop_facts([results["full"], results["head_only"]])
  full, head = results["full"], results["head_only"]
  print(json.dumps({
      "width": args.width, "batch": args.batch, "steps": args.steps, "clipping": args.clipping,
      "results": results,
      "speed_head_only_over_full": round(head["examples_per_s"] / full["examples_per_s"], 3),
      "memory_full_over_head_only": round(full["compiled_peak_bytes"] / head["compiled_peak_bytes"], 3),
      **facts, "cpu_count": os.cpu_count(), "quick": bool(args.quick),
  }))
  return 0


if __name__ == "__main__":
  sys.exit(main())
