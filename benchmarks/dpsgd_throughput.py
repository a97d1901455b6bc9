"""Throughput of one jitted DP-SGD step vs a non-private SGD step; prints JSON.

Model: the Papernot-Steinke all-convolutional CNN (jaxdp.models), batch 256 of
28x28x1, tanh, as the classifier preset task (`jaxdp.train.presets.classifier`
with hyperparameters model='papernot_steinke_cnn', learning_rate=0.1).  The DP
step is the library path used by `train_candidate`: the task's per-example
loss over a `DataSplit` batch, `DpSgdPlan.clipped_grad` (`clipped_grad_sum`:
vmap per-example gradients, clip, masked sum) followed by the plan's
`privatizer` (Gaussian noise of std sigma x the clipped gradient's
sensitivity, division by the expected batch size) chained with the task's
optimizer (`presets.classifier_optimizer`: SGD with coupled weight decay 0).
The non-private step applies plain `optax.sgd` to the mean loss's gradient.
Both steps are measured in this process, alternating, median of repeats.

Variants tried (reported under "variants"):
  * im2col convolutions (library default) vs XLA native convolutions: vmap of
    a native convolution's weight gradient lowers to a batch-grouped
    convolution, which XLA:CPU runs slowly; im2col turns it into a batched
    matmul with the same FLOPs as the non-private weight gradient.
  * microbatched DP step (lax.map over 4 microbatches of 64) vs one vmap.

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
from jaxdp.train import DpSgdPlan, presets

HPARAMS = dict(model="papernot_steinke_cnn", activation="tanh", learning_rate=0.1)


def _steps(conv_impl: str, batch: int, microbatches: int, image_size: int = 28):
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

  # q = 1 on N = batch examples: the privatizer divides the noisy sum by q*N = the batch.
  plan = DpSgdPlan(l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=1.0, num_steps=1,
                   num_examples=batch)
  clipped = plan.clipped_grad(loss_fn)
  dp = optax.chain(plan.privatizer(clipped, jax.random.key(0)), optimizer)

  @jax.jit
  def dp_step(params, opt_state, batch_, mask):
    if microbatches == 1:
      grad_sum = clipped(params, batch_, mask)
    else:
      m = batch // microbatches
      split = lambda a: a.reshape((microbatches, m) + a.shape[1:])
      parts = jax.lax.map(lambda t: clipped(params, *t), jax.tree.map(split, (batch_, mask)))
      grad_sum = jax.tree.map(lambda g: g.sum(0), parts)
    updates, opt_state = dp.update(grad_sum, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  x = jax.random.normal(jax.random.key(1), (batch, image_size, image_size, 1))
  data = DataSplit(x, jnp.arange(batch) % 10)
  mask = jnp.ones(batch, bool)
  params = jax.jit(model.init)(jax.random.key(2), x[:1])
  np_state, dp_state = sgd.init(params), dp.init(params)
  return (lambda: nonprivate_step(params, np_state, data),
          lambda: dp_step(params, dp_state, data, mask))


def _time(fn, repeats: int) -> list[float]:
  out = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    out.append(time.perf_counter() - t)
  return out


def measure(conv_impl: str, batch: int, repeats: int, microbatches: int = 1, image_size: int = 28) -> dict:
  """Compiles both steps, then times them alternately; returns medians."""
  nonprivate, dp = _steps(conv_impl, batch, microbatches, image_size)
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
  return {"conv_impl": conv_impl, "microbatches": microbatches,
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
  main_result = measure("im2col", args.batch, args.repeats, image_size=size)
  variants = []
  if not args.skip_variants:
    variants.append(measure("native", args.batch, max(3, args.repeats // 2), image_size=size))
    variants.append(measure("im2col", args.batch, max(3, args.repeats // 2), microbatches=4, image_size=size))
  result = {
      "model": "papernot_steinke_cnn", "batch": args.batch, "input_shape": [size, size, 1],
      "nonprivate_examples_per_s": main_result["nonprivate_examples_per_s"],
      "dp_examples_per_s": main_result["dp_examples_per_s"],
      "dp_over_nonprivate_time": main_result["dp_over_nonprivate_time"],
      "conv_impl": "im2col", "repeats": args.repeats, "quick": bool(args.quick),
      "backend": jax.default_backend(), "devices": len(jax.devices()),
      "cpu_count": os.cpu_count(), "jax_version": jax.__version__,
      "variants": [main_result] + variants,
  }
  print(json.dumps(result, indent=2))
  return 0


if __name__ == "__main__":
  sys.exit(main())
