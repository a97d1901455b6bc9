"""A dry run's time estimate: each compiled group compiled and a few of its DP steps timed, on
public stand-in data (`dry_run(..., probe=True)`).

**What is measured.** For each group, the program a lone candidate runs
(`jaxdp.train.program.run_segment`, what `train_candidate` runs and what the
sweep engine runs with one candidate per device) is compiled (`compile_s`:
compiled now, or read from JAX's persistent compilation cache when it is on
and holds it) and run from a fresh start for one step, then on for a few more
steps, which are timed (`step_s`, seconds per DP step; `steps_timed`). Scoring
is not timed. The search compiles its own programs again (the engine's, for
its devices and the data's rows), which take about as long as the probe's:
the probe's compilation is a measurement, not a head start.

**What it reads.** Only public inputs: the group's configuration, the
declared N (the stand-in training set has N rows: the private row count, a
secret under add/remove neighbours, never shapes what is timed), and the
public test split (its rows repeated to N rows stand in for the training
set; zeros where it has another structure). The private training and
validation splits are never read, not even their row counts (a private
validation split is stood in for by one row of zeros): the numbers printed
depend on no private value. A probe's
parameters and noise are discarded; only its wall time is kept.

**What it estimates.** K is secret, so the estimate uses K's public law only::

  compilation = sum over groups of P(a candidate is drawn from the group) x its compile_s,
      with P = 1 - E[(1 - w)^K] = 1 - pgf(1 - w), w the group's share of the grid points;
  DP steps    = E[K] x sum over groups of w x steps x step_s.

It assumes one candidate at a time on one device (more devices, or candidates
vmapped on an accelerator, run faster) and no scoring or checkpoint time.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Optional, Sequence

import jax
import numpy as np

from jaxdp import accounting as acc
from jaxdp.data import Dataset
from jaxdp.train import program
from jaxdp.train.loop_spec import structure, traced_hparams
from jaxdp.train.run_plan import RunPlan

#: Stop timing steps once this many seconds of them were timed (or the plan's steps run out).
TIMED_SECONDS = 0.3
#: At least this many DP steps timed per group (when the plan has them): one is noisy.
MIN_TIMED_STEPS = 3
#: At most this many DP steps timed per group.
MAX_TIMED_STEPS = 64


@dataclasses.dataclass(frozen=True)
class GroupTiming:
  """One compiled group's probe.

  Attributes:
    compile_s: seconds to compile its program (a read when the persistent cache held it).
    step_s: seconds per DP step (one candidate, one device); None when no step could be
      timed (the stand-in run became non-finite at once).
    steps_timed: DP steps timed (with a one-step plan: the one step and the initialisation).
  """
  compile_s: float
  step_s: Optional[float]
  steps_timed: int


def stand_in(data: Dataset) -> tuple:
  """(train, test, validation) for the program from public values only: the test split's rows
  repeated to the declared N rows (zeros when it has another structure), the public test split
  itself, and one row of zeros shaped like a private validation example (its row count is
  private too; the probe never scores, so only the program's shapes need it)."""
  rows = max(int(data.num_examples), 1)
  public = data.test
  if public is None or structure(public) != structure(data.train) or not _rows(public):
    train = jax.tree.map(lambda x: np.zeros((rows,) + np.shape(x)[1:], np.asarray(x).dtype),
                         data.train)
  else:
    index = np.arange(rows) % _rows(public)
    train = jax.tree.map(lambda x: np.asarray(x)[index], public)

  validation = data.private_validation
  if validation is not None:
    validation = jax.tree.map(lambda x: np.zeros((1,) + np.shape(x)[1:], np.asarray(x).dtype),
                              validation)
  return train, data.test, validation


def _rows(tree) -> int:
  return int(np.shape(jax.tree.leaves(tree)[0])[0])


def probe_run(run: RunPlan, splits: tuple, key: jax.Array) -> GroupTiming:
  """Compiles `run`'s program for `splits` (`stand_in`) and times a few of its DP steps.

  `key`: the probe's PRNG key (its noise and batches are discarded; only its implementation
  matters, which changes the cost of a step)."""
  train, test, validation = (None if s is None else jax.device_put(s) for s in splits)
  spec = run.spec
  args = [run.dp_plan, traced_hparams(spec, run.config), key, train, test, validation, run.initial,
          program.empty_state(spec, train, key_dtype=key.dtype), np.bool_(True), np.int32(1)]
  executable, compile_s = program.compile_cached(program.compiled(spec).segment, tuple(args))
  start = time.perf_counter()
  state, _ = jax.block_until_ready(executable(*args))
  first_s = time.perf_counter() - start
  if spec.num_steps <= 1:  # nothing left to time apart from the start
    return GroupTiming(compile_s, first_s if int(state.step) == 1 else None, int(state.step))
  timed, seconds, more = 0, 0.0, 1
  while ((seconds < TIMED_SECONDS or timed < MIN_TIMED_STEPS) and timed < MAX_TIMED_STEPS
         and int(state.step) < spec.num_steps - 1):
    stop = min(int(state.step) + more, spec.num_steps - 1)  # never the last: no scoring
    args[7:] = [state, np.bool_(False), np.int32(stop)]
    start = time.perf_counter()
    after, _ = jax.block_until_ready(executable(*args))
    ran = int(after.step) - int(state.step)
    if ran < stop - int(state.step):  # non-finite: the loop stopped early
      break
    timed, seconds, state, more = timed + ran, seconds + time.perf_counter() - start, after, more * 2
  return GroupTiming(compile_s, seconds / timed if timed else None, timed)


def probe(runs: Sequence[RunPlan], data: Dataset, key: jax.Array) -> tuple:
  """One `GroupTiming` per run (a compiled group's), in order."""
  splits = stand_in(data)
  return tuple(probe_run(run, splits, key) for run in runs)


def expected_seconds(groups: Sequence, timings: Sequence[GroupTiming],
                     distribution: acc.KDistribution) -> Optional[tuple]:
  """(expected compilation seconds, expected DP-step seconds) of the search under K's law (see
  the module docstring), or None when a group's steps could not be timed."""
  if not timings or any(t.step_s is None for t in timings):
    return None
  total = sum(g.grid_points for g in groups)
  compile_s = sum((1.0 - float(distribution.pgf(1.0 - g.grid_points / total))) * t.compile_s
                  for g, t in zip(groups, timings))
  steps_s = float(distribution.mean) * sum(g.grid_points / total * g.steps * t.step_s
                                           for g, t in zip(groups, timings))
  return compile_s, steps_s
