"""What a search plan is: the protocol every plan implements, whatever trains its candidates.

A search's entry builds one plan from its arguments (`jaxdp.sweep.build.build_plan`,
a calibrated noise included) before anything is drawn: every argument checked
once, and every grid point given what it runs and its DpEvent. Two
implementations:

  - `jaxdp.sweep.task_plan.TaskPlan`: a jaxdp `Task` trained by the batched
    engine (each point's `RunPlan`: its compiled program's spec, parameter
    structure, DP-SGD plan and DpEvent);
  - `jaxdp.sweep.functions.FunctionPlan`: any DP training function, called
    once per candidate (each point's hyperparameters and the DpEvent its
    `dp_event_fn` gives).

Everything downstream (the draws, the durable store, the trainers, the tuners,
the dry run) reads a plan through this protocol and never asks which kind it
holds, as dp_accounting's code reads any `PrivacyAccountant`. Like
jax_privacy's `DPExecutionPlan`, a plan is complete when built and says what
runs, so what is accounted is derived from the very objects that run; what a
tuner accounts for the whole search (its event, epsilon) is the tuner's, not
the plan's.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping, Optional, Protocol, Sequence, runtime_checkable

import dp_accounting

from jaxdp import accounting as acc
from jaxdp.sweep.space import Candidate


@runtime_checkable
class SearchPlan(Protocol):
  """What a search runs, checked once (see the module docstring).

  Attributes:
    points: the grid points, in the grid's order (distinct).
    configs: what a `Candidate` at each point carries as its configuration (a
      `TrainConfig`, or a training function's run), in the same order.
    runs: each point's run; every run has its `dp_event`.
    score_source: where the candidates' scores come from, and whether that is accounted.
    checkpointed: whether its candidates checkpoint in a durable store's run directory.
  """

  points: tuple
  configs: tuple
  runs: tuple
  checkpointed: ClassVar[bool]

  @property
  def score_source(self) -> str: ...

  def __len__(self) -> int: ...

  def run_of(self, config: Any) -> Any:
    """The run of `config` (one of `configs`); ValueError for another."""

  def check_candidates(self, candidates: Sequence[Candidate]) -> None:
    """ValueError unless every candidate is one of the plan's points with its configuration."""

  def check_result(self, candidate: Candidate, result: Any) -> None:
    """ValueError unless `result` is one a trainer of this plan makes, for `candidate` as far
    as the result shows it (what the store asks of every result a trainer reports)."""

  def release(self, candidate: Optional[Candidate], result: Any) -> dict:
    """What a search releases of its selected `candidate` and its `result` (None, None: the
    data-independent default): {"hyperparameters", "config", "params", "score_source"}."""

  def unreleased(self, candidate: Optional[Candidate], result: Any) -> dict:
    """What a search keeps of them but does not release (`jaxdp.tuning.Unreleased` fields)."""

  def summary(self) -> dict:
    """What a dry run reports of the plan beyond its accounting (`jaxdp.tuning.DryRun`'s
    fields: `groups`, `steps`, `gradients` per candidate, `function`, `auto_static`)."""

  def record(self, candidate: Candidate, result: Any) -> tuple:
    """(the pool record of a trained candidate, the arrays stored with it)."""

  def result(self, candidate: Candidate, record: Mapping[str, Any], leaves: Any) -> Any:
    """The result a pool record (and its arrays, None when not read) stands for."""

  def mechanism(self, points: Optional[Sequence[Mapping[str, Any]]] = None) -> dict:
    """What the candidates at `points` (default: every point) compute and what is accounted:
    {part: {point key: str}} for the parts of `jaxdp.sweep.space.MECHANISM_PARTS`."""

  def fingerprint(self, **fields: Any) -> dict:
    """`fields` plus what the candidates read besides their configurations (their data)."""

  def search_fields(self, tuner: str, key: Any, **accounted: Any) -> dict:
    """What a tuner's search is: a run directory made for any other is refused."""


def candidate_event(plan: SearchPlan) -> dp_accounting.DpEvent:
  """One candidate's guarantee from the runs the plan will run: its DpEvent, or the worst over
  the grid when runs differ (`acc.UniformCandidates`, Koskela & Kulkarni 2023, Lemma 1: which
  one runs depends on the draws)."""
  return one_of([run.dp_event for run in plan.runs])


def one_of(events: Sequence[dp_accounting.DpEvent]) -> dp_accounting.DpEvent:
  """The event of a candidate drawn uniformly among runs with `events`: the event itself when
  they are all one, else `acc.UniformCandidates` over the distinct ones."""
  distinct: list = []
  for event in events:
    if event not in distinct:
      distinct.append(event)
  return distinct[0] if len(distinct) == 1 else acc.UniformCandidates(distinct)
