"""A DP transformer step vs the plain optax step of the same model, at two vocabularies; prints JSON.

Model: `jaxdp.models.TransformerClassifier`: token `nn.Embed` of a V-token
vocabulary (V = 8,192 and 32,768), width 128, two pre-LN blocks of 4-head
self-attention + MLP (512), sequence 64 (random lengths 32..64, the rest
padding), two classes, Adam. Two ways to train it:

* `full`: every parameter trains;
* `lora`: rank-8 adapters on the four attention projections of each block
  (`TransformerClassifier(lora_rank=8)`) and the head train
  (`Task(trainable=...)`), everything else is frozen.

For each (V, way), in one process: the library's own DP-SGD loop
(`jaxdp.train.program.build_train_loop`: Poisson sampling at expected batch
32, the task's default clipping `auto`, the automatic microbatch, noise,
Adam) and a non-private loop of the same steps (a uniform batch of 32 rows,
`jax.value_and_grad` of the mean loss, the same optax Adam on the same
trainable parameters), each compiled once and run `--steps` steps per call,
timed `--repeats` times (median). `ratio` = DP step / non-private step.
Memory: `per_example_bytes` (one example's gradient working set on the DP
path, what sets the microbatch), and XLA's compiled peak of each loop
(`memory_analysis()`). Each (V, way) runs in its own process.

Where a DP step's time goes (`breakdown`, same process): the task's clipped
gradient sum (`DpSgdPlan.clipped_grad`, clipping `auto`) and the plain
gradient of the mean, each on one fixed batch of 32 rows (their ratio is
the clipping's own cost at equal rows); the Gaussian noise on the trainable
parameters (`noise.add_gaussian_noise`, threefry); and the rows a step
computes on average, E[ceil(B / m)] m for B ~ Binomial(N, q) and
microbatch m (only microbatches holding sampled rows run).

  python -m benchmarks.transformer [--vocab 8192 32768] [--steps 20] [--repeats 5] [--microbatch M]
                                   [--quick]

`--quick` (V = 512, width 32, sequence 16, one block, 2 steps, one repeat) only checks that the script
still runs; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from benchmarks import _child

WAYS = ("full", "lora")
EXAMPLES = 4096
BATCH = 32


def _peak(compiled) -> int:
  mem = compiled.memory_analysis()
  return int(mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes
             - mem.alias_size_in_bytes)


def _timed(compiled, args, repeats: int) -> float:
  import jax  # pylint: disable=g-import-not-at-top
  jax.block_until_ready(compiled(*args))  # warm-up
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _measure(vocab: int, way: str, args) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top

  from jaxdp.data import DataSplit, Dataset  # pylint: disable=g-import-not-at-top
  from jaxdp.models import TransformerClassifier, lora  # pylint: disable=g-import-not-at-top
  from jaxdp.train import ExecutionConfig, LoopSpec, Task, TrainConfig, program  # pylint: disable=g-import-not-at-top
  from jaxdp.train import loop_spec, noise  # pylint: disable=g-import-not-at-top
  from jaxdp.train import trainable as trainable_lib  # pylint: disable=g-import-not-at-top
  from scipy import stats as scipy_stats  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(0)
  lengths = rng.integers(args.length // 2, args.length + 1, size=EXAMPLES)
  tokens = rng.integers(1, vocab, size=(EXAMPLES, args.length)).astype(np.int32)
  tokens[np.arange(args.length)[None, :] >= lengths[:, None]] = 0
  labels = (rng.random(EXAMPLES) < 0.5).astype(np.int32)
  data = Dataset(name="random tokens", train=DataSplit(tokens, labels),
                 test=DataSplit(tokens[:256], labels[:256]), num_examples=EXAMPLES, num_classes=2)
  model = TransformerClassifier(vocab_size=vocab, max_length=args.length, width=args.width, depth=args.depth,
                                num_heads=4, lora_rank=8 if way == "lora" else None)
  trainable = None if way == "full" else (lambda path: lora.adapters(path) or path.startswith("params/head/"))
  cross_entropy = lambda out, b: optax.softmax_cross_entropy_with_integer_labels(out, b[1])
  task = Task(model=model, loss=cross_entropy, optimizer=lambda hp: optax.adam(hp["learning_rate"]),
              trainable=trainable, name=f"transformer-{way}")
  execution = ExecutionConfig(microbatch_size=args.microbatch) if args.microbatch else ExecutionConfig()
  config = TrainConfig(task=task, l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=BATCH / EXAMPLES,
                       steps=args.steps, hparams=dict(learning_rate=1e-3), execution=execution)
  spec = LoopSpec.from_config(config, data)
  train = jax.tree.map(jnp.asarray, data.train)
  params = program.init_params(spec, jax.random.key(0), train)
  loop = jax.jit(program.build_train_loop(spec))
  dp_args = (params, config.plan(data.num_examples).for_device(), loop_spec.traced_hparams(spec, config),
             jax.random.key(1), train)
  dp = loop.lower(*dp_args).compile()

  trained, frozen = trainable_lib.partition(params, task.trainable_mask(params))
  per_example = trainable_lib.partial_loss(task.per_example_loss(model), frozen)
  opt = optax.adam(1e-3)

  def plain(trained, key, train):
    def step(t, carry):
      trained, opt_state = carry
      idx = jax.random.randint(jax.random.fold_in(key, t), (BATCH,), 0, EXAMPLES)
      batch = jax.tree.map(lambda leaf: leaf[idx], train)
      grads = jax.grad(lambda p: jnp.mean(per_example(p, batch)))(trained)
      updates, opt_state = opt.update(grads, opt_state, trained)
      return optax.apply_updates(trained, updates), opt_state
    return jax.lax.fori_loop(0, args.steps, step, (trained, opt.init(trained)))

  plain_args = (trained, jax.random.key(2), train)
  non_private = jax.jit(plain).lower(*plain_args).compile()
  dp_s = _timed(dp, dp_args, args.repeats) / args.steps
  plain_s = _timed(non_private, plain_args, args.repeats) / args.steps

  fixed = jax.tree.map(lambda leaf: leaf[:BATCH], train)
  clipped = config.plan(data.num_examples).for_device().clipped_grad(per_example, method=task.clipping)
  clipped_fn = jax.jit(lambda t, b: clipped(t, b, jnp.ones(BATCH, bool)))
  grad_fn = jax.jit(lambda t, b: jax.grad(lambda p: jnp.mean(per_example(p, b)))(t))
  noisy = noise.add_gaussian_noise(1.0, 1.0, jax.random.key(3))
  noise_fn = jax.jit(lambda t, s: noisy.update(t, s)[0])
  repeats = max(args.repeats, 5)
  batches = scipy_stats.binom(EXAMPLES, BATCH / EXAMPLES)
  sizes = np.arange(spec.padded_batch_size * 4)
  micro = spec.microbatch_size
  breakdown = {
      "clipped_grad_32_s": round(_timed(clipped_fn, (trained, fixed), repeats), 5),
      "grad_32_s": round(_timed(grad_fn, (trained, fixed), repeats), 5),
      "noise_s": round(_timed(noise_fn, (trained, noisy.init(trained)), repeats), 5),
      "expected_rows_per_step": round(float(np.sum(batches.pmf(sizes) * -(-sizes // micro) * micro)), 1),
  }
  breakdown["clip_ratio_at_32_rows"] = round(breakdown["clipped_grad_32_s"] / breakdown["grad_32_s"], 3)
  paths = loop_spec.clipping_paths(spec, train)
  return {
      "vocab": vocab, "way": way,
      "params": sum(int(x.size) for x in jax.tree.leaves(params)),
      "trainable_params": sum(int(x.size) for x in jax.tree.leaves(trained)),
      "dp_step_s": round(dp_s, 5), "non_private_step_s": round(plain_s, 5),
      "ratio": round(dp_s / plain_s, 3),
      "per_example_bytes": loop_spec.per_example_bytes(spec, train),
      "microbatch_size": spec.microbatch_size, "padded_batch_size": spec.padded_batch_size,
      "dp_compiled_peak_bytes": _peak(dp), "non_private_compiled_peak_bytes": _peak(non_private),
      "clipping": {kind: sum(1 for p in paths if p[1] == kind) for kind in ("ghost", "per-example", "frozen")},
      "breakdown": breakdown,
      "_backend": jax.default_backend(), "_device_kind": jax.devices()[0].device_kind,
      "_jax_version": jax.__version__,
  }


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--vocab", type=int, nargs="+", default=[8192, 32768], help="vocabulary sizes")
  parser.add_argument("--width", type=int, default=128, help="model width d")
  parser.add_argument("--length", type=int, default=64, help="sequence length T")
  parser.add_argument("--depth", type=int, default=2, help="transformer blocks")
  parser.add_argument("--steps", type=int, default=20, help="steps per timed call")
  parser.add_argument("--repeats", type=int, default=5, help="timed calls per loop")
  parser.add_argument("--microbatch", type=int, default=None, help="ExecutionConfig.microbatch_size (None: automatic)")
  parser.add_argument("--quick", action="store_true",
                      help="smoke run: --vocab 512 --width 32 --length 16 --depth 1 --steps 2 --repeats 1")
  parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.quick:
    args.vocab, args.width, args.length, args.depth, args.steps, args.repeats = [512], 32, 16, 1, 2, 1
  if args.one:
    print(json.dumps(_measure(int(args.one[0]), args.one[1], args)))
    return 0
  # Each child applies --quick itself; --one picks its vocabulary and way.
  results = [_child.run("benchmarks.transformer", [*argv, "--one", str(vocab), way], f"{vocab}/{way}")
             for vocab in args.vocab for way in WAYS]
  facts = _child.pop_facts(results)
  print(json.dumps({"width": args.width, "length": args.length, "depth": args.depth, "batch": BATCH,
                    "steps": args.steps,
                    "results": results, **facts, "cpu_count": os.cpu_count(), "quick": bool(args.quick)},
                   indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
