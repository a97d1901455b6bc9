"""`TaskPlan`: a search of a jaxdp `Task`, planned once at its call and passed down to the
compiled step (`jaxdp.sweep.plan.SearchPlan`'s implementation for tasks).

Its entry (a tuner, `run_sweep`, `train_candidates` given a `Dataset`) builds
one `TaskPlan`: the data is checked once, every distinct program once on the
data's shapes, `initial_params` once against each model, and every
configuration gets its `RunPlan` (its `LoopSpec`, parameter structure,
`DpSgdPlan` and DpEvent). The engine, the Ray trainer, the durable store, the
dry run and the run directory's fingerprint read the plan; none of them
derives a spec or checks an argument again.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from typing import Any, ClassVar, Mapping, Optional, Sequence

import jax
import numpy as np

import jaxdp
from jaxdp.data import Dataset
from jaxdp.sweep.pool import DATA_KEY, INITIAL_KEY
from jaxdp.sweep.records import (data_fingerprint, event_record, params_digest, record_of,
                                 result_from_record)
from jaxdp.sweep.space import (MECHANISM_PARTS, Candidate, SearchSpace, config_record, key_digest,
                               point_key)
from jaxdp.train import digest as digest_lib
from jaxdp.train import trainable as trainable_lib
from jaxdp.train.config import TrainConfig
from jaxdp.train.loop_spec import LoopSpec
from jaxdp.train.run_plan import RunPlan, plan_runs
from jaxdp.train.trainer import CandidateResult, score_source


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
    static_reasons: (name, why) of each static hyperparameter that is not in
      `auto_static`: the model factory reads it, the task declares it, or it is not a float.
    parameters: the model's trainable and frozen parameters
      (`jaxdp.train.trainable.Counts`), None when not planned.
    initial: what `initial_params` holds of them (`jaxdp.train.trainable.Coverage`),
      None when not planned.
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
  static_reasons: tuple = ()
  parameters: Optional[trainable_lib.Counts] = None
  initial: Optional[trainable_lib.Coverage] = None


def _group(spec: LoopSpec, runs: Sequence[RunPlan]) -> Group:
  """The `Group` of the runs that share `spec`."""
  run = runs[0]
  leaf_mask = spec.task.trainable_mask(run.params)
  return Group(static=dict(spec.static_hparams), traced=spec.traced_names, grid_points=len(runs),
               sampling_prob=spec.sampling_prob, steps=spec.num_steps,
               padded_batch_size=spec.padded_batch_size, auto_static=spec.auto_static,
               clipping=run.clipping, microbatch_size=spec.microbatch_size,
               static_reasons=_static_reasons(spec, run.config.hparams),
               parameters=trainable_lib.counts(run.params, leaf_mask),
               initial=trainable_lib.coverage(run.initial, run.params, leaf_mask))


def _static_reasons(spec: LoopSpec, hparams: Mapping[str, Any]) -> tuple:
  """(name, why) of each static hyperparameter the optimizer did not make static: why each of
  its values compiles a program of its own."""
  task, auto = spec.task, dict(spec.auto_static)
  reads = task.model_reads(hparams)
  static, _ = task.split_hparams(hparams)
  out = []
  for name in sorted(set(static) - set(auto)):
    if name in reads:
      why = "the model factory reads it: it builds the model (its layers, parameter shapes)"
    elif name in task.static:
      why = "the task declares it static (Task.static)"
    else:
      why = f"a {type(hparams[name]).__name__}, not a float: only floats are traced"
    out.append((name, why))
  return tuple(out)


@dataclasses.dataclass(frozen=True, eq=False)
class TaskPlan:
  """What a search runs, checked once.

  Build it with `TaskPlan.build` (a grid) or `TaskPlan.for_candidates`
  (candidates of any grid points): complete when built.

  Attributes:
    data: the `Dataset` the candidates train on (checked).
    points: the grid points, one per run (distinct).
    runs: one `RunPlan` per point (points with one configuration object share one).
    initial_params: the public start as the caller gave it (None: none).
    space: the `SearchSpace`, when the plan is of a grid (which a target epsilon can calibrate).
    origin: the data the plan was built and checked on, when `data` holds
      other rows of it (`on_rows`: a Poisson subset); what the fingerprint
      hashes, since the rows not drawn are read too (by a final run).
  """
  data: Dataset
  points: tuple
  runs: tuple
  initial_params: Any = None
  space: Optional[SearchSpace] = None
  origin: Optional[Dataset] = None

  #: Its candidates save checkpoints in a durable store's run directory.
  checkpointed: ClassVar[bool] = True

  @classmethod
  def build(cls, space: SearchSpace, data: Dataset, *, initial_params: Any = None) -> "TaskPlan":
    """The plan of every grid point of `space` on `data` (see `jaxdp.train.run_plan.plan_runs`).

    Raises:
      ValueError: `data` is not a `Dataset` the task can use, a configuration
        does not fit it, or `initial_params` does not fit a model.
    """
    runs = plan_runs(space.configs, data, initial_params=initial_params)
    return cls(data=data, points=space.points, runs=runs, initial_params=initial_params, space=space)

  @classmethod
  def for_candidates(cls, candidates: Sequence[Candidate], data: Dataset, *,
                     initial_params: Any = None) -> "TaskPlan":
    """The plan of the grid points that `candidates` use (one run per point; one configuration
    per point, the candidates at a point share it)."""
    for c in candidates:
      if not isinstance(c, Candidate):
        raise ValueError(f"candidates must be Candidate objects, got {type(c).__name__}")
    by_point: dict = {}
    for c in candidates:
      first = by_point.setdefault(point_key(c.point), c)
      if first.config is not c.config and first.config != c.config:
        raise ValueError(f"candidates at grid point {dict(c.point)} carry two different "
                         "configurations: a pool records one mechanism per point")
    distinct = list(by_point.values())
    runs = plan_runs([c.config for c in distinct], data, initial_params=initial_params)
    return cls(data=data, points=tuple(dict(c.point) for c in distinct), runs=runs,
               initial_params=initial_params)

  def __getstate__(self):
    # Object ids mean nothing in another process (a Ray worker): the index is rebuilt there.
    state = dict(self.__dict__)
    state.pop("_by_config", None)
    return state

  @functools.cached_property
  def _by_config(self) -> dict:
    # id -> (the configuration, its run): the object is kept so that an id reused after it is
    # freed can never be taken for it.
    return {id(run.config): (run.config, run) for run in self.runs}

  @functools.cached_property
  def _by_point(self) -> dict:
    return {point_key(p): run for p, run in zip(self.points, self.runs)}

  def run_of(self, config: TrainConfig) -> RunPlan:
    """The `RunPlan` of `config` (one of the plan's configuration objects).

    Raises:
      ValueError: `config` is not one the plan was built for.
    """
    found, run = self._by_config.get(id(config), (None, None))
    if found is not config:  # an equal configuration object (candidates built apart): the same run
      run = next((r for r in self.runs if r.config == config), None)
      if run is not None:
        self._by_config[id(config)] = (config, run)
    if run is None:
      raise ValueError("a candidate's configuration is not one of this TaskPlan's: build the plan "
                       "from the same SearchSpace or candidates (TaskPlan.build / for_candidates)")
    return run

  def check_candidates(self, candidates: Sequence[Candidate]) -> None:
    """Raises ValueError unless every candidate is one of the plan's grid points, with that
    point's configuration (what the pool records for the point is what the candidate runs)."""
    for c in candidates:
      if not isinstance(c, Candidate):
        raise ValueError(f"candidates must be Candidate objects, got {type(c).__name__}")
      run = self.run_of(c.config)
      expected = self._by_point.get(point_key(c.point))
      if expected is None or (expected is not run and expected.config != c.config):
        raise ValueError(f"a candidate at grid point {dict(c.point)} carries another point's "
                         "configuration; build candidates from the plan's SearchSpace")

  def check_result(self, candidate: Candidate, result: Any) -> None:
    """Raises ValueError unless `result` is a `CandidateResult` (one holds nothing of its
    candidate to compare: a trainer is trusted to pair them, as code)."""
    del candidate
    if not isinstance(result, CandidateResult):
      raise ValueError(f"a trainer reported a {type(result).__name__} for a task's candidate, "
                       "not a jaxdp.train.CandidateResult")

  # -- the grid, as the draws read it ---------------------------------------------

  @property
  def configs(self) -> tuple:
    """Each point's `TrainConfig`, in the points' order."""
    return tuple(run.config for run in self.runs)

  def __len__(self) -> int:
    return len(self.runs)

  @property
  def score_source(self) -> str:
    """Where the candidates' scores come from (every run's task: a `derive` may change it)."""
    return " / ".join(dict.fromkeys(score_source(run.config.task) for run in self.runs))

  # -- calibration -------------------------------------------------------------------

  def with_noise(self, noise: float) -> "TaskPlan":
    """This plan with every configuration at noise multiplier `noise` (a calibrated sigma, a
    traced input: nothing is checked or traced again).

    Raises:
      ValueError: the plan is of no grid, the grid varies the noise multiplier, or a
        `SearchSpace` derive sets it (the calibrated sigma would not run).
    """
    if self.space is None or "noise_multiplier" in self.space.grid:
      raise ValueError("a calibrated noise_multiplier needs a plan of a grid that does not vary "
                       "it (TaskPlan.build of a SearchSpace without 'noise_multiplier')")
    space = SearchSpace(self.space.base.replace(noise_multiplier=float(noise)), self.space.grid,
                        self.space.derive)
    runs = tuple(run.with_noise(config) for run, config in zip(self.runs, space.configs))
    ignored = sorted({r.config.noise_multiplier for r in runs} - {float(noise)})
    if ignored:
      raise ValueError(f"target_epsilon calibrated noise_multiplier={noise!r}, but the search's "
                       f"configurations run with {ignored} (a SearchSpace derive sets it?): give "
                       "either target_epsilon or the noise multipliers, not both")
    return dataclasses.replace(self, runs=runs, space=space)

  # -- what a search releases and reports --------------------------------------------

  def release(self, candidate: Optional[Candidate], result: Optional[CandidateResult]) -> dict:
    """The selected candidate's grid point, configuration, parameters and score source."""
    if candidate is None:
      return {"hyperparameters": None, "config": None, "params": None,
              "score_source": self.score_source}
    return {"hyperparameters": dict(candidate.point), "config": candidate.config,
            "params": result.params, "score_source": score_source(candidate.config.task)}

  def unreleased(self, candidate: Optional[Candidate], result: Any) -> dict:
    """Which hyperparameters compiled as static values though floats (a diagnostic)."""
    del candidate, result
    return {"auto_static": {name: why for run in self.runs for name, why in run.spec.auto_static}}

  def group_runs(self) -> tuple:
    """One `RunPlan` per compiled group (per distinct `LoopSpec`), in `summary`'s order: what
    a dry run's probe compiles and times."""
    return tuple(rs[0] for rs in self._runs_by_spec().values())

  def _runs_by_spec(self) -> dict:
    by_spec: dict = {}
    for run in self.runs:
      by_spec.setdefault(run.spec, []).append(run)
    return by_spec

  def summary(self) -> dict:
    """The compiled groups (each layer's clipping path, the trainable and frozen parameters,
    what `initial_params` holds), and one candidate's mean DP steps and per-example gradients
    over the grid (a dry run's)."""
    n = self.data.num_examples
    groups = tuple(_group(s, rs) for s, rs in self._runs_by_spec().items())
    return {"groups": groups,
            "steps": float(np.mean([run.spec.num_steps for run in self.runs])),
            "gradients": float(np.mean([run.spec.num_steps * run.spec.sampling_prob * n
                                        for run in self.runs])),
            "function": None, **self.unreleased(None, None)}

  def on_rows(self, data: Dataset) -> "TaskPlan":
    """This plan on `data`: the same structure, other rows (a Poisson subset). The padding is
    sized for its rows; nothing is checked again.

    Raises:
      ValueError: a run's DpEvent would change (another declared N with an expected
        `batch_size`): what was accounted would not be what runs.
    """
    analyses: dict = {}
    runs = {}
    for r in self.runs:  # runs shared by several points stay shared
      if id(r) not in runs:
        runs[id(r)] = r.derive(r.config, data, initial=r.initial, analyses=analyses)
        if runs[id(r)].dp_event != r.dp_event:
          raise ValueError(f"on_rows would change a run's DpEvent ({r.dp_event} -> "
                           f"{runs[id(r)].dp_event}): give sampling_prob, not batch_size")
    return dataclasses.replace(self, data=data, runs=tuple(runs[id(r)] for r in self.runs),
                               origin=self.origin or self.data)

  # -- what a durable pool records --------------------------------------------

  def record(self, candidate: Candidate, result: CandidateResult) -> tuple:
    """(the pool record of a trained candidate, the parameters stored with it)."""
    return record_of(candidate, result, self.run_of(candidate.config)), result.params

  def result(self, candidate: Candidate, record: Mapping[str, Any], leaves) -> CandidateResult:
    """The `CandidateResult` a pool record (and its parameter leaves, None when not read)
    stands for."""
    params = None if leaves is None else self.run_of(candidate.config).treedef.unflatten(leaves)
    return result_from_record(record, params)

  def mechanism(self, points: Optional[Sequence[Mapping[str, Any]]] = None) -> dict:
    """What the candidates at `points` (default: every point) compute and what is accounted.

    Returns:
      {"configs": {point key: the configuration as JSON}, "dp_events": {point
      key: its DpEvent's repr}, "programs": {point key: the digest of its
      program (`jaxdp.train.digest.program_digest`)}}, keyed by
      `jaxdp.sweep.space.point_key`. The program is traced once per distinct
      `LoopSpec`.
    """
    by_key = {point_key(p): run for p, run in zip(self.points, self.runs)}
    keys = sorted(by_key if points is None else {point_key(p) for p in points})
    unknown = [k for k in keys if k not in by_key]
    if unknown:
      raise ValueError(f"grid points {unknown[:3]} are not in this plan")
    programs = {by_key[k].spec: self._program_digest(by_key[k].spec) for k in keys}
    if not keys:
      return {part: {} for part in MECHANISM_PARTS}
    return {
        "configs": {k: digest_lib.scrub(json.dumps(config_record(by_key[k].config), sort_keys=True))
                    for k in keys},
        "dp_events": {k: event_record(by_key[k]) for k in keys},
        "programs": {k: programs[by_key[k].spec] for k in keys},
    }

  @functools.cached_property
  def _digests(self) -> dict:
    return {}

  def _program_digest(self, spec) -> str:
    # Traced once per distinct program and plan (the manifest and every checkpoint read it).
    if spec not in self._digests:
      self._digests[spec] = digest_lib.program_digest(spec, self.data)
    return self._digests[spec]

  @functools.cached_property
  def _inputs_digest(self) -> dict:
    # The rows the candidates train on (a Poisson subset's, not only its origin's) and the start.
    return {"data": data_fingerprint(self.data) if self.data is not None else None,
            "initial": params_digest(self.initial_params) if self.initial_params is not None else None}

  def identity(self, candidate: Candidate) -> str:
    """sha256 of everything one candidate's run computes from: its id and PRNG key, its grid
    point's mechanism (configuration, DpEvent, program digest: `mechanism`), the rows it trains
    on and the public start. A checkpoint is resumed only by a run of the same identity
    (`jaxdp.sweep.checkpoints`)."""
    what = {"id": candidate.id, "key": np.asarray(jax.random.key_data(candidate.key())).tolist(),
            "key_impl": str(jax.random.key_impl(candidate.key())),
            "mechanism": self.mechanism([candidate.point]), "inputs": self._inputs_digest}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()

  def fingerprint(self, **fields: Any) -> dict:
    """`fields` plus what the candidates read besides their configurations: the data's
    sha256 and declared size, and the digest of the public start (when there is one)."""
    for reserved in (DATA_KEY, INITIAL_KEY):
      if reserved in fields:
        raise ValueError(f"a fingerprint must not use the key {reserved!r}: the plan adds it")
    out = dict(fields)
    data = self.origin or self.data
    if data is not None:  # None only for a plan with nothing to train
      out[DATA_KEY] = data_fingerprint(data)
    if self.initial_params is not None:
      out[INITIAL_KEY] = params_digest(self.initial_params)
    return out

  def search_fields(self, tuner: str, key: jax.Array, **accounted: Any) -> dict:
    """What a tuner's search is, besides its data and public start (which
    `fingerprint` adds): a run directory made for any other is refused.

    Args:
      tuner: the tuner's name.
      key: the search's PRNG key (its raw bits).
      **accounted: the other arguments that decide the draw or the release
        (the law of K, delta, target epsilon, threshold, ...), by repr.
    """
    shapes = sorted({str(jax.tree.map(lambda s: (tuple(s.shape), str(s.dtype)), r.params))
                     for r in self.runs})
    # The implementation too: the same raw bits draw differently under threefry and rbg.
    return dict(tuner=tuner, key=key_digest(key), points=[dict(p) for p in self.points],
                parameter_shapes=shapes, accounted={k: repr(v) for k, v in sorted(accounted.items())},
                jaxdp=jaxdp.__version__)


def task_plan_of(candidates: Sequence[Candidate], data: Any, initial_params: Any = None) -> TaskPlan:
  """`data` if it is a `TaskPlan` (checked: every candidate is one of its configurations), else
  the plan of `candidates` on the `Dataset` `data` (built here, once)."""
  if isinstance(data, TaskPlan):
    if initial_params is not None:
      raise ValueError("initial_params is part of the TaskPlan: give it to TaskPlan.build, not "
                       "with a plan")
    data.check_candidates(candidates)
    return data
  return TaskPlan.for_candidates(candidates, data, initial_params=initial_params)
