"""The driver of `tests/sweep/test_checkpoints.py`'s kill tests: one durable search with checkpoints.

  python tests/sweep/checkpoint_driver.py --run-dir DIR [--steps T] [--every S]
      [--kill-after-saves N] [--per-device P]

Runs `random_search` on the digits data (a DP logistic regression of T steps,
`ExecutionConfig(checkpoint_every=S)`, the grid and key below) into the
durable `--run-dir`. With `--kill-after-saves N` the process SIGKILLs itself
right after its N-th checkpoint is complete on disk: a kill in the middle of
a candidate, with other candidates of its chunk at any point of their own
saves. Without it, the test may SIGKILL it from outside at any moment.

Every call of the compiled program (`jaxdp.train.program.run_segment`) is
counted: the rows' step counters before and after, by candidate (each row's PRNG key names
its candidate). So the test sees how many steps each candidate trained in this
process, measured on the state the program returns, not on what the tuner
reports.

Prints one JSON line last on stdout: the release (hyperparameters, score,
epsilon, num_candidates, sha256 of the released parameters), `resumed`,
`resumed_steps` and `trained_steps` (candidate id -> steps run here).
"""

import argparse
import hashlib
import json
import os
import signal
import sys

GRID = {"learning_rate": [0.3, 1.0, 3.0]}
KEY = 4
MEAN_K = 4


def search_config(steps: int, every: int):
  from jaxdp.train import ExecutionConfig, TrainConfig, presets  # pylint: disable=g-import-not-at-top
  return TrainConfig(task=presets.classifier(10), l2_clip_norm=1.0, noise_multiplier=1.0,
                     sampling_prob=0.05, steps=steps, hparams=dict(learning_rate=1.0, model="logreg"),
                     execution=ExecutionConfig(checkpoint_every=every))


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--run-dir", required=True)
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--every", type=int, default=40)
  parser.add_argument("--kill-after-saves", type=int, default=None)
  parser.add_argument("--per-device", type=int, default=None)
  args = parser.parse_args(argv)

  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  from jaxdp.data import load_dataset  # pylint: disable=g-import-not-at-top
  from jaxdp.sweep import checkpoints, engine  # pylint: disable=g-import-not-at-top
  from jaxdp.sweep import SearchSpace  # pylint: disable=g-import-not-at-top
  from jaxdp.tuning import LocalTrainer, RunConfig, random_search  # pylint: disable=g-import-not-at-top
  from jaxdp.tuning.draws import draw_search  # pylint: disable=g-import-not-at-top

  config = search_config(args.steps, args.every)
  key = jax.random.key(KEY)
  cands = draw_search(SearchSpace(config, GRID), acc.Poisson(mean=MEAN_K), key)
  by_key = {tuple(np.asarray(jax.random.key_data(c.key())).tolist()): c.id for c in cands}
  trained: dict = {}

  compiled_chunk = engine._compiled_chunk  # pylint: disable=protected-access

  def counting_chunk(*chunk_args, **chunk_kwargs):
    executable, seconds = compiled_chunk(*chunk_args, **chunk_kwargs)

    def run(*args):
      keys, state, fresh = args[2], args[7], np.asarray(args[8])
      before = np.where(fresh, 0, np.asarray(state.step))  # a fresh row starts at step 0
      out = executable(*args)
      after = np.asarray(out[0].step)
      rows = {tuple(k): j for j, k in enumerate(np.asarray(jax.random.key_data(keys)).tolist())}
      for k, j in rows.items():  # a chunk's padding copies share their candidate's key
        cid = by_key[k]
        trained[cid] = trained.get(cid, 0) + int(after[j] - before[j])
      return out
    return run, seconds

  engine._compiled_chunk = counting_chunk  # pylint: disable=protected-access

  if args.kill_after_saves is not None:
    save = checkpoints.Checkpoints.save
    saves = []

    def save_then_die(self, candidate_id, identity, step, state):
      save(self, candidate_id, identity, step, state)
      saves.append(step)
      if len(saves) >= args.kill_after_saves:
        self.wait()  # the N-th checkpoint is complete on disk
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    checkpoints.Checkpoints.save = save_then_die

  result = random_search(config, GRID, load_dataset("digits"), distribution=acc.Poisson(mean=MEAN_K),
                         key=key, run_config=RunConfig(run_dir=args.run_dir,
                                                       trainer=LocalTrainer(max_candidates_per_device=args.per_device, progress=True)))
  leaves = [np.asarray(x) for x in jax.tree.leaves(result.params)]
  print(json.dumps({
      "hyperparameters": result.hyperparameters, "score": result.score, "epsilon": result.epsilon,
      "num_candidates": result.unreleased.num_candidates, "ids": [c.id for c in cands],
      "params_sha256": hashlib.sha256(b"".join(x.tobytes() for x in leaves)).hexdigest(),
      "resumed": result.unreleased.resumed, "resumed_steps": result.unreleased.resumed_steps, "trained_steps": trained,
  }))
  return 0


if __name__ == "__main__":
  sys.exit(main())
