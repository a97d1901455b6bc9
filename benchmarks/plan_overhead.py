"""The fixed overhead of one planned call on the 32k-vocabulary transformer; prints JSON.

  python -m benchmarks.plan_overhead [--vocab 32768] [--repeats 3] [--quick]

Model: `jaxdp.models.TransformerClassifier` (vocabulary V = 32,768, width
128, two blocks of 4-head attention, sequence 64, two classes, Adam, the
default clipping `auto`), 4,096 random token rows. Before any candidate
compiles, a call plans its runs (`jaxdp.train.run_plan.plan_runs`: the task
checked on the data's shapes, the clipping analysis, the microbatch's memory
estimate); a dry run (`jaxdp.tuning.dry_run` over two learning rates) plans,
accounts and prints each layer's clipping path. Both only trace the loss on
abstract values: their time is what a call pays before its first
compilation, whatever the data's size.

Printed, in one process: `plan_runs_s` and `dry_run_s`, the median of
`--repeats` timings, each after `jaxdp.clear_caches()` (so nothing planned
before is reused; the first timing, which also warms JAX's own caches, is
dropped); `*_cpu_s`, the same calls' CPU time in this process (tracing is
single-threaded Python: on a machine shared with other work, this is the
wall time it would take alone); `loss_traces`: how many times one
`plan_runs` called the loss (each call is one trace of it); and
`plan_runs_cpu_breakdown_s`: where its CPU time goes (`_STAGES`: the
clipping analysis's forward traces of the loss; the gradient traces, of
`auto`'s working set and of the memory estimate; the model's init; the
optimizer's concreteness; the checks' model on two rows, score and DP step).

`--quick` (V = 512, width 32, sequence 16, one block, one repeat) only checks
that the script still runs; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

EXAMPLES = 4096
BATCH = 32


def _setup(args):
  """(config, data, calls): the transformer's `TrainConfig`, its data, and the loss's call count."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top

  from jaxdp.data import DataSplit, Dataset  # pylint: disable=g-import-not-at-top
  from jaxdp.models import TransformerClassifier  # pylint: disable=g-import-not-at-top
  from jaxdp.train import Task, TrainConfig  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(0)
  tokens = rng.integers(1, args.vocab, size=(EXAMPLES, args.length)).astype(np.int32)
  labels = (rng.random(EXAMPLES) < 0.5).astype(np.int32)
  data = Dataset(name="random tokens", train=DataSplit(tokens, labels),
                 test=DataSplit(tokens[:256], labels[:256]), num_examples=EXAMPLES, num_classes=2)
  calls = [0]

  def cross_entropy(out, batch):
    calls[0] += 1  # runs once per trace of the loss, never on values
    return optax.softmax_cross_entropy_with_integer_labels(out, batch[1])

  model = TransformerClassifier(vocab_size=args.vocab, max_length=args.length, width=args.width,
                                depth=args.depth, num_heads=4)
  task = Task(model=model, loss=cross_entropy, optimizer=lambda hp: optax.adam(hp["learning_rate"]),
              name="transformer")
  config = TrainConfig(task=task, l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=BATCH / EXAMPLES,
                       steps=20, hparams=dict(learning_rate=1e-3))
  return config, data, calls


def _timed(fn, repeats: int) -> tuple:
  """(median wall seconds, median CPU seconds of this process) of `fn()` over `repeats` calls."""
  from jaxdp import clear_caches  # pylint: disable=g-import-not-at-top
  wall, cpu = [], []
  for _ in range(repeats + 1):
    clear_caches()
    start, start_cpu = time.perf_counter(), time.process_time()
    fn()
    wall.append(time.perf_counter() - start)
    cpu.append(time.process_time() - start_cpu)
  return statistics.median(wall[1:]), statistics.median(cpu[1:])  # the first also warms JAX's caches


#: Where one plan_runs spends its CPU time: (label, module, attribute) of the functions timed.
_STAGES = (
    ("analysis_forward_traces", "jaxdp.train.ghost_analysis", ("_discover", "_check_sole_use")),
    ("gradient_traces", "jaxdp.train.microbatching", ("per_example_bytes",)),
    ("model_init", "jaxdp.train.loop_spec", ("_params_once",)),
    ("optimizer_concreteness", "jaxdp.train.task", ("Task.concrete_hparams",)),
    ("check_model_on_two_rows", "jaxdp.train.checks", ("_model_on",)),
    ("check_score", "jaxdp.train.checks", ("_check_score",)),
    ("check_dp_step", "jaxdp.train.checks", ("_check_step",)),
)


def _breakdown(fn, repeats: int) -> dict:
  """CPU seconds per stage of `fn()` (`_STAGES`, median over `repeats` calls after one warm-up);
  functions absent from this version of jaxdp are left out."""
  import importlib  # pylint: disable=g-import-not-at-top
  from jaxdp import clear_caches  # pylint: disable=g-import-not-at-top
  spent: dict = {}
  patched = []

  def timed(label, inner):
    def wrapper(*args, **kwargs):
      start = time.process_time()
      try:
        return inner(*args, **kwargs)
      finally:
        spent[label] = spent.get(label, 0.0) + time.process_time() - start
    return wrapper

  for label, module_name, names in _STAGES:
    for name in names:
      owner = importlib.import_module(module_name)
      *path, attr = name.split(".")
      for part in path:
        owner = getattr(owner, part)
      if hasattr(owner, attr):
        patched.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, timed(label, getattr(owner, attr)))
  runs = []
  try:
    for _ in range(repeats + 1):
      clear_caches()
      spent.clear()
      fn()
      runs.append(dict(spent))
  finally:
    for owner, attr, original in reversed(patched):
      setattr(owner, attr, original)
  return {label: statistics.median(r.get(label, 0.0) for r in runs[1:]) for label, _, _ in _STAGES
          if any(label in r for r in runs)}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--vocab", type=int, default=32768, help="vocabulary size V")
  parser.add_argument("--repeats", type=int, default=3, help="timings per measure (median)")
  parser.add_argument("--quick", action="store_true", help="V=512, width 32, sequence 16, one block")
  args = parser.parse_args(argv)
  args.width, args.depth, args.length = 128, 2, 64
  if args.quick:
    args.vocab, args.width, args.depth, args.length, args.repeats = 512, 32, 1, 16, 1

  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  from jaxdp import clear_caches  # pylint: disable=g-import-not-at-top
  from jaxdp.train.run_plan import plan_runs  # pylint: disable=g-import-not-at-top
  from jaxdp.tuning import dry_run  # pylint: disable=g-import-not-at-top

  config, data, calls = _setup(args)
  plan_s, plan_cpu_s = _timed(lambda: plan_runs([config], data), args.repeats)
  clear_caches()
  calls[0] = 0
  plan_runs([config], data)
  traces = calls[0]
  breakdown = _breakdown(lambda: plan_runs([config], data), args.repeats)
  grid = {"learning_rate": [1e-3, 3e-3]}
  reports = []

  def one_dry_run():
    report = dry_run(config, grid, data, distribution=acc.Poisson(mean=3))
    str(report)  # what a user prints
    reports.append(report)
  dry_s, dry_cpu_s = _timed(one_dry_run, args.repeats)
  print(json.dumps({
      "command": "python -m benchmarks.plan_overhead" + (" --quick" if args.quick else ""),
      "vocab": args.vocab, "width": args.width, "depth": args.depth, "length": args.length,
      "examples": EXAMPLES, "repeats": args.repeats, "plan_runs_s": plan_s, "plan_runs_cpu_s": plan_cpu_s,
      "loss_traces": traces, "plan_runs_cpu_breakdown_s": breakdown, "dry_run_s": dry_s,
      "dry_run_cpu_s": dry_cpu_s, "dry_run_clipping_paths": sum(len(g.clipping) for g in reports[-1].groups),
      "quick": bool(args.quick), "cpu_count": os.cpu_count()}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
