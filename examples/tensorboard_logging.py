"""Following a private search in TensorBoard, logging only what the search may show.

  pip install -e '.[tensorboard]'        # tensorboardX: writes TensorBoard's files, no TensorFlow
  python -m examples.tensorboard_logging --logdir runs/search
  tensorboard --logdir runs/search       # (the viewer is `pip install tensorboard`)

Two TensorBoard runs, because they may go to different people:

  - `<logdir>/release`: written once, when the search ends. It holds the
    search's guarantee (epsilon, delta, the accounted event) and its release
    (the selected hyperparameters and score, `result.to_json()`): what
    epsilon covers, so it may be published.
  - `<logdir>/progress`: for your own eyes, like the terminal's progress bar.
    At the start, the guarantee, which is fixed before anything trains
    (`dry_run`). Then the share of candidates done, at 25, 50, 75 and 100 %
    only, with the time elapsed. The same four values are logged whatever K
    is: no count of candidates. Their wall times say something about K,
    though, as any timing does (README, "Privacy assumptions": timing is not
    covered), so do not publish this run.

Never logged unless you opt in (`--log-all-scores`): each candidate's score.
Epsilon covers the selected candidate only; the other scores, and how many
there are (K), are the mechanism's internal randomness (see
docs/guides/logging.md). With the flag, every candidate's grid point and
score go to the progress run, beside the epsilon that does cover them, which
is that of publishing the whole transcript of K runs:
`acc.epsilon(acc.SelectionWithCount(result.event), delta)`, much larger.

The search is examples/dp_logistic_regression.py's: DP-SGD logistic
regression in plain NumPy, its noise calibrated for the whole search.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from typing import Any, Callable, Optional, Sequence

import jax
import tensorboardX

from examples import dp_logistic_regression as lr
from jaxdp import accounting as acc
from jaxdp.tuning import dry_run, LocalTrainer, random_search, RunConfig, TrainFunction

#: The shares of candidates done that are logged, and only these: every K logs all four.
MILESTONES = (0.25, 0.5, 0.75, 1.0)


@dataclasses.dataclass(frozen=True)
class MilestoneTrainer:
  """A trainer (`jaxdp.sweep.trainers.Trainer`) that reports the share of candidates done at
  fixed milestones, never a count: `report(share)` once per milestone, in order (the caller
  times them from one start of its own, so a search that trains nothing, K = 0, is timed alike).

  It wraps another trainer and counts the candidates of each chunk as it ends (the chunk's
  results never leave this object).
  """

  report: Callable[[float], None]
  inner: Any = dataclasses.field(default_factory=LocalTrainer)

  def check(self, plan) -> None:
    self.inner.check(plan)

  def __call__(self, candidates: Sequence, plan, *, keep_params: bool = True,
               search_size: Optional[int] = None, on_chunk=None, checkpoint_dir=None) -> list:
    done, reached = [0], [0]

    def count(chunk):
      if on_chunk is not None:
        on_chunk(chunk)  # the durable store's: it writes the chunk first
      done[0] += len(chunk)
      while reached[0] < len(MILESTONES) and done[0] >= MILESTONES[reached[0]] * len(candidates):
        self.report(MILESTONES[reached[0]])
        reached[0] += 1

    return self.inner(candidates, plan, keep_params=keep_params, search_size=search_size,
                      on_chunk=count, checkpoint_dir=checkpoint_dir)


def _log_all_scores(writer, result) -> None:
  """Opt-in: every candidate's score, and the epsilon that covers publishing them."""
  covering = acc.epsilon(acc.SelectionWithCount(result.event), result.delta)
  writer.add_scalar("privacy/epsilon_covering_all_scores", covering, 0)
  for i, (point, score) in enumerate(result.unreleased.all_scores):
    writer.add_scalar("unreleased/candidate_score", score, i)
    writer.add_text("unreleased/candidate_hyperparameters", json.dumps(point), i)


def run(logdir: str, *, mean_candidates: float = 8.0, target_epsilon: float = 2.0,
        delta: float = 1e-5, seed: int = 0, log_all_scores: bool = False):
  """The search, logged to `logdir`/progress and `logdir`/release; returns its result."""
  search = dict(distribution=acc.Poisson(mean=mean_candidates), target_delta=delta,
                target_epsilon=target_epsilon)
  function = TrainFunction(lr.train_fn, lr.dp_event, noise_parameter="noise_multiplier")
  plan = dry_run(function, lr.GRID, **search)  # the guarantee, before anything trains
  with tensorboardX.SummaryWriter(os.path.join(logdir, "progress")) as progress:
    progress.add_scalar("privacy/epsilon", plan.epsilon, 0)
    progress.add_scalar("privacy/delta", plan.delta, 0)

    began, reached = time.monotonic(), []

    def report(share):  # every milestone timed from this one start, whatever K
      reached.append(share)
      progress.add_scalar("progress/share_done", share, len(reached))
      progress.add_scalar("progress/elapsed_seconds", time.monotonic() - began, len(reached))

    result = random_search(function, lr.GRID, key=jax.random.key(seed),
                           run_config=RunConfig(trainer=MilestoneTrainer(report)), **search)
    for share in MILESTONES[len(reached):]:  # K = 0 trains nothing: its log must look the same
      report(share)
    if log_all_scores:
      _log_all_scores(progress, result)
  # Opened only now: nothing in this run dates the search's start.
  with tensorboardX.SummaryWriter(os.path.join(logdir, "release")) as release:
    release.add_scalar("privacy/epsilon", result.epsilon, 0)
    release.add_scalar("privacy/delta", result.delta, 0)
    if result.hyperparameters is not None:
      release.add_scalar("release/score", result.score, 0)
    release.add_text("release", json.dumps(result.to_json(), indent=1), 0)
  return result


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--logdir", required=True, help="TensorBoard's log directory")
  parser.add_argument("--mean-candidates", type=float, default=8.0, help="E[K] (Poisson)")
  parser.add_argument("--target-epsilon", type=float, default=2.0, help="epsilon of the search")
  parser.add_argument("--seed", type=int, default=0,
                      help="the search's key (default 0; in real use a secret, random one)")
  parser.add_argument("--log-all-scores", action="store_true",
                      help="also log every candidate's score (NOT covered by the search's "
                           "epsilon; logs the epsilon that covers them)")
  args = parser.parse_args(argv)
  result = run(args.logdir, mean_candidates=args.mean_candidates,
               target_epsilon=args.target_epsilon, seed=args.seed,
               log_all_scores=args.log_all_scores)
  print(f"epsilon = {acc.format_epsilon(result.epsilon)}; logged to {args.logdir}/release (publishable) and "
        f"{args.logdir}/progress (yours only)")
  if args.log_all_scores:
    covering = acc.epsilon(acc.SelectionWithCount(result.event), result.delta)
    print(f"every candidate's score logged to {args.logdir}/progress: covered by epsilon = "
          f"{acc.format_epsilon(covering)}, not {acc.format_epsilon(result.epsilon)}")
  return result


if __name__ == "__main__":
  main()
