"""What one more microbatch costs on the DP path, against its rows (issue 44, item 4); prints JSON.

The clipped gradient sum of a fixed batch of B = 48 rows (q = 1 on N = 48,
`DpSgdPlan.batch_sum`: the while loop over microbatches a DP step runs,
clipping `auto`) is timed for several microbatch sizes m, all in one
process, the sizes interleaved in every repeat (median). Each time is fitted
to ceil(B / m) * (row_s * m + microbatch_s): `overhead_rows` =
microbatch_s / row_s is a microbatch's cost beyond its rows, in rows, and
`overhead_bytes` the same in bytes of per-example working set (what
`jaxdp.train.microbatching.MICROBATCH_OVERHEAD_BYTES` holds).

Models: `transformer` (the `benchmarks.transformer` model at V = 8,192,
every parameter trained) and `cnn` (Papernot-Steinke CNN on 28 x 28 images,
as `benchmarks.dpsgd_throughput`).

  python -m benchmarks.microbatch_overhead [--model transformer] [--sizes 4 6 8 12 16 24 48]
                                           [--repeats 7] [--quick]

`--quick` (cnn, sizes 8 and 48, one repeat) only checks that the script still runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROWS = 48


def _loss(model_name: str):
  """(per-example loss, trained parameters, batch of ROWS)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from jaxdp.data import DataSplit  # pylint: disable=g-import-not-at-top
  from jaxdp.models import TransformerClassifier  # pylint: disable=g-import-not-at-top
  from jaxdp.train import Task, presets  # pylint: disable=g-import-not-at-top

  if model_name == "transformer":
    rng = np.random.default_rng(0)
    batch = DataSplit(jnp.asarray(rng.integers(1, 8192, size=(ROWS, 64)), jnp.int32),
                      jnp.asarray(rng.random(ROWS) < 0.5, jnp.int32))
    model = TransformerClassifier(vocab_size=8192, max_length=64, width=128, depth=2, num_heads=4)
    task = Task(model=model, loss=lambda out, b: optax.softmax_cross_entropy_with_integer_labels(out, b[1]),
                optimizer=lambda hp: optax.adam(1e-3))
  else:
    batch = DataSplit(jax.random.normal(jax.random.key(1), (ROWS, 28, 28, 1)), jnp.arange(ROWS) % 10)
    task = presets.classifier(10)
    model = task.model_for(dict(model="papernot_steinke_cnn", activation="tanh", learning_rate=0.1))
  params = jax.jit(model.init)(jax.random.key(2), task.model_inputs(batch)[:1])
  return task.per_example_loss(model), params, batch


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", choices=("transformer", "cnn"), default="transformer")
  parser.add_argument("--sizes", type=int, nargs="+", default=[4, 6, 8, 12, 16, 24, 48])
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--quick", action="store_true", help="smoke run: --model cnn --sizes 8 48 --repeats 1")
  args = parser.parse_args(argv)
  if args.quick:
    args.model, args.sizes, args.repeats = "cnn", [8, 48], 1
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jaxdp.train import DpSgdPlan, ghost_analysis, microbatching  # pylint: disable=g-import-not-at-top

  loss_fn, params, batch = _loss(args.model)
  plan = DpSgdPlan(l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=1.0, num_steps=1, num_examples=ROWS)
  clipped = plan.clipped_grad(loss_fn, method="auto")

  def summed(params, key, m):
    take = lambda idx: jax.tree.map(lambda a: a[idx], batch)
    return plan.batch_sum(key, lambda idx, valid: clipped(params, take(idx), valid), num_rows=ROWS,
                          padded_batch_size=m * -(-ROWS // m), microbatch_size=m)[0]

  fns = {m: jax.jit(lambda p, k, m=m: summed(p, k, m)) for m in args.sizes}
  for fn in fns.values():
    jax.block_until_ready(fn(params, jax.random.key(3)))
  times = {m: [] for m in args.sizes}
  for _ in range(args.repeats):
    for m, fn in fns.items():
      start = time.perf_counter()
      jax.block_until_ready(fn(params, jax.random.key(3)))
      times[m].append(time.perf_counter() - start)
  median = {m: statistics.median(t) for m, t in times.items()}
  calls = np.array([[-(-ROWS // m) * m, -(-ROWS // m)] for m in args.sizes], float)
  (row_s, microbatch_s), *_ = np.linalg.lstsq(calls, np.array([median[m] for m in args.sizes]), rcond=None)
  example = jax.tree.map(lambda a: a[:1], batch)
  split = ghost_analysis.ghost_layers(loss_fn, params, example, auto=True)  # what the trainer counts
  per_example = microbatching.per_example_bytes(loss_fn, params, example, without=split.ghost_leaves,
                                                extra=split.norm_bytes)
  print(json.dumps({
      "model": args.model, "rows": ROWS, "seconds": {str(m): round(s, 5) for m, s in median.items()},
      "row_s": row_s, "microbatch_s": microbatch_s, "overhead_rows": microbatch_s / row_s,
      "per_example_bytes": per_example, "overhead_bytes": microbatch_s / row_s * per_example,
      "cpu_count": os.cpu_count(), "backend": jax.default_backend(), "loadavg": os.getloadavg()[0],
      "quick": bool(args.quick),
      "command": "python -m benchmarks.microbatch_overhead" + (" --quick" if args.quick else ""),
  }, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
