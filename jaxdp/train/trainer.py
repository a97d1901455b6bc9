"""One DP-SGD candidate run of any `Task`: `train_candidate` and its result.

`train_candidate` only validates (`jaxdp.train.checks`), compiles the pure
program (`jaxdp.train.program`, cached per static structure), runs, scores
and accounts (`jaxdp.train.config.epsilon`, through `jaxdp.accounting`).

Privacy: every step samples each training example independently with
probability q and processes all of them (see `jaxdp.train.sampling`); the
accounted event is `config.dp_event(N)`, built from the same `DpSgdPlan` that
clips, noises, samples and counts the steps (plus the DP score's event when
the task scores privately). A run that diverges stops early; its reported
epsilon is still that of the planned number of steps, which upper-bounds what
ran (the stopping time depends only on the privatised parameters). The
training set size N is a declared public input (`Dataset.num_examples`),
never read from the rows: every update is divided by the expected batch size
q*N, and an expected `batch_size` b means q = b/N, whatever number of rows
the data holds (docs/guides/privacy.md). A config with
noise_multiplier = 0 is not private at all (epsilon = inf) and warns with
`NotPrivateWarning` when it is built.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validate
from jaxdp.data import Dataset
from jaxdp.train import padding
from jaxdp.train.config import EPSILON_METHOD, TrainConfig
from jaxdp.train.program import LoopOutput, compile_cached, compiled, empty_state, output
from jaxdp.train.loop_spec import traced_hparams
from jaxdp.train.run_plan import RunPlan, plan_runs
from jaxdp.train.task import Task

PyTree = Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class CandidateResult:
  """Outcome of one candidate run.

  Attributes:
    score: the selection score (the task's public score on `data.test`, or
      its DP score on `data.private_validation`), NaN if the run diverged.
    test_score: the task's public score on `data.test` (NaN if diverged or
      there is no test split).
    test_loss: mean loss on `data.test` (NaN likewise).
    steps: DP steps actually run.
    planned_steps: DP steps configured (what epsilon accounts for).
    epsilon: epsilon at `delta` of the planned run (and its DP score; inf if
      sigma = 0), accounted by `jaxdp.accounting` with `epsilon_method`.
    epsilon_method: the accounting method behind `epsilon` ("rdp": one
      candidate; a whole search is accounted by `TunedResult.epsilon`).
    delta: target delta.
    diverged: True if the parameters became non-finite or the score did.
    wall_time_s: wall-clock seconds for the whole call, compilation included.
    compile_time_s: seconds of that spent compiling its program (0.0 when
      it was compiled before; in a batched run, its group's compilation).
    score_source: 'public test split (not accounted)' or 'private validation
      split (DP score, accounted)'.
    resumed_step: the step its training resumed at, the stop of the segment
      that saved its checkpoint (`ExecutionConfig.checkpoint_every`); 0 when
      it trained from step 0.
    params: final parameters (not in repr).
  """
  score: float
  test_score: float
  test_loss: float
  steps: int
  planned_steps: int
  epsilon: float
  delta: float
  diverged: bool
  wall_time_s: float
  score_source: str = ""
  compile_time_s: float = 0.0
  epsilon_method: str = EPSILON_METHOD
  resumed_step: int = 0
  params: PyTree = dataclasses.field(repr=False, default=None)


PUBLIC_SOURCE = "public test split (not accounted)"
PRIVATE_SOURCE = "private validation split (DP score, accounted)"


def score_source(task: Task) -> str:
  return PRIVATE_SOURCE if task.private_score else PUBLIC_SOURCE


def device_splits(data: Dataset, task: Task) -> tuple:
  """(train, test, private validation) as JAX arrays (None stays None), the private splits
  padded to their public capacities (`padding.host_splits`)."""
  def put(tree):
    return None if tree is None else jax.tree.map(jnp.asarray, tree)
  return tuple(put(split) for split in padding.host_splits(data, task))


def result_of(run: RunPlan, out: LoopOutput, score, test_score, test_loss, wall_time_s: float,
              params: PyTree = None, compile_time_s: float = 0.0,
              resumed_step: int = 0) -> CandidateResult:
  """The `CandidateResult` of one finished run of `run` (a diverged run scores NaN)."""
  score, test_score, test_loss = float(score), float(test_score), float(test_loss)
  diverged = not (bool(out.finite) and math.isfinite(score))
  if diverged:
    score = test_score = test_loss = float("nan")
  return CandidateResult(
      score=score, test_score=test_score, test_loss=test_loss, steps=int(out.steps),
      planned_steps=run.spec.num_steps, epsilon=run.epsilon,
      delta=float(run.config.target_delta), diverged=diverged, wall_time_s=wall_time_s,
      score_source=score_source(run.config.task), compile_time_s=compile_time_s,
      resumed_step=int(resumed_step), params=params)


def train_candidate(config: TrainConfig, data: Dataset, key: jax.Array, *,
                    initial_params: PyTree | None = None) -> CandidateResult:
  """Trains one candidate with DP and scores it.

  Args:
    config: the candidate's configuration (task, privacy, hyperparameters).
    data: a `jaxdp.data.Dataset`: private `train`; the score reads the public
      `test` split, or, for a DP score, `private_validation`.
    key: PRNG key; the same key gives the same result.
    initial_params: optional starting parameters: all of the model's (a
      model released by a private search: Koskela & Kulkarni 2023 warm-start
      the final run from the tuned model) or some of them (public pretrained
      weights of a backbone; the rest, e.g. a new head or LoRA adapters, is
      initialised as usual), as a nested mapping with the model's paths and
      shapes (`jaxdp.train.checks.check_initial_params`). None (default):
      the usual random initialisation. The key is split exactly as without
      it, so the DP noise and batches are the same.

  Returns:
    The `CandidateResult`.  A diverging run returns score NaN; it never raises.

  Raises:
    ValueError: for a bad config/data type, a key that is not a PRNG key, or a
      task that does not fit the data (model, loss, score; see `check_task`).
  """
  start = time.perf_counter()
  if not isinstance(config, TrainConfig):
    raise ValueError(f"config must be a TrainConfig, got {type(config).__name__}")
  key = _validate.prng_key("key", key)
  (run,) = plan_runs([config], data, initial_params=initial_params)
  return run_planned(run, data, key, start=start)


def run_planned(run: RunPlan, data: Dataset, key: jax.Array, *,
                start: Optional[float] = None) -> CandidateResult:
  """Trains the planned `run` on `data` (the data it was planned on, or rows of the same
  structure: `RunPlan.on_rows`) with `key`; nothing is checked again."""
  start = time.perf_counter() if start is None else start
  segment = compiled(run.spec).segment
  train, test, validation = device_splits(data, run.config.task)
  # The program every run executes (the engine's too), here in one segment from step 0.
  args = (run.dp_plan, traced_hparams(run.spec, run.config), key, train, test, validation, run.initial,
          empty_state(run.spec, data.train, key_dtype=key.dtype), np.bool_(True),
          np.int32(run.spec.num_steps))
  executable, compile_s = compile_cached(segment, args, persist=padding.persistable(run.config.task))
  state, (score, test_score, test_loss) = executable(*args)
  out = output(state)
  return result_of(run, out, score, test_score, test_loss, time.perf_counter() - start,
                   params=out.params, compile_time_s=compile_s)
