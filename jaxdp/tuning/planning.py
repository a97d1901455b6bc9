"""Before any training: a search's plan, its noise for a target epsilon, its accounting, and a
dry run.

Every tuner accounts a candidate as the DpEvent of the runs its plan runs
(`jaxdp.sweep.plan.candidate_event`: a task's configurations, built from the
same `DpSgdPlan` the trainer uses with the DP score's event composed in, or a
training function's `dp_event_fn`); a grid whose candidates differ in privacy
is accounted as `UniformCandidates` over their events (Koskela & Kulkarni
2023, Lemma 1), since which one runs depends on the draws. The plan says what
runs; the search's event and epsilon are the tuner's (`Accounting`).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Callable, Mapping, Optional, Sequence

from jaxdp import accounting as acc
from jaxdp.accounting import inverse
from jaxdp.data import Dataset
from jaxdp.sweep.build import Trainable, build_plan, noise_family
from jaxdp.sweep.plan import SearchPlan, candidate_event
from jaxdp.sweep.task_plan import Group
from jaxdp.train.config import NotPrivateWarning
from jaxdp.tuning import probe as probe_lib

#: The largest noise a calibration tries.
SIGMA_MAX = 1e3


@dataclasses.dataclass(frozen=True)
class Accounting:
  """What a tuner accounts for its whole search, from the plan that runs (never from a target).

  Attributes:
    event: the search's DpEvent (its candidates' inside the selection's).
    epsilon: its epsilon at `delta` ("best": the tightest valid method).
    delta: the target delta.
    noise_multiplier: the noise calibrated for a target epsilon, or None.
  """
  event: Any
  epsilon: float
  delta: float
  noise_multiplier: Optional[float] = None


def prepare(trainable: Trainable, search_space: Optional[Mapping[str, Sequence]],
            data: Optional[Dataset], *, outer: Callable[[Any], Any], target_delta: float,
            target_epsilon: Optional[float], initial_params: Any = None) -> tuple:
  """(plan, `Accounting`) of a search, before anything is drawn or trained: every argument
  checked once, the noise calibrated if asked, the whole search accounted.

  Args:
    trainable, search_space, data, initial_params: as the tuners take them.
    outer: candidate event -> the search's event (e.g. `acc.RepeatAndSelect(_, K)`).
    target_delta: delta in (0, 1).
    target_epsilon: None, or the epsilon the calibrated search must meet.

  Raises:
    ValueError: a bad argument, an event no method accounts, or an unreachable target.
  """
  noise = None
  if target_epsilon is not None:
    noise = calibrate(trainable, search_space, data, outer, target_epsilon=target_epsilon,
                      delta=target_delta)
  plan = build_plan(trainable, search_space, data, initial_params=initial_params, noise=noise)
  return plan, account(plan, outer, target_delta, target_epsilon, noise)


def account(plan: SearchPlan, outer: Callable[[Any], Any], delta: float,
            target_epsilon: Optional[float] = None, noise: Optional[float] = None) -> Accounting:
  """The whole search's event and epsilon, from the runs that will run: never from the target,
  which it must meet. Warns (`NotPrivateWarning`) when epsilon is infinite."""
  event = outer(candidate_event(plan))
  try:
    epsilon = acc.epsilon(event, delta, method="best")
  except (ArithmeticError, TypeError) as err:  # e.g. LaplaceDpEvent(0.0), a string noise
    raise ValueError(f"the search's events cannot be accounted ({type(err).__name__}: {err}): "
                     f"{acc.describe(event):.300}") from err
  if target_epsilon is not None and epsilon > target_epsilon:
    raise ValueError(f"the calibrated search accounts to epsilon={epsilon!r} > "
                     f"target_epsilon={target_epsilon!r}; nothing was trained")
  if math.isinf(epsilon):
    warnings.warn(f"this search is not differentially private: its event "
                  f"({acc.describe(event):.200}) accounts to epsilon = inf", NotPrivateWarning,
                  stacklevel=4)
  return Accounting(event=event, epsilon=float(epsilon), delta=float(delta),
                    noise_multiplier=None if noise is None else float(noise))


def calibrate(trainable: Trainable, search_space, data, outer: Callable[[Any], Any], *,
              target_epsilon: float, delta: float) -> float:
  """Smallest noise (within 0.1%) for which the whole search meets (target_epsilon, delta): a
  task's noise multiplier, a `TrainFunction`'s `noise_parameter` through its `dp_event_fn`.

  Raises:
    ValueError: there is no noise to calibrate (see `jaxdp.sweep.build.noise_family`), or no
      noise <= `SIGMA_MAX` meets the target (naming what costs it).
  """
  family = noise_family(trainable, search_space, data)

  def make_event(noise):
    return outer(family.event_at(noise))
  try:
    return inverse.noise_for(make_event, target_epsilon, delta, sigma_max=SIGMA_MAX,
                             where=" for this search")
  except ValueError as err:
    if "out of reach" not in str(err):
      raise
  at_max = acc.epsilon(make_event(SIGMA_MAX), delta, "best")
  raise ValueError(
      f"target_epsilon={target_epsilon!r} is out of reach for this search: even "
      f"{family.name}={SIGMA_MAX!r} does not meet it at delta={delta!r} (the largest "
      f"{family.name} tried; it gives epsilon={acc.format_epsilon(at_max, '.4g')}). {family.out_of_reach(outer, delta)}")


def k_quantile(distribution: acc.KDistribution, p: float) -> int:
  """Smallest k with P(K <= k) >= p."""
  hi = 1
  while float(distribution.sf(hi)) > 1.0 - p:
    hi *= 2
  lo = -1
  while hi - lo > 1:
    mid = (lo + hi) // 2
    lo, hi = (lo, mid) if float(distribution.sf(mid)) <= 1.0 - p else (mid, hi)
  return hi


@dataclasses.dataclass(frozen=True)
class DryRun:
  """What a private random search would do, computed without training.

  `print` it (`str`): a summary first (the accounting, K's law, the score, the
  expected compute and time, then one block per compiled group: its
  hyperparameters and shapes, its trainable and frozen parameters, what
  `initial_params` holds, and how many leaves take each clipping path);
  `format(verbose=True)` adds every parameter's clipping path and why.

  Attributes:
    epsilon: epsilon of the whole search at `delta` ("best").
    delta: delta.
    event: the accounted event.
    distribution: K's law.
    expected_candidates: E[K].
    prob_zero: P(K = 0) (nothing released).
    k_quantiles: (median, 90%, 99%) of K.
    noise_multiplier: the calibrated noise when `target_epsilon` was given, else None.
    groups: a task's compiled groups (`jaxdp.sweep.task_plan.Group`); empty for a function.
    expected_steps: E[K] x mean over the grid of DP steps (None for a function).
    expected_gradient_evaluations: E[K] x mean over the grid of steps x q N (None likewise).
    score_source: where the score is computed and whether it is accounted.
    auto_static: hyperparameter -> why it was made static (see `Group`).
    function: for a search over a training function, its name (module.qualname): jaxdp does
      not see inside it.
    timings: with `probe=True`, one `jaxdp.tuning.probe.GroupTiming` per group; else empty.
    expected_seconds: with `probe=True`, (compilation, DP steps): the search's expected wall
      time under K's law (`jaxdp.tuning.probe.expected_seconds`); None otherwise, or when a
      group's steps could not be timed.
  """
  epsilon: float
  delta: float
  event: Any
  distribution: acc.KDistribution
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
  timings: tuple = ()
  expected_seconds: Optional[tuple] = None

  def __str__(self) -> str:
    return self.format()

  def format(self, verbose: bool = False) -> str:
    """The report: the summary, then (`verbose`) each parameter's clipping path and why."""
    sigma = "" if self.noise_multiplier is None else f", calibrated sigma={self.noise_multiplier:.4f}"
    lines = [
        f"private random search: epsilon={acc.format_epsilon(self.epsilon)} at delta={acc.format_delta(self.delta)}"
        f"{sigma}",
        f"K ~ {self.distribution}: E[K]={self.expected_candidates:g}, P(K=0)={self.prob_zero:.3g}, "
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
        _time_line(self), f"{len(self.groups)} compiled group(s):",
    ]
    lines[-1:-1] = [f"static automatically: {name!r} ({why}): one compilation per value"
                    for name, why in self.auto_static.items()]
    lines += [f"  compiled separately: {why}" for why in _why_separate(self.groups)]
    for i, g in enumerate(self.groups):
      lines += _group_lines(i, g, self.timings[i] if self.timings else None, len(self.groups))
    if verbose:
      for i, g in enumerate(self.groups):
        lines.append(f"clipping path of each parameter{_group_name(i, len(self.groups))}:")
        lines += [f"    clipping {param}: {path} ({why})" for param, path, why in g.clipping]
    return "\n".join(lines)


def _time_line(report: DryRun) -> str:
  """The expected wall time, or how to measure it: never a number nothing measured."""
  if report.expected_seconds is None:
    if report.timings:
      return "time: not estimated: a group's probe became non-finite before any step was timed"
    return ("time: not measured: dry_run(..., probe=True) compiles each group and times a few "
            "DP steps")
  compile_s, steps_s = report.expected_seconds
  return (f"time: about {_duration(compile_s + steps_s)} expected = compilation "
          f"{_duration(compile_s)} + DP steps {_duration(steps_s)} (probed; "
          f"E[K]={report.expected_candidates:g} from K's law, one candidate at a time on one "
          "device, scoring not included)")


def _duration(seconds: float) -> str:
  if seconds < 1.0:
    return f"{seconds * 1e3:.3g} ms"
  if seconds < 120.0:
    return f"{seconds:.3g} s"
  return f"{seconds / 60:.3g} min" if seconds < 7200.0 else f"{seconds / 3600:.3g} h"


def _group_name(i: int, n: int) -> str:
  return f" (group {i + 1})" if n > 1 else ""


def _group_lines(i: int, g: Group, timing, n: int) -> list:
  """A compiled group's summary: shapes, parameters, public start, clipping paths by kind."""
  head = "  " + (f"group {i + 1}: " if n > 1 else "")
  lines = [f"{head}{g.grid_points} grid point(s), static {dict(g.static)}, traced "
           f"{list(g.traced)}, q={g.sampling_prob:.4g}, steps={g.steps}, "
           f"padded batch={g.padded_batch_size}, microbatch={g.microbatch_size}"]
  if g.parameters is not None:
    c = g.parameters
    lines.append(f"    parameters: {c.trainable_scalars:,} trainable in {c.trainable_leaves} "
                 f"leaves, {c.frozen_scalars:,} frozen in {c.frozen_leaves} leaves")
  if g.initial is not None:
    lines.append(f"    initial_params: {_coverage(g.initial)}")
  kinds = {"ghost": "ghost norms", "per-example": "per-example gradients", "frozen": "frozen"}
  found = [path for _, path, _ in g.clipping]
  if found:
    lines.append("    clipping: " + "; ".join(f"{label}: {found.count(kind)} leaves"
                                                for kind, label in kinds.items() if kind in found))
  if timing is not None:
    step = ("no step timed (non-finite)" if timing.step_s is None else
            f"{_duration(timing.step_s)} per DP step ({timing.steps_timed} timed)")
    lines.append(f"    probe: compiled in {_duration(timing.compile_s)}, {step}")
  return lines


def _coverage(c) -> str:
  """What `initial_params` holds, by top-level module."""
  if not c.given:
    what = "none (every parameter initialised from the key)"
  elif c.given == c.total:
    what = f"all {c.total} leaves"
  else:
    parts = [f"{word} of {', '.join(names)}" for word, names in
             (("all", c.whole), ("some", c.some), ("none", c.none)) if names]
    what = f"{c.given} of {c.total} leaves: {'; '.join(parts)}"
  if c.frozen_from_key:
    what += (f"; {c.frozen_from_key} frozen leaves are not in it: they stay at their random "
             "initialisation")
  return what


def _why_separate(groups: Sequence) -> list:
  """What tells the compiled groups apart, and why each such hyperparameter is static."""
  if len(groups) < 2:
    return []
  reasons = dict(kv for g in groups for kv in g.static_reasons)
  names = sorted({name for g in groups for name in g.static})
  varying = [n for n in names if len({repr(g.static.get(n)) for g in groups}) > 1]
  out = [f"one program per value of {n!r}: {reasons[n]}" for n in varying if n in reasons]
  for field, what in (("steps", "number of DP steps"), ("padded_batch_size", "padded batch size"),
                      ("microbatch_size", "microbatch size")):
    if len({getattr(g, field) for g in groups}) > 1:
      out.append(f"one program per {what} (the loop's shapes and trip count are compiled in)")
  return out


def dry_run_report(plan: SearchPlan, accounting: Accounting, distribution: acc.KDistribution,
                   timings: Sequence = ()) -> DryRun:
  """The `DryRun` of a tuner's plan and accounting (`timings`: its groups' probes, if any)."""
  mean_k = float(distribution.mean)
  summary = plan.summary()
  return DryRun(
      epsilon=accounting.epsilon, delta=accounting.delta, event=accounting.event,
      distribution=distribution, expected_candidates=mean_k, prob_zero=distribution.prob_zero,
      k_quantiles=tuple(k_quantile(distribution, p) for p in (0.5, 0.9, 0.99)),
      noise_multiplier=accounting.noise_multiplier, groups=summary["groups"],
      expected_steps=None if summary["steps"] is None else mean_k * summary["steps"],
      expected_gradient_evaluations=(None if summary["gradients"] is None
                                     else mean_k * summary["gradients"]),
      score_source=plan.score_source, auto_static=summary["auto_static"],
      function=summary["function"], timings=tuple(timings),
      expected_seconds=probe_lib.expected_seconds(summary["groups"], timings, distribution))


__all__ = ["Accounting", "DryRun", "Group", "account", "calibrate", "dry_run_report", "prepare"]
