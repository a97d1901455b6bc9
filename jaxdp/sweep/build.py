"""The plan of a tuner's trainable: the one place that tells a `Task`'s search from a training
function's (`jaxdp.sweep.plan`), so that nothing downstream asks.

A tuner's first argument, its trainable, is a `TrainConfig` (with a grid), a
ready `SearchSpace`, or a `jaxdp.sweep.functions.TrainFunction`;
`build_plan` makes its `SearchPlan`, `noise_family` what a calibration reads
before the plan is built (one candidate's event at any noise).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import dp_accounting

from jaxdp import accounting as acc
from jaxdp.data import Dataset
from jaxdp.sweep.functions import FunctionPlan, TrainFunction
from jaxdp.sweep.plan import SearchPlan, one_of
from jaxdp.sweep.space import SearchSpace
from jaxdp.sweep.task_plan import TaskPlan
from jaxdp.train import TrainConfig, checks

Trainable = Union[TrainConfig, SearchSpace, TrainFunction]


def as_space(config: Union[TrainConfig, SearchSpace],
             search_space: Optional[Mapping[str, Sequence]]) -> SearchSpace:
  """The `SearchSpace` of a (base config, grid) pair or a ready space (the grid's values are
  checked by `SearchSpace`, in the tuners' words)."""
  if isinstance(config, SearchSpace):
    if search_space is not None:
      raise ValueError(f"search_space must be None when the trainable is a SearchSpace, got "
                       f"{search_space!r:.200}")
    return config
  if isinstance(config, TrainFunction):  # a caller that reads the Dataset itself
    raise ValueError("config must be a TrainConfig or SearchSpace here: a TrainFunction reads "
                     "its own data, and this needs the Dataset the task trains on")
  if not isinstance(config, TrainConfig):
    raise ValueError(f"the trainable must be a TrainConfig, a SearchSpace or a "
                     f"jaxdp.tuning.TrainFunction, got {type(config).__name__}")
  if not isinstance(search_space, Mapping) or not search_space:
    raise ValueError(f"search_space must be a non-empty mapping name -> values, got "
                     f"{search_space!r:.200}")
  try:
    return SearchSpace(config, search_space)
  except ValueError as err:
    if str(err).startswith("grid["):  # SearchSpace names its argument `grid`
      raise ValueError("search_space" + str(err)[len("grid"):]) from None
    raise


def _check_function_inputs(data: Any, initial_params: Any) -> None:
  if data is not None:
    raise ValueError(f"data must be None when tuning a TrainFunction (it reads its own data), "
                     f"got {type(data).__name__}")
  if initial_params is not None:
    raise ValueError("initial_params must be None when tuning a TrainFunction (it starts from "
                     "whatever it loads itself)")


def build_plan(trainable: Trainable, search_space: Optional[Mapping[str, Sequence]],
               data: Optional[Dataset], *, initial_params: Any = None,
               noise: Optional[float] = None) -> SearchPlan:
  """The complete plan of `trainable` over `search_space` (and `data`).

  Args:
    trainable: a `TrainConfig` (with `search_space`), a `SearchSpace` (`search_space` None), or
      a `TrainFunction` (with `search_space`, its grid; `data` and `initial_params` None).
    search_space, data, initial_params: as the tuners take them.
    noise: None, or the value of `noise_name(trainable)` in every run (a calibrated noise).

  Raises:
    ValueError: any bad argument (see `TaskPlan.build`, `FunctionPlan.build`).
  """
  if isinstance(trainable, TrainFunction):
    _check_function_inputs(data, initial_params)
    return FunctionPlan.build(trainable, search_space, noise=noise, argument="search_space")
  plan = TaskPlan.build(as_space(trainable, search_space), data, initial_params=initial_params)
  return plan if noise is None else plan.with_noise(noise)


@dataclasses.dataclass(frozen=True)
class NoiseFamily:
  """What a target epsilon calibrates, read before the plan is built (`noise_family`).

  Attributes:
    name: the hyperparameter the calibration sets (a task's "noise_multiplier", a
      `TrainFunction`'s `noise_parameter`).
    event_at: noise -> one candidate's event with every run at that noise.
    fixed: the part of a candidate's event no noise changes, where it is known (a task's DP
      score), else None.
    kind: "task" or "function" (which words explain an unreachable target).
  """
  name: str
  event_at: Callable[[float], dp_accounting.DpEvent]
  fixed: Optional[dp_accounting.DpEvent]
  kind: str

  def out_of_reach(self, outer: Callable[[Any], Any], delta: float) -> str:
    """Why no noise meets a target: the part of the search whose cost the noise does not change."""
    if self.kind == "function":
      return (f"The part of dp_event_fn's event that {self.name} does not change (a DP score's, "
              "say) may alone cost more: raise the target, or spend less there")
    if self.fixed is None:
      return ("Every part of this search's event is DP-SGD training, whose cost falls with "
              "sigma: raise the target, or train for fewer steps or at a lower sampling rate")
    fixed = acc.epsilon(outer(self.fixed), delta, "best")
    return (f"Its cost does not depend on the training noise: the DP score "
            f"({acc.describe(self.fixed)}, composed into every candidate and selected over the "
            f"search as the candidates are) alone costs epsilon={acc.format_epsilon(fixed, '.4g')} at this delta. Raise "
            "the score's noise_multiplier, score fewer candidates (a smaller E[K]), or raise the "
            "target; more training noise or fewer steps cannot help")


def noise_family(trainable: Trainable, search_space: Optional[Mapping[str, Sequence]],
                 data: Optional[Dataset]) -> NoiseFamily:
  """What a target epsilon calibrates, after checking what the events depend on (nothing is
  traced or trained).

  Raises:
    ValueError: the trainable has no noise to calibrate (a `TrainFunction` without
      `noise_parameter`), the grid sets it, `dp_event_fn` does not read it, or `data` is not a
      `Dataset` a task can use.
  """
  if isinstance(trainable, TrainFunction):
    name = trainable.noise_parameter
    if name is None:
      raise ValueError("target_epsilon needs TrainFunction(noise_parameter=...): the name of the "
                       "hyperparameter (e.g. 'noise_multiplier') that train_fn and dp_event_fn "
                       "read as the noise to calibrate")
    _check_function_inputs(data, None)

    def event_at(noise: float) -> dp_accounting.DpEvent:
      return one_of([run.dp_event for run in FunctionPlan.build(
          trainable, search_space, noise=noise, argument="search_space").runs])
    if event_at(1.0) == event_at(2.0):
      raise ValueError(f"dp_event_fn gives the same events for {name}=1.0 and {name}=2.0: it "
                       f"does not read noise_parameter={name!r}, so target_epsilon cannot "
                       "calibrate it")
    return NoiseFamily(name, event_at, None, "function")
  space = as_space(trainable, search_space)
  if "noise_multiplier" in space.grid:
    raise ValueError("target_epsilon sets noise_multiplier for the whole search: remove "
                     "'noise_multiplier' from the grid")
  checks.check_data(space.base.task, data)

  def event_at(noise: float) -> dp_accounting.DpEvent:
    calibrated = SearchSpace(space.base.replace(noise_multiplier=float(noise)), space.grid,
                             space.derive)
    return one_of([config.dp_event(data.num_examples) for config in calibrated.configs])
  return NoiseFamily("noise_multiplier", event_at, space.base.task.score_event, "task")
