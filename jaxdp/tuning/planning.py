"""Before any training: the search's DpEvent, noise for a target epsilon, and a dry run.

Every tuner accounts a candidate as the DpEvent of the configurations that
run (`TrainConfig.dp_event`, built from the same `DpSgdPlan` the trainer
uses, with the DP score's event composed in); a grid whose candidates differ
in privacy is accounted as `UniformCandidates` over their events (Koskela &
Kulkarni 2023, Lemma 1), since which one runs depends on the draws.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional

import dp_accounting
import numpy as np

from jaxdp import _validate
from jaxdp import accounting as acc
from jaxdp.accounting import inverse
from jaxdp.sweep.functions import FunctionPlan
from jaxdp.sweep.identity import function_name
from jaxdp.sweep.plan import SearchPlan
from jaxdp.sweep.space import SearchSpace
from jaxdp.train.trainer import score_source

#: The largest noise multiplier `calibrate_noise` tries.
SIGMA_MAX = 1e3
#: Where a training function's score comes from: the caller's contract (README, "Tune any trainer").
FUNCTION_SCORE_SOURCE = ("returned by train_fn (public data, or DP with its event inside dp_event: "
                         "the caller's contract, not checked)")


def candidate_event(space: SearchSpace, num_examples: int) -> dp_accounting.DpEvent:
  """One candidate's guarantee: its DpEvent, or the worst over the grid (KK Lemma 1)."""
  events = space.events(num_examples)
  return events[0] if len(events) == 1 else acc.UniformCandidates(events)


def plan_event(plan: Any) -> dp_accounting.DpEvent:
  """One candidate's guarantee from the runs the plan will run: its DpEvent, or the worst over
  the grid (KK Lemma 1)."""
  events = []
  for run in plan.runs:
    if run.dp_event not in events:
      events.append(run.dp_event)
  return events[0] if len(events) == 1 else acc.UniformCandidates(events)


def with_noise(space: SearchSpace, sigma: float) -> SearchSpace:
  """`space` with every candidate's noise multiplier set to `sigma`."""
  return SearchSpace(space.base.replace(noise_multiplier=float(sigma)), space.grid, space.derive)


def calibrate_noise(space: SearchSpace, num_examples: int, outer: Callable[[Any], Any], *,
                    target_epsilon: float, delta: float) -> float:
  """Smallest sigma (within 0.1%) for which the whole search meets (target_epsilon, delta).

  Args:
    space: the search space; its grid must not vary `noise_multiplier`.
    num_examples: N (public).
    outer: candidate event -> the search's event (e.g. RepeatAndSelect with K's law).
    target_epsilon: the budget of the whole search, > 0.
    delta: in (0, 1).

  Returns:
    sigma; the search with it re-accounts to at most `target_epsilon` ("best").

  Raises:
    ValueError: the grid varies sigma, or no sigma <= 1e3 meets the target
      (e.g. a DP score alone already spends more).
  """
  target_epsilon = _validate.real("target_epsilon", target_epsilon, low=0.0, low_open=True)
  if "noise_multiplier" in space.grid:
    raise ValueError("target_epsilon sets noise_multiplier for the whole search: remove "
                     "'noise_multiplier' from the grid")

  def make_event(sigma):
    return outer(candidate_event(with_noise(space, sigma), num_examples))

  return _noise_for(make_event, target_epsilon, delta,
                    lambda: _out_of_reach(space, make_event, outer, target_epsilon, delta))


def _noise_for(make_event, target_epsilon: float, delta: float, why: Callable[[], str]) -> float:
  """`inverse.noise_for` up to `SIGMA_MAX`, its out-of-reach error told by `why()`."""
  try:
    return inverse.noise_for(make_event, target_epsilon, delta, sigma_max=SIGMA_MAX,
                             where=" for this search")
  except ValueError as err:
    if "out of reach" not in str(err):
      raise
    raise ValueError(why()) from None


def _out_of_reach(space: SearchSpace, make_event, outer, target_epsilon: float, delta: float) -> str:
  """Why no sigma meets the target: the parts whose cost sigma does not change, with their epsilon."""
  at_max = acc.epsilon(make_event(SIGMA_MAX), delta, "best")
  head = (f"target_epsilon={target_epsilon!r} is out of reach for this search: even "
          f"noise_multiplier={SIGMA_MAX!r} does not meet it at delta={delta!r} (the largest sigma "
          f"tried; it gives epsilon={at_max:.4g}).")
  score = space.base.task.score_event
  if score is None:
    return (f"{head} Every part of this search's event is DP-SGD training, whose cost falls with "
            "sigma: raise the target, or train for fewer steps or at a lower sampling rate")
  fixed = acc.epsilon(outer(score), delta, "best")
  return (f"{head} Its cost does not depend on the training noise: the DP score "
          f"({acc.describe(score)}, composed into every candidate and selected over the search as "
          f"the candidates are) alone costs epsilon={fixed:.4g} at this delta. Raise the score's "
          "noise_multiplier, score fewer candidates (a smaller E[K]), or raise the target; more "
          "training noise or fewer steps cannot help")


def calibrate_function_noise(train_fn, grid, event_fn, name: str, outer: Callable[[Any], Any], *,
                             target_epsilon: float, delta: float) -> float:
  """Smallest value (within 0.1%) of the hyperparameter `name` for which the whole search over
  a training function meets (target_epsilon, delta), through `event_fn` (as `calibrate_noise`
  for a task's noise multiplier).

  Raises:
    ValueError: the grid sets `name`, `event_fn` does not depend on it, or no value <= 1e3
      meets the target.
  """
  def make_event(sigma):
    plan = FunctionPlan.build(train_fn, grid, event_fn, noise=(name, float(sigma)),
                              argument="search_space")
    return outer(plan_event(plan))

  if make_event(1.0) == make_event(2.0):
    raise ValueError(f"dp_event gives the same events for {name}=1.0 and {name}=2.0: it does not "
                     f"read noise_parameter={name!r}, so target_epsilon cannot calibrate it")

  def why() -> str:
    at_max = acc.epsilon(make_event(SIGMA_MAX), delta, "best")
    return (f"target_epsilon={target_epsilon!r} is out of reach for this search: even "
            f"{name}={SIGMA_MAX!r} (the largest value tried) gives epsilon={at_max:.4g} at "
            f"delta={delta!r}. The part of dp_event's event that {name} does not change (a DP "
            "score's, say) may alone cost more: raise the target, or spend less there")

  return _noise_for(make_event, target_epsilon, delta, why)


def k_quantile(repetitions: acc.KDistribution, p: float) -> int:
  """Smallest k with P(K <= k) >= p."""
  hi = 1
  while float(repetitions.sf(hi)) > 1.0 - p:
    hi *= 2
  lo = -1
  while hi - lo > 1:
    mid = (lo + hi) // 2
    lo, hi = (lo, mid) if float(repetitions.sf(mid)) <= 1.0 - p else (mid, hi)
  return hi


@dataclasses.dataclass(frozen=True)
class Group:
  """Candidates that share one compiled program.

  Attributes:
    static: the static hyperparameters.
    traced: names vmapped within the group.
    grid_points: how many grid points fall in it.
    sampling_prob: q.
    steps: DP steps per candidate.
    padded_batch_size: rows per step on the common path.
    auto_static: (name, why) of each float made static because the optimizer
      factory needs its value (`jaxdp.train.Task.concrete_hparams`).
    clipping: (parameter path, 'ghost', 'per-example' or 'frozen', why) for
      every parameter: the path `Task.clipping` and `Task.trainable` give it.
    microbatch_size: rows per per-example-gradient call.
  """
  static: Mapping[str, Any]
  traced: tuple
  grid_points: int
  sampling_prob: float
  steps: int
  padded_batch_size: int
  auto_static: tuple = ()
  clipping: tuple = ()
  microbatch_size: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class DryRun:
  """What a private random search would do, computed without training.

  Attributes:
    epsilon: epsilon of the whole search at `delta` ("best").
    delta: delta.
    event: the accounted event.
    repetitions: K's law.
    expected_candidates: E[K].
    prob_zero: P(K = 0) (nothing released).
    k_quantiles: (median, 90%, 99%) of K.
    noise_multiplier: the calibrated sigma when `target_epsilon` was given,
      else None.
    groups: the compiled groups (`Group`).
    expected_steps: E[K] x mean over the grid of DP steps.
    expected_gradient_evaluations: E[K] x mean over the grid of steps x q N.
    score_source: where the score is computed and whether it is accounted.
    auto_static: hyperparameter -> why it was made static (see `Group`).
    function: for a search over a training function, its name (module.qualname);
      then `groups` is empty and the expected compute None (jaxdp does not see
      inside the function).
  """
  epsilon: float
  delta: float
  event: Any
  repetitions: acc.KDistribution
  expected_candidates: float
  prob_zero: float
  k_quantiles: tuple
  noise_multiplier: Optional[float]
  groups: tuple
  expected_steps: Optional[float]
  expected_gradient_evaluations: Optional[float]
  score_source: str
  auto_static: Mapping[str, str] = dataclasses.field(default_factory=dict)
  function: Optional[str] = None

  def __str__(self) -> str:
    sigma = "" if self.noise_multiplier is None else f", calibrated sigma={self.noise_multiplier:.4f}"
    lines = [
        f"private random search: epsilon={self.epsilon:.4f} at delta={self.delta:g}{sigma}",
        f"K ~ {self.repetitions}: E[K]={self.expected_candidates:g}, P(K=0)={self.prob_zero:.3g}, "
        f"median/90%/99% = {'/'.join(str(k) for k in self.k_quantiles)}",
        f"score: {self.score_source}",
    ]
    if self.function is not None:
      lines.append(f"each candidate is one call of train_fn {self.function}: "
                   f"E[calls]={self.expected_candidates:g}")
      return "\n".join(lines)
    lines += [
        f"compute: E[DP steps]={self.expected_steps:,.0f}, "
        f"E[per-example gradients]={self.expected_gradient_evaluations:,.0f}",
        f"{len(self.groups)} compiled group(s):",
    ]
    lines[-1:-1] = [f"static automatically: {name!r} ({why}): one compilation per value"
                    for name, why in self.auto_static.items()]
    for g in self.groups:
      lines.append(f"  {g.grid_points} grid point(s), static {dict(g.static)}, traced "
                   f"{list(g.traced)}, q={g.sampling_prob:.4g}, steps={g.steps}, "
                   f"padded batch={g.padded_batch_size}, microbatch={g.microbatch_size}")
      lines += [f"    clipping {param}: {path} ({why})" for param, path, why in g.clipping]
    return "\n".join(lines)


def groups_of(plan: SearchPlan) -> tuple:
  """The compiled groups of a plan, in first-seen order."""
  runs: dict = {}
  for run in plan.runs:
    runs.setdefault(run.spec, []).append(run)
  return tuple(Group(static=dict(s.static_hparams), traced=s.traced_names, grid_points=len(rs),
                     sampling_prob=s.sampling_prob, steps=s.num_steps,
                     padded_batch_size=s.padded_batch_size, auto_static=s.auto_static,
                     clipping=rs[0].clipping, microbatch_size=s.microbatch_size)
               for s, rs in runs.items())


def plan_score_source(plan: SearchPlan) -> str:
  """Where the candidates' scores come from (every run's task: a `derive` may change it)."""
  return " / ".join(dict.fromkeys(score_source(run.config.task) for run in plan.runs))


def auto_static(plan: SearchPlan) -> dict:
  """Hyperparameter -> why it is static without being declared so, over the whole grid."""
  return {name: why for run in plan.runs for name, why in run.spec.auto_static}


def dry_run_report(plan: Any, repetitions: acc.KDistribution) -> DryRun:
  """The `DryRun` of a tuner's plan (`plan.event`, `plan.epsilon` set)."""
  mean_k = float(repetitions.mean)
  common = dict(epsilon=plan.epsilon, delta=plan.delta, event=plan.event, repetitions=repetitions,
                expected_candidates=mean_k, prob_zero=repetitions.prob_zero,
                k_quantiles=tuple(k_quantile(repetitions, p) for p in (0.5, 0.9, 0.99)),
                noise_multiplier=plan.noise_multiplier)
  if isinstance(plan, FunctionPlan):
    return DryRun(**common, groups=(), expected_steps=None, expected_gradient_evaluations=None,
                  score_source=FUNCTION_SCORE_SOURCE, function=function_name(plan.train_fn))
  n = plan.data.num_examples
  steps = np.array([run.spec.num_steps for run in plan.runs], float)
  grads = np.array([run.spec.num_steps * run.spec.sampling_prob * n for run in plan.runs])
  return DryRun(
      **common, groups=groups_of(plan),
      expected_steps=mean_k * float(steps.mean()),
      expected_gradient_evaluations=mean_k * float(grads.mean()),
      score_source=plan_score_source(plan), auto_static=auto_static(plan))
