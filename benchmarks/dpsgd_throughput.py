"""Throughput of one jitted DP-SGD step vs a non-private SGD step; prints JSON.

Model: the Papernot-Steinke all-convolutional CNN (jaxdp.models), batch 256 of
28x28x1, tanh, as the classifier preset task (`jaxdp.train.presets.classifier`
with hyperparameters model='papernot_steinke_cnn', learning_rate=0.1).  The DP
step is the library path `train_candidate` runs: `DpSgdPlan.batch_sum` (the
Poisson sample, here q = 1 on N = batch examples, processed in microbatches
of the automatic size, `jaxdp.train.microbatching`) of
`DpSgdPlan.clipped_grad` (per-example gradients, clip, masked sum), then the
plan's `privatizer` (Gaussian noise of std sigma x the sensitivity, division
by the expected batch size) chained with the task's optimizer
(`presets.classifier_optimizer`: SGD).  The non-private step applies plain
`optax.sgd` to the mean loss's gradient.  Both steps are measured in this
process, alternating, median of repeats.

Variants (under "variants", the first is the default):
  * the default: `Task(clipping='auto')`, which picks ghost norms or
    per-example gradients per layer (`jaxdp.train.ghost`), at the automatic
    microbatch size;
  * each path it chooses between, forced: `Task(clipping='vmap')` and
    `Task(clipping='ghost')`, at their automatic microbatch sizes
    (`auto_over_faster_path` is the default's speed over the faster);
  * the whole batch in one vmap (the default before microbatching was
    automatic) vs 4 microbatches;
  * XLA native convolutions instead of im2col: vmap of a native
    convolution's weight gradient lowers to a batch-grouped convolution,
    which XLA:CPU runs slowly.

Usage: python benchmarks/dpsgd_throughput.py [--batch 256] [--repeats 7] [--quick]

`--quick` (batch 8 of 8x8 images, one repeat, no variants) only checks that
the script still runs; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import optax

from jaxdp.data import DataSplit
from jaxdp.train import DpSgdPlan, ghost_analysis, microbatching, presets

HPARAMS = dict(model="papernot_steinke_cnn", activation="tanh", learning_rate=0.1)


def _steps(conv_impl: str, batch: int, microbatch: int | None, image_size: int, clipping: str):
  task = presets.classifier(10, conv_impl=conv_impl)
  model = task.model_for(HPARAMS)
  loss_fn = task.per_example_loss(model)  # (params, DataSplit batch) -> (b,)
  optimizer = task.optimizer_for(HPARAMS)
  sgd = optax.sgd(HPARAMS["learning_rate"])

  @jax.jit
  def nonprivate_step(params, opt_state, batch_):
    grads = jax.grad(lambda p: loss_fn(p, batch_).mean())(params)
    updates, opt_state = sgd.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  x = jax.random.normal(jax.random.key(1), (batch, image_size, image_size, 1))
  data = DataSplit(x, jnp.arange(batch) % 10)
  params = jax.jit(model.init)(jax.random.key(2), x[:1])
  if microbatch is None:  # what the trainer picks for a padded batch of this size
    split = (None if clipping == "vmap"
             else ghost_analysis.ghost_layers(loss_fn, params, data, auto=clipping == "auto"))
    microbatch = microbatching.microbatch_size_for(loss_fn, params, data,
                                                   without=split.ghost_leaves if split else (),
                                                   extra=split.norm_bytes if split else 0)
  # q = 1 on N = batch examples: every example is sampled and the privatizer
  # divides the noisy sum by q*N = the batch.
  plan = DpSgdPlan(l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=1.0, num_steps=1,
                   num_examples=batch)
  clipped = plan.clipped_grad(loss_fn, method=clipping)
  dp = optax.chain(plan.privatizer(clipped, jax.random.key(0)), optimizer)

  @jax.jit
  def dp_step(params, opt_state, batch_, key):
    take = lambda idx: jax.tree.map(lambda a: a[idx], batch_)
    grad_sum, _ = plan.batch_sum(key, lambda idx, valid: clipped(params, take(idx), valid),
                                 num_rows=batch, padded_batch_size=batch, microbatch_size=microbatch)
    updates, opt_state = dp.update(grad_sum, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  np_state, dp_state = sgd.init(params), dp.init(params)
  return (lambda: nonprivate_step(params, np_state, data),
          lambda: dp_step(params, dp_state, data, jax.random.key(3)), microbatch)


def _time(fn, repeats: int) -> list[float]:
  out = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    out.append(time.perf_counter() - t)
  return out


def measure(conv_impl: str, batch: int, repeats: int, microbatch: int | None = None,
            image_size: int = 28, clipping: str = "auto", label: str = "") -> dict:
  """Compiles both steps, then times them alternately; returns medians."""
  nonprivate, dp, microbatch = _steps(conv_impl, batch, microbatch, image_size, clipping)
  t0 = time.perf_counter()
  jax.block_until_ready(nonprivate())
  jax.block_until_ready(dp())
  compile_s = time.perf_counter() - t0
  t_np, t_dp = [], []
  for _ in range(repeats):
    # Alternating keeps both exposed to the same machine load.
    t_np += _time(nonprivate, 1)
    t_dp += _time(dp, 1)
  np_s, dp_s = statistics.median(t_np), statistics.median(t_dp)
  return {"variant": label, "conv_impl": conv_impl, "clipping": clipping, "microbatch_size": microbatch,
          "nonprivate_examples_per_s": batch / np_s, "dp_examples_per_s": batch / dp_s,
          "dp_over_nonprivate_time": dp_s / np_s, "nonprivate_step_s": np_s, "dp_step_s": dp_s,
          "compile_s": compile_s}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--image-size", type=int, default=28, help="height = width of the inputs")
  parser.add_argument("--skip-variants", action="store_true",
                      help="measure only the library default")
  parser.add_argument("--quick", action="store_true",
                      help="smoke run: --batch 8 --repeats 1 --image-size 8 --skip-variants")
  args = parser.parse_args(argv)
  if args.quick:
    args.batch, args.repeats, args.image_size, args.skip_variants = 8, 1, 8, True
  size = args.image_size
  main_result = measure("im2col", args.batch, args.repeats, image_size=size,
                        label="default (clipping auto, automatic microbatch)")
  variants = [main_result]
  paths = {}
  if not args.skip_variants:
    # The two paths auto chooses between, as many repeats as the default: the goal
    # (within 10% of the faster) is a ratio of medians of the same size.
    for clipping in ("vmap", "ghost"):
      paths[clipping] = measure("im2col", args.batch, args.repeats, image_size=size, clipping=clipping,
                                label=f"clipping {clipping!r} forced, automatic microbatch")
      variants.append(paths[clipping])
    r = max(3, args.repeats // 2)
    variants.append(measure("im2col", args.batch, r, microbatch=args.batch, image_size=size, clipping="vmap",
                            label="one vmap over the whole batch (the default before microbatching)"))
    variants.append(measure("im2col", args.batch, r, microbatch=args.batch // 4, image_size=size,
                            clipping="vmap", label="4 microbatches"))
    variants.append(measure("native", args.batch, r, image_size=size, clipping="vmap",
                            label="native convolutions"))
  result = {
      "model": "papernot_steinke_cnn", "batch": args.batch, "input_shape": [size, size, 1],
      "nonprivate_examples_per_s": main_result["nonprivate_examples_per_s"],
      "dp_examples_per_s": main_result["dp_examples_per_s"],
      "dp_over_nonprivate_time": main_result["dp_over_nonprivate_time"],
      "conv_impl": "im2col", "microbatch_size": main_result["microbatch_size"],
      "auto_over_faster_path": (main_result["dp_examples_per_s"] /
                                max(p["dp_examples_per_s"] for p in paths.values()) if paths else None),
      "repeats": args.repeats, "quick": bool(args.quick),
      "backend": jax.default_backend(), "devices": len(jax.devices()),
      "cpu_count": os.cpu_count(), "jax_version": jax.__version__,
      "variants": variants,
  }
  print(json.dumps(result, indent=2))
  return 0


if __name__ == "__main__":
  sys.exit(main())
