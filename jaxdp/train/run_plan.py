"""What one configuration runs on one data set, derived and checked once.

A `RunPlan` is built by `plan_runs` at a call's entry (`train_candidate`, or a
search's `jaxdp.sweep.SearchPlan`) and read by everything below it: the
`LoopSpec` the compiled program is built from, the parameter structure, the
checked public start, the `DpSgdPlan` the device receives and the DpEvent
that is accounted, all from the same configuration. Nothing below the entry
derives a spec or checks the data again.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional, Sequence

import dp_accounting
import jax

from jaxdp.data import Dataset
from jaxdp.train import checks
from jaxdp.train.config import TrainConfig, epsilon
from jaxdp.train.plan import DpSgdPlan
from jaxdp.train.program import param_shapes
from jaxdp.train.loop_spec import LoopSpec, ProgramTraces, abstract, clipping_paths, program_traces

PyTree = Any


@dataclasses.dataclass(frozen=True, eq=False)
class RunPlan:
  """One configuration's run on one data set.

  Attributes:
    config: the `TrainConfig`.
    spec: its `LoopSpec` on the data (equal specs share one compiled program).
    params: the model's parameters as `jax.ShapeDtypeStruct`s.
    initial: None, or the public start shaped like `params` (None where a
      leaf is initialised from the key; `checks.check_initial_params`).
    num_examples: N, the declared training set size.
    example: one training example, abstract (what `clipping` traces).
    traces: the program's `loop_spec.ProgramTraces` on the data's structure (the clipping
      analysis `clipping` reads), traced once when the plan was made.
  """
  config: TrainConfig
  spec: LoopSpec
  params: PyTree
  initial: PyTree
  num_examples: int
  example: PyTree = dataclasses.field(repr=False)
  traces: Optional[ProgramTraces] = dataclasses.field(default=None, repr=False)

  @functools.cached_property
  def treedef(self):
    return jax.tree.structure(self.params)

  @functools.cached_property
  def dp_plan(self) -> DpSgdPlan:
    """The `DpSgdPlan` the device receives (sigma rounded up to float32)."""
    return self.config.plan(self.num_examples).for_device()

  @functools.cached_property
  def dp_event(self) -> dp_accounting.DpEvent:
    """The accounted event: the training's and, for a DP score, the score's."""
    return self.config.dp_event(self.num_examples)

  @functools.cached_property
  def epsilon(self) -> float:
    """One candidate's epsilon at `config.target_delta` (`jaxdp.train.config.epsilon`)."""
    return epsilon(self.config, self.num_examples)

  @functools.cached_property
  def clipping(self) -> tuple:
    """(parameter path, 'ghost', 'per-example' or 'frozen', why) per parameter (from the
    plan's traces: only a dry run prints it)."""
    return clipping_paths(self.spec, self.example, self.traces)

  def with_noise(self, config: TrainConfig) -> "RunPlan":
    """This run with `config`, which differs from `self.config` in its noise multiplier only
    (a calibrated sigma): sigma is a traced input, so the program and everything checked stay.

    Raises:
      ValueError: `config` differs in anything else.
    """
    differ = [f.name for f in dataclasses.fields(TrainConfig) if f.name != "noise_multiplier"
              and getattr(config, f.name) != getattr(self.config, f.name)]
    if differ:
      raise ValueError(f"with_noise takes a configuration that differs in noise_multiplier only; "
                       f"this one differs in {differ}")
    return dataclasses.replace(self, config=config)

  def derive(self, config: TrainConfig, data: Dataset, *, initial: PyTree = None,
             analyses: Optional[dict] = None) -> "RunPlan":
    """The run of `config` (this run's, or another configuration of its task: an extrapolated
    final run) on `data`, which has the structure of the data this run was checked on (other
    rows: a Poisson subset) and starts from `initial` (None: the key).

    The padding is sized for `data`'s rows. The program is checked again only if it is
    another one (another static value, e.g. an extrapolated learning rate that is static).
    `analyses`: as in `LoopSpec.from_config` (runs derived together share their traces).
    """
    analyses = {} if analyses is None else analyses
    spec = LoopSpec.from_config(config, data, analyses=analyses)
    params, traces = self.params, self.traces
    if _program(spec) != _program(self.spec):
      traces = program_traces(spec.task, spec.static_hparams, data.train, analyses)
      checks.check_program(spec, data, traces)
      params = _params(spec, data, traces)
      if initial is not None:  # another model may not take this start
        initial = checks.check_initial_params(initial, params)
    return dataclasses.replace(self, config=config, spec=spec, params=params, initial=initial,
                               num_examples=data.num_examples, traces=traces)


def _params(spec: LoopSpec, data: Dataset, traces: ProgramTraces) -> PyTree:
  """The parameters' shapes: the traces' (`param_shapes`' very trace), or traced now."""
  return param_shapes(spec, data.train) if traces.params is None else traces.params


def _program(spec: LoopSpec) -> tuple:
  """What decides the program's code and shapes, not its padding or step count."""
  return (id(spec.task), spec.static_hparams, spec.traced_names, spec.train_structure)


def plan_runs(configs: Sequence[TrainConfig], data: Dataset, *,
              initial_params: Optional[PyTree] = None) -> tuple:
  """One `RunPlan` per configuration (repeats share one), after checking everything once.

  The data is checked once per task (`checks.check_data`), each distinct
  program once on the data's shapes (`checks.check_program`), and
  `initial_params` once against each distinct model.

  Raises:
    ValueError: `data` is not a `Dataset` the tasks can train and score on,
      a configuration does not fit it, or `initial_params` does not fit a
      model; before anything compiles or trains.
  """
  if not configs:  # e.g. a pool opened to read or lock, with nothing to train
    return ()
  for task in {id(c.task): c.task for c in configs}.values():
    checks.check_data(task, data)
  example = abstract(data.train, rows=1)
  by_config: dict = {}
  by_spec: dict = {}
  analyses: dict = {}  # shared by the configurations of one program: traced once
  out = []
  for config in configs:
    if id(config) not in by_config:
      spec = LoopSpec.from_config(config, data, analyses=analyses)
      if spec not in by_spec:
        traces = program_traces(spec.task, spec.static_hparams, data.train, analyses)
        checks.check_program(spec, data, traces)
        params = _params(spec, data, traces)
        initial = (None if initial_params is None
                   else checks.check_initial_params(initial_params, params))
        by_spec[spec] = (params, initial, traces)
      params, initial, traces = by_spec[spec]
      by_config[id(config)] = RunPlan(config=config, spec=spec, params=params, initial=initial,
                                      num_examples=data.num_examples, example=example, traces=traces)
    out.append(by_config[id(config)])
  return tuple(out)
