"""Durable, resumable private searches: every trained candidate on disk, the same draw on rerun.

A tuner given `run_dir` appends each finished candidate (its record and its
parameters) to a `jaxdp.sweep.ResultPool` in that directory as soon as its
chunk ends, and reads every candidate it releases from there. A rerun with
the same arguments and key draws the same candidates (the draw depends only
on the key, the grid and the law of K), trains only those missing, and
releases what an uninterrupted run releases: the same candidate, its
parameters bit for bit on the same machine (read back from the same bytes),
the same epsilon. That is the only reason resuming is private: it is the same
draw of the same mechanism.

So a rerun that would be another draw, or the same draw of another
mechanism, is refused before anything trains: the pool's manifest holds the
search's fingerprint (tuner, key, grid, the law of K and the other accounted
arguments, a sha256 of the data and the jaxdp version) and its mechanism,
per grid point: the configuration, the candidates' DpEvent (the DP score's
included) and the digest of the program they run
(`jaxdp.train.digest`: model, loss, score, optimizer, clipping path,
trainable set, as traced now). Any difference raises `SearchMismatchError`
naming the part ("differs in: dp_events", "programs", "configs", ...). A
second draw on the same data would be a second search that no epsilon
accounts for; a stored score released under a changed mechanism (say a
`NoisyMean` now given a larger noise multiplier) would be reported with the
new mechanism's epsilon, not the one that produced it.

The pool holds candidates that are never released (their scores and
parameters): a `run_dir` is as secret as the data.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import numpy as np

import jaxdp
from jaxdp.data import Dataset
from jaxdp.sweep import engine
# SearchMismatchError is defined with the pool (run_sweep raises it too) and is this module's.
from jaxdp.sweep.pool import (ParamsDamagedError, PoolMismatchError, ResultPool, SearchMismatchError,
                              data_fingerprint, params_digest, record_of, result_fields)
from jaxdp.sweep.space import Candidate, SearchSpace, config_record, event_record, mechanism_record
from jaxdp.train import CandidateResult, checks, program
from jaxdp.train.program import LoopSpec

#: The training backend: `jaxdp.sweep.train_candidates` or anything with its
#: signature, e.g. `jaxdp.sweep.ray_backend.train_candidates_ray`.
Trainer = Callable[..., list]


def search_fingerprint(tuner: str, space: SearchSpace, data: Dataset, key: jax.Array,
                       **accounted: Any) -> dict:
  """What a search is: a pool made for any other fingerprint is refused.

  What its candidates compute (each configuration, its DpEvent and program
  digest) is recorded beside it, per grid point: `search_mechanism`.

  Args:
    tuner: the tuner's name.
    space: the grid (its points; each configuration, with every field, the
      hyperparameters and the execution settings, is in the mechanism
      record), with the parameter shapes of each model.
    data: its sha256 and declared sizes are recorded.
    key: the search's PRNG key (its raw bits).
    **accounted: the other arguments that decide the draw or the release
      (the law of K, delta, target epsilon, threshold, ...), by repr.
  """
  return {
      "tuner": tuner,
      "key": np.asarray(jax.random.key_data(key)).tolist(),
      "points": [dict(p) for p in space.points],
      "parameter_shapes": sorted({_param_shapes(LoopSpec.from_config(c, data), data)
                                  for c in space.configs}),
      "data": data_fingerprint(data),
      "accounted": {k: repr(v) for k, v in sorted(accounted.items())},
      "jaxdp": jaxdp.__version__,
  }


def search_mechanism(space: SearchSpace, data: Dataset) -> dict:
  """What the candidates of `space` compute on `data`, per grid point: their configuration,
  DpEvent and program digest (`jaxdp.sweep.space.mechanism_record`). The pool records it beside
  the fingerprint; a resume that differs in it is refused."""
  return mechanism_record(zip(space.points, space.configs), data)


def check_initial_params(initial_params: Any, space: SearchSpace, data: Dataset) -> None:
  """Raises ValueError unless `initial_params` fits the model of every configuration of `space`."""
  for spec in {LoopSpec.from_config(c, data): None for c in space.configs}:
    checks.check_initial_params(initial_params, program.param_shapes(spec, data.train))


def _param_shapes(spec: LoopSpec, data: Dataset) -> str:
  shapes = program.param_shapes(spec, data.train)
  return str(jax.tree.map(lambda s: (tuple(s.shape), str(s.dtype)), shapes))


class CandidateStore:
  """Trains candidates through `trainer`, durably in `run_dir` when one is given.

  Use it as a context manager: with a `run_dir` it holds the pool's writer
  lock for the whole search (a second process gets `PoolLockedError`).

  Args:
    data: the data the candidates train on.
    trainer: the backend (None: `jaxdp.sweep.train_candidates`).
    run_dir: None (nothing on disk) or the search's directory.
    fingerprint: the search's fingerprint (`search_fingerprint`).
    mechanism: what its candidates compute (`search_mechanism`).
    engine_kwargs: forwarded to the trainer; an `on_chunk` given there is
      called as well, after the chunk is on disk.

  Raises:
    SearchMismatchError: `run_dir` holds another search, or this one run by
      another mechanism (before anything trains).
  """

  def __init__(self, data: Dataset, *, trainer: Optional[Trainer] = None, run_dir: Optional[str] = None,
               fingerprint: Optional[Mapping[str, Any]] = None,
               mechanism: Optional[Mapping[str, Any]] = None,
               engine_kwargs: Optional[Mapping[str, Any]] = None):
    self.data, self.trainer = data, trainer or engine.train_candidates
    self.engine_kwargs = dict(engine_kwargs or {})
    self.pool: Optional[ResultPool] = None
    if run_dir is not None:
      try:
        self.pool = ResultPool(run_dir, fingerprint or {}, mechanism=mechanism)
      except PoolMismatchError as err:
        raise SearchMismatchError(
            f"{err}. A private search resumed with another key, grid, configuration, law of K, "
            "data or jaxdp version is not the same draw, and one resumed with another mechanism "
            "(a configuration's DpEvent or DP score, the task's loss, score, model, optimizer, "
            "clipping or trainable set) would release scores that the reported epsilon does not "
            "account for: either is a second search on the same data. Rerun the identical search "
            "to resume, or start a new search in a new run_dir") from None
    self._treedefs: dict = {}

  @classmethod
  def for_search(cls, tuner: str, space: SearchSpace, data: Dataset, key: jax.Array, *,
                 run_dir: Optional[str], trainer: Optional[Trainer], engine_kwargs: Mapping[str, Any],
                 trains_on: Optional[Dataset] = None, initial_params: Any = None,
                 **accounted: Any) -> "CandidateStore":
    """The store of one search on `data` (fingerprinted when `run_dir` is given), whose
    candidates train on `trains_on` (default: `data`; a subset for subset tuning), each
    starting from `initial_params` (checked against every configuration's model here,
    before anything is drawn or trained)."""
    engine_kwargs = dict(engine_kwargs)
    if initial_params is not None:
      check_initial_params(initial_params, space, data)
      engine_kwargs["initial_params"] = initial_params
      accounted["initial_params"] = params_digest(initial_params)
    trains_on = data if trains_on is None else trains_on
    fingerprint = mechanism = None
    if run_dir is not None:  # tracing the programs costs a fraction of a second per compiled group
      fingerprint = search_fingerprint(tuner, space, data, key, **accounted)
      mechanism = search_mechanism(space, trains_on)
    return cls(trains_on, trainer=trainer, run_dir=run_dir, fingerprint=fingerprint,
               mechanism=mechanism, engine_kwargs=engine_kwargs)

  def __enter__(self) -> "CandidateStore":
    return self

  def __exit__(self, *exc) -> None:
    if self.pool is not None:
      self.pool.close()

  def train(self, candidates: Sequence[Candidate]) -> list:
    """One `CandidateResult` (with parameters) per candidate, in order.

    The trainer chooses its layout for all of `candidates` (`search_size`),
    however few of them are missing: a candidate trained on a resume gets the
    bits it gets in an uninterrupted run.
    """
    if not candidates:
      return []
    if self.pool is None:
      return self.trainer(list(candidates), self.data, keep_params=True,
                          search_size=len(candidates), **self.engine_kwargs)
    for _ in range(2):  # a second pass retrains what lost its parameters file
      self._train_missing(candidates)
      try:
        return self._stored(candidates)
      except ParamsDamagedError as err:
        self.pool.drop(err.ids, str(err))
    return self._stored(candidates)

  def train_lone(self, record_id: str, config, run: Callable[[], CandidateResult]) -> CandidateResult:
    """A run outside the drawn candidates (a final model), stored under `record_id`: `run()`
    trains it unless it is stored already.

    Raises:
      SearchMismatchError: the stored run's DpEvent or configuration is not
        `config`'s (e.g. another extrapolation of the tuned hyperparameters).
    """
    if self.pool is None:
      return run()
    # As a reload reads them back (JSON), so an identical rerun compares equal.
    expected = {"dp_event": event_record(config, self.data.num_examples),
                "config": json.loads(json.dumps(config_record(config)))}
    for _ in range(2):
      if record_id not in self.pool.done_ids():
        result = run()
        self.pool.append([dict(result_fields(result), id=record_id, point={}, seed=-1, **expected)],
                         params={record_id: result.params})
      record = next(r for r in self.pool.records if r["id"] == record_id)
      for field, value in expected.items():
        if record.get(field) != value:
          raise SearchMismatchError(
              f"run directory {self.pool.run_dir!r} holds {record_id!r} run with another "
              f"{field} (stored {record.get(field)!r:.240}, now {value!r:.240}): releasing it would "
              "report the mechanism of this run, not the one that produced it; rerun the "
              "identical search, or start a new search in a new run_dir")
      try:
        leaves = self.pool.load_params([record])[record_id]
      except ParamsDamagedError as err:
        self.pool.drop(err.ids, str(err))
        continue
      return result_from_record(record, self._treedef(config).unflatten(leaves))
    raise RuntimeError(f"{record_id}: its parameters could not be stored in {self.pool.run_dir!r}")

  def _train_missing(self, candidates: Sequence[Candidate]) -> None:
    done = self.pool.done_ids()
    todo = list({c.id: c for c in candidates if c.id not in done}.values())
    if not todo:
      return
    user_on_chunk = self.engine_kwargs.get("on_chunk")

    def on_chunk(chunk):
      self.pool.append([record_of(c, r, self.data.num_examples) for c, r in chunk],
                       params={c.id: r.params for c, r in chunk})
      if user_on_chunk is not None:
        user_on_chunk(chunk)

    kwargs = dict(self.engine_kwargs, on_chunk=on_chunk)
    self.trainer(todo, self.data, keep_params=True, search_size=len(candidates), **kwargs)

  def _stored(self, candidates: Sequence[Candidate]) -> list:
    records = {r["id"]: r for r in self.pool.records}
    missing = [c.id for c in candidates if c.id not in records]
    if missing:
      raise RuntimeError(f"the trainer returned without storing candidates {missing[:3]}: a backend "
                         "must call on_chunk for every chunk it trains")
    leaves = self.pool.load_params([records[c.id] for c in {c.id: c for c in candidates}.values()])
    return [result_from_record(records[c.id], self._treedef(c.config).unflatten(leaves[c.id]))
            for c in candidates]

  def _treedef(self, config):
    spec = LoopSpec.from_config(config, self.data)
    if spec not in self._treedefs:
      self._treedefs[spec] = jax.tree.structure(program.param_shapes(spec, self.data.train))
    return self._treedefs[spec]


def result_from_record(record: Mapping[str, Any], params: Any) -> CandidateResult:
  """The `CandidateResult` a pool record stands for (compile time is not stored: 0.0)."""
  return CandidateResult(
      score=float(record["score"]), test_score=float(record["test_score"]),
      test_loss=float(record["test_loss"]), steps=int(record["steps"]),
      planned_steps=int(record["planned_steps"]), epsilon=float(record["epsilon"]),
      delta=float(record["delta"]), diverged=bool(record["diverged"]),
      wall_time_s=float(record["wall_time_s"]), score_source=record["score_source"], params=params)
