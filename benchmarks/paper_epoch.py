"""One epoch of the paper profile's candidate, and what the whole profile would take; prints JSON.

The paper profile of `jaxdp.experiments.fig7` (Papernot & Steinke's MNIST
setting) trains a pool of 10 learning rates x 5 seeds = 50 candidates of the
all-convolutional CNN (`papernot_steinke_cnn`, tanh), each 60 epochs at batch
256 (q = 256/60000, 14,063 DP steps), then simulates the searches on that
pool. This script trains one candidate of that configuration for one epoch
(ceil(1 / q) = 235 DP steps, the library's default clipping and microbatch)
on MNIST-sized random data (60,000 x 28 x 28 x 1, 10 classes: the speed of a
step does not depend on the pixels, and TFDS data cannot be downloaded on
every machine), through `train_candidate`, on the default device.

  python -m benchmarks.paper_epoch [--quick]

`epoch_seconds` is a second, warm run (the first compiles: `compile_seconds`);
`paper_profile_hours` = 50 candidates x 60 epochs x `epoch_seconds`, the
training time of `make reproduce-fig7 PROFILE=paper` one candidate at a time
(the sweep engine runs several candidates per device at once on an
accelerator, so this is an upper estimate there). `--quick` (1,024 examples
of 8 x 8, 2 steps) only checks that the script runs; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

PAPER_CANDIDATES, PAPER_EPOCHS = 50, 60  # fig7's paper profile: 10 learning rates x 5 seeds, 60 epochs


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--examples", type=int, default=60000, help="training set size N")
  parser.add_argument("--image-size", type=int, default=28)
  parser.add_argument("--quick", action="store_true", help="smoke run: --examples 1024 --image-size 8, 2 steps")
  args = parser.parse_args(argv)
  if args.quick:
    args.examples, args.image_size = 1024, 8

  import jax  # pylint: disable=g-import-not-at-top

  from benchmarks._data import mnist_sized  # pylint: disable=g-import-not-at-top
  from jaxdp.experiments import fig7  # pylint: disable=g-import-not-at-top
  from jaxdp.train import LoopSpec, train_candidate  # pylint: disable=g-import-not-at-top

  shape = (args.image_size, args.image_size, 1)
  data = mnist_sized(args.examples, args.image_size)
  profile = fig7.PROFILES["paper"]
  config = fig7.base_config(profile, args.examples)
  steps = 2 if args.quick else math.ceil(args.examples / profile.batch_size)  # one epoch
  config = config.replace(epochs=None, steps=steps)
  spec = LoopSpec.from_config(config, data)

  runs = []
  for seed in (0, 1):  # the first compiles the program, the second reuses it
    t0 = time.perf_counter()
    result = train_candidate(config, data, jax.random.key(seed))
    jax.block_until_ready(result.params)
    runs.append((time.perf_counter() - t0, result))
  (_, first), (epoch_seconds, _) = runs
  device = jax.devices()[0]
  print(json.dumps({
      "model": profile.model, "batch_size": profile.batch_size, "examples": args.examples,
      "input_shape": list(shape), "steps": steps, "microbatch_size": spec.microbatch_size,
      "clipping": config.task.clipping, "compile_seconds": round(first.compile_time_s, 3),
      "epoch_seconds": round(epoch_seconds, 3),
      "examples_per_s": round(steps * profile.batch_size / epoch_seconds, 1),
      "paper_profile_hours": round(PAPER_CANDIDATES * PAPER_EPOCHS * epoch_seconds / 3600, 2),
      "paper_profile": f"{PAPER_CANDIDATES} candidates x {PAPER_EPOCHS} epochs, one at a time",
      "backend": jax.default_backend(), "device_kind": device.device_kind, "devices": len(jax.devices()),
      "cpu_count": os.cpu_count(), "jax_version": jax.__version__, "quick": bool(args.quick),
  }, indent=2))
  return 0


if __name__ == "__main__":
  sys.exit(main())
