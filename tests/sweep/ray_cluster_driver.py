"""The driver of `tests/sweep/test_ray_cluster.py`: one durable private search on a Ray cluster.

  python tests/sweep/ray_cluster_driver.py SEARCH --address HOST:PORT --run-dir DIR \
      --task-log FILE --label NAME [--task-delay SECONDS] [--params-out FILE.npz] \
      [--steps T] [--checkpoint-every S]

SEARCH is a cloudpickle file written by the test: the base config, grid, data,
law of K and key seed of a `random_search`, so that this process runs the very
search the test runs locally (`--steps` and `--checkpoint-every` replace the
config's `steps` and its `ExecutionConfig.checkpoint_every`: long candidates
whose workers save checkpoints into `<run-dir>/checkpoints` every S steps;
the cadence is not part of the mechanism, so the local search of the same
config, without run_dir and checkpoints, is the very same search). The search
trains through `RayTrainer(address=..., chunk_size=1)`, one
candidate per Ray task, into the durable pool in `--run-dir`. The test
SIGKILLs this process, or a node under it, and runs it again.

Every Ray task appends a "start" and an "end" line (JSON) to `--task-log`:
`--label`, the node id, the node's name (the JAXDP_RAY_TEST_NODE variable the
test sets when it starts the node; workers inherit it) and the candidate ids,
and an "end" line the step each candidate resumed from (0: it trained from
the start). So the test sees which node trained what, which tasks a killed
node or driver left unfinished, and what a rerun or a retry trained. `--task-delay` makes every task
sleep first, which leaves the test time to kill something mid-search.

Prints one JSON line last on stdout: the release (hyperparameters, score,
epsilon, num_candidates, sha256 of the released parameters' bytes, dtypes and
shapes), `resumed_steps` (candidate id -> the step a retried task resumed it
from: `TunedResult.unreleased.resumed_steps`) and `nodes` (node id -> custom resources,
as `ray.nodes()` sees them after the search). `--params-out` saves the
released parameters' leaves. Its stderr holds the backend's `jaxdp:` lines.
"""

import argparse
import hashlib
import json
import os
import sys
import time

NODE_ENV = "JAXDP_RAY_TEST_NODE"


def _append_line(path: str, entry: dict) -> None:
  # One short write with O_APPEND: lines of concurrent tasks never interleave.
  fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
  try:
    os.write(fd, (json.dumps(entry) + "\n").encode())
  finally:
    os.close(fd)


def _logging_chunk(train_chunk, task_log: str, label: str, delay: float):
  """`train_chunk` (the Ray backend's task body) that logs where it runs and sleeps `delay` first.

  Defined in the driver's __main__, so Ray pickles it by value: the workers need
  nothing but jaxdp.
  """
  def chunk_on_a_node(box, indices):
    import ray  # pylint: disable=g-import-not-at-top
    from jaxdp.sweep import ray_backend  # pylint: disable=g-import-not-at-top
    candidates = ray_backend._shared(box)[0]  # pylint: disable=protected-access
    entry = {"label": label, "node_id": ray.get_runtime_context().get_node_id(),
             "node": os.environ.get(NODE_ENV), "pid": os.getpid(),
             "ids": [candidates[i].id for i in indices]}
    _append_line(task_log, dict(entry, event="start", t=time.time()))
    time.sleep(delay)
    out = train_chunk(box, indices)
    _append_line(task_log, dict(entry, event="end", t=time.time(),
                                resumed=[int(res.resumed_step) for res in out]))
    return out
  return chunk_on_a_node


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("search")
  parser.add_argument("--address", required=True)
  parser.add_argument("--run-dir", required=True)
  parser.add_argument("--task-log", required=True)
  parser.add_argument("--label", required=True)
  parser.add_argument("--task-delay", type=float, default=0.0)
  parser.add_argument("--params-out", default=None)
  parser.add_argument("--steps", type=int, default=None)
  parser.add_argument("--checkpoint-every", type=int, default=None)
  args = parser.parse_args(argv)

  import dataclasses  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import ray  # pylint: disable=g-import-not-at-top
  from ray import cloudpickle  # pylint: disable=g-import-not-at-top

  from jaxdp.sweep import ray_backend  # pylint: disable=g-import-not-at-top
  from jaxdp.tuning import RayTrainer, RunConfig, random_search  # pylint: disable=g-import-not-at-top

  with open(args.search, "rb") as f:
    search = cloudpickle.load(f)
  config = search["config"]
  if args.steps is not None:
    config = dataclasses.replace(config, steps=args.steps)
  if args.checkpoint_every is not None:
    config = dataclasses.replace(config, execution=dataclasses.replace(
        config.execution, checkpoint_every=args.checkpoint_every))
  # The backend builds its Ray task from this module attribute at call time.
  if not callable(getattr(ray_backend, "_train_chunk", None)):
    raise SystemExit("jaxdp.sweep.ray_backend._train_chunk is gone: update the test's driver")
  ray_backend._train_chunk = _logging_chunk(ray_backend._train_chunk, args.task_log, args.label,  # pylint: disable=protected-access
                                            args.task_delay)
  trainer = RayTrainer(address=args.address, chunk_size=1)
  result = random_search(config, search["grid"], search["data"],
                         distribution=search["distribution"], key=jax.random.key(search["key"]),
                         run_config=RunConfig(run_dir=args.run_dir, trainer=trainer))
  leaves = [np.asarray(x) for x in jax.tree.leaves(result.params)]
  if args.params_out:
    np.savez(args.params_out, *leaves)
  nodes = {n["NodeID"]: sorted(r for r in n.get("Resources", {}) if r.endswith("_node"))
           for n in ray.nodes()}
  ray.shutdown()
  print(json.dumps({
      "hyperparameters": result.hyperparameters, "score": result.score, "epsilon": result.epsilon,
      "num_candidates": result.unreleased.num_candidates,
      "params_sha256": hashlib.sha256(b"".join(x.tobytes() for x in leaves)).hexdigest(),
      "params_layout": [[str(x.dtype), list(x.shape)] for x in leaves],
      "resumed_steps": dict(result.unreleased.resumed_steps), "nodes": nodes,
  }))
  return 0


if __name__ == "__main__":
  sys.exit(main())
