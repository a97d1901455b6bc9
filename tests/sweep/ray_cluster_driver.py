"""The driver of `tests/sweep/test_ray_cluster.py`: one durable private search on a Ray cluster.

  python tests/sweep/ray_cluster_driver.py SEARCH --address HOST:PORT --run-dir DIR \
      --task-log FILE --label NAME [--task-delay SECONDS] [--params-out FILE.npz]

SEARCH is a cloudpickle file written by the test: the base config, grid, data,
law of K and key seed of a `random_search`, so that this process runs the very
search the test runs locally. The search trains through
`train_candidates_ray(address=..., chunk_size=1)`, one candidate per Ray task,
into the durable pool in `--run-dir`. The test SIGKILLs this process, or a node
under it, and runs it again.

Every Ray task appends a "start" and an "end" line (JSON) to `--task-log`:
`--label`, the node id, the node's name (the JAXDP_RAY_TEST_NODE variable the
test sets when it starts the node; workers inherit it) and the candidate ids.
So the test sees which node trained what, which tasks a killed node or driver
left unfinished, and what a rerun trained. `--task-delay` makes every task
sleep first, which leaves the test time to kill something mid-search.

Prints one JSON line last on stdout: the release (hyperparameters, score,
epsilon, num_candidates, sha256 of the released parameters' bytes, dtypes and
shapes) and `nodes` (node id -> custom resources, as `ray.nodes()` sees them
after the search). `--params-out` saves the released parameters' leaves.
"""

import argparse
import functools
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
    _append_line(task_log, dict(entry, event="end", t=time.time()))
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
  args = parser.parse_args(argv)

  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import ray  # pylint: disable=g-import-not-at-top
  from ray import cloudpickle  # pylint: disable=g-import-not-at-top

  from jaxdp.sweep import ray_backend  # pylint: disable=g-import-not-at-top
  from jaxdp.tuning import random_search  # pylint: disable=g-import-not-at-top

  with open(args.search, "rb") as f:
    search = cloudpickle.load(f)
  # The backend builds its Ray task from this module attribute at call time.
  if not callable(getattr(ray_backend, "_train_chunk", None)):
    raise SystemExit("jaxdp.sweep.ray_backend._train_chunk is gone: update the test's driver")
  ray_backend._train_chunk = _logging_chunk(ray_backend._train_chunk, args.task_log, args.label,  # pylint: disable=protected-access
                                            args.task_delay)
  trainer = functools.partial(ray_backend.train_candidates_ray, address=args.address, chunk_size=1)
  result = random_search(search["config"], search["grid"], search["data"],
                         repetitions=search["repetitions"], key=jax.random.key(search["key"]),
                         run_dir=args.run_dir, trainer=trainer)
  leaves = [np.asarray(x) for x in jax.tree.leaves(result.params)]
  if args.params_out:
    np.savez(args.params_out, *leaves)
  nodes = {n["NodeID"]: sorted(r for r in n.get("Resources", {}) if r.endswith("_node"))
           for n in ray.nodes()}
  ray.shutdown()
  print(json.dumps({
      "hyperparameters": result.hyperparameters, "score": result.score, "epsilon": result.epsilon,
      "num_candidates": result.num_candidates,
      "params_sha256": hashlib.sha256(b"".join(x.tobytes() for x in leaves)).hexdigest(),
      "params_layout": [[str(x.dtype), list(x.shape)] for x in leaves],
      "nodes": nodes,
  }))
  return 0


if __name__ == "__main__":
  sys.exit(main())
