"""`SearchPlan`: a search planned once, at its call, and passed down to the compiled step.

A search's entry (a tuner's `prepare`, `run_sweep`, `train_candidates` given
a `Dataset`) builds one `SearchPlan` from its arguments: the data is checked
once, every distinct program once on the data's shapes, `initial_params`
once against each model, and every configuration gets its `RunPlan` (its
`LoopSpec`, parameter structure, `DpSgdPlan` and DpEvent). The engine, the
Ray backend, the durable store, the dry run and the run directory's
fingerprint read the plan; none of them derives a spec or checks an
argument again. Like jax_privacy's `DPExecutionPlan`, it is the one object
that says what runs, so what is accounted (the runs' DpEvents, the search's
event) is derived from the very objects that run.

What trains the candidates is pluggable: anything with the signature of
`jaxdp.sweep.train_candidates(candidates, plan, ...)` reads the same plan
(`jaxdp.sweep.ray_backend.train_candidates_ray` runs it on a Ray cluster).
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
from jaxdp.sweep.functions import FunctionPlan
from jaxdp.sweep.pool import DATA_KEY, INITIAL_KEY
from jaxdp.sweep.space import (MECHANISM_PARTS, Candidate, SearchSpace, config_record, key_digest,
                               point_key)
from jaxdp.train import digest as digest_lib
from jaxdp.train.config import TrainConfig
from jaxdp.train.run_plan import RunPlan, plan_runs
from jaxdp.train.trainer import CandidateResult



@dataclasses.dataclass(frozen=True, eq=False)
class SearchPlan:
  """What a search runs, checked once.

  Build it with `SearchPlan.build` (a grid) or `SearchPlan.for_candidates`
  (candidates of any grid points). A tuner adds what it accounts for the
  whole search (`event`, `epsilon`, `delta`, `noise_multiplier`).

  Attributes:
    data: the `Dataset` the candidates train on (checked).
    points: the grid points, one per run (distinct).
    runs: one `RunPlan` per point (points with one configuration object share one).
    initial_params: the public start as the caller gave it (None: none).
    space: the `SearchSpace`, when the plan is of a grid.
    event: the accounted event of the whole search (a tuner's), or None.
    epsilon: its epsilon at `delta` ("best"), or None.
    delta: the search's delta, or None.
    noise_multiplier: the sigma calibrated for a target epsilon, or None.
    origin: the data the plan was built and checked on, when `data` holds
      other rows of it (`on_rows`: a Poisson subset); what the fingerprint
      hashes, since the rows not drawn are read too (by a final run).
  """
  data: Dataset
  points: tuple
  runs: tuple
  initial_params: Any = None
  space: Optional[SearchSpace] = None
  event: Any = None
  epsilon: Optional[float] = None
  delta: Optional[float] = None
  noise_multiplier: Optional[float] = None
  origin: Optional[Dataset] = None

  #: Its candidates save checkpoints in a durable store's run directory.
  checkpointed: ClassVar[bool] = True

  @classmethod
  def build(cls, space: SearchSpace, data: Dataset, *, initial_params: Any = None) -> "SearchPlan":
    """The plan of every grid point of `space` on `data` (see `jaxdp.train.run_plan.plan_runs`).

    Raises:
      ValueError: `data` is not a `Dataset` the task can use, a configuration
        does not fit it, or `initial_params` does not fit a model.
    """
    runs = plan_runs(space.configs, data, initial_params=initial_params)
    return cls(data=data, points=space.points, runs=runs, initial_params=initial_params, space=space)

  @classmethod
  def for_candidates(cls, candidates: Sequence[Candidate], data: Dataset, *,
                     initial_params: Any = None) -> "SearchPlan":
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
      raise ValueError("a candidate's configuration is not one of this SearchPlan's: build the plan "
                       "from the same SearchSpace or candidates (SearchPlan.build / for_candidates)")
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

  def with_noise(self, space: SearchSpace) -> "SearchPlan":
    """This plan for `space`, the plan's grid with another noise multiplier (a calibrated
    sigma, a traced input): nothing is checked or traced again."""
    if self.space is None or list(space.points) != list(self.points):
      raise ValueError("with_noise needs a plan of a grid and the same grid with another sigma")
    runs = tuple(run.with_noise(config) for run, config in zip(self.runs, space.configs))
    # What was accounted was another mechanism's: the caller accounts this one anew.
    return dataclasses.replace(self, runs=runs, space=space, event=None, epsilon=None, delta=None,
                               noise_multiplier=None)

  def on_rows(self, data: Dataset) -> "SearchPlan":
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

  def accounted(self, *, event: Any, epsilon: float, delta: float,
                noise_multiplier: Optional[float] = None) -> "SearchPlan":
    """This plan with the whole search's accounting (a tuner's)."""
    return dataclasses.replace(self, event=event, epsilon=float(epsilon), delta=float(delta),
                               noise_multiplier=noise_multiplier)

  # -- what a durable pool records --------------------------------------------

  def record(self, candidate: Candidate, result: CandidateResult) -> tuple:
    """(the pool record of a trained candidate, the parameters stored with it)."""
    return record_of(candidate, result, self), result.params

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


def event_record(run: RunPlan) -> str:
  """A run's DpEvent as pools store it: its repr, object addresses scrubbed (deterministic
  across processes: the events are attrs classes of numbers)."""
  return digest_lib.scrub(repr(run.dp_event))


def result_fields(result: CandidateResult) -> dict:
  """What a pool record keeps of a `CandidateResult` (not its parameters)."""
  return {"score": result.score, "test_score": result.test_score, "test_loss": result.test_loss,
          "score_source": result.score_source, "steps": result.steps,
          "planned_steps": result.planned_steps, "diverged": result.diverged,
          "epsilon": result.epsilon, "delta": result.delta, "wall_time_s": result.wall_time_s,
          "resumed_step": result.resumed_step}


def record_of(candidate: Candidate, result: CandidateResult, plan: SearchPlan) -> dict:
  """The pool record of a trained candidate of `plan` (no parameters)."""
  return {"id": candidate.id, "point": dict(candidate.point), "seed": candidate.seed,
          **result_fields(result), "dp_event": event_record(plan.run_of(candidate.config))}


def result_from_record(record: Mapping[str, Any], params: Any) -> CandidateResult:
  """The `CandidateResult` a pool record stands for (compile time is not stored: 0.0)."""
  return CandidateResult(
      score=float(record["score"]), test_score=float(record["test_score"]),
      test_loss=float(record["test_loss"]), steps=int(record["steps"]),
      planned_steps=int(record["planned_steps"]), epsilon=float(record["epsilon"]),
      delta=float(record["delta"]), diverged=bool(record["diverged"]),
      wall_time_s=float(record["wall_time_s"]), score_source=record["score_source"],
      resumed_step=int(record.get("resumed_step", 0)), params=params)


def data_fingerprint(data: Dataset) -> dict:
  """sha256 of every split's arrays (structure, shapes, dtypes, bytes) and the declared size."""
  digest = hashlib.sha256()
  for name in ("train", "test", "private_validation"):
    split = getattr(data, name)
    digest.update(name.encode())
    if split is None:
      continue
    leaves, treedef = jax.tree_util.tree_flatten(split)
    digest.update(str(treedef).encode())
    for leaf in leaves:
      leaf = np.ascontiguousarray(np.asarray(leaf))
      digest.update(f"{leaf.dtype}{leaf.shape}".encode())
      digest.update(leaf.tobytes())
  return {"sha256": digest.hexdigest(), "num_examples": data.num_examples}


def params_digest(tree: Any) -> str:
  """sha256 of a parameter tree: its paths, dtypes, shapes and bytes."""
  digest = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    leaf = np.ascontiguousarray(np.asarray(leaf))
    digest.update(f"{jax.tree_util.keystr(path)}{leaf.dtype}{leaf.shape}".encode())
    digest.update(leaf.tobytes())
  return digest.hexdigest()


def as_plan(candidates: Sequence[Candidate], data: Any, initial_params: Any = None) -> Any:
  """`data` if it is a plan (a `SearchPlan` or a `jaxdp.sweep.functions.FunctionPlan`,
  checked: every candidate is one of its configurations), else the plan of `candidates` on
  the `Dataset` `data` (built here, once)."""
  if isinstance(data, (SearchPlan, FunctionPlan)):
    if initial_params is not None:
      raise ValueError("initial_params is part of the SearchPlan: give it to SearchPlan.build, "
                       "not with a plan")
    data.check_candidates(candidates)
    return data
  return SearchPlan.for_candidates(candidates, data, initial_params=initial_params)
