"""Any DP training function as a search's candidate: its plan, its trainer, its records.

The protocol (docs/guides/tune_any_trainer.md):

  train_fn(hparams: dict, seed: int) -> (score, artifact)
  dp_event_fn(hparams: dict) -> dp_accounting.DpEvent

given to a tuner as one `TrainFunction(train_fn, dp_event_fn, noise_parameter=None)`.

`train_fn` is any Python function (PyTorch/Opacus, Keras, NumPy, a JAX
loop): it trains one candidate with the grid point's hyperparameters and
returns a real score (higher is better) and anything to release if it is
selected (weights, a state_dict, a model). `dp_event_fn` is the public privacy
event of one such run, the DP score's included.

`FunctionPlan` is the `jaxdp.sweep.plan.SearchPlan` of a function, as `TaskPlan` is a `Task`'s:
built once at the search's call, it holds every grid point's hyperparameters
and DpEvent (checked: a `DpEvent`, the same on every call), and gives the
durable store (`jaxdp.sweep.CandidateStore`) what it records: the
mechanism per point (the hyperparameters, the DpEvent's repr, the function's
identity: `function_identity`, its code and what it holds), the search's fingerprint, and the record of
each trained candidate with its artifact (`jaxdp.sweep.artifacts`).
`train_functions` trains its candidates on this host (`jaxdp.sweep.trainers`
runs it here or on a Ray cluster).

The seed a candidate is called with is `call_seed(candidate)`: 63 bits hashed
from the key the search's key drew for it, so the same on every resume and in
any process, and as secret as the search key (the tuners never release it).

What cannot be checked, and is the caller's contract: that all of the run's
randomness comes from `seed` (a resume retrains with it: a function that
ignores it breaks "same draw, same release"), that `dp_event_fn` is what the
function runs, that the score reads only public data or is DP and inside
`dp_event_fn`, and that the function raises only for reasons the data do not
decide (an exception stops the whole search: a numerical failure should
return a non-finite score, which counts as the worst).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import itertools
import json
import numbers
import time
import warnings
from typing import Any, Callable, ClassVar, Mapping, Optional, Sequence

import dp_accounting
import jax
import numpy as np

import jaxdp
from jaxdp.sweep import artifacts
from jaxdp.sweep.identity import UNIDENTIFIED, function_identity, function_name
from jaxdp.sweep.progress import candidates_bar
from jaxdp.sweep.space import Candidate, _json_value, checked_grid, key_digest, point_key
from jaxdp.train import compilation_cache
from jaxdp.train.digest import scrub

#: The seeds a training function is called with: integers in [0, 2**63).
SEED_BITS = 63
#: Where a training function's score comes from: the caller's contract (docs/guides/tune_any_trainer.md).
SCORE_SOURCE = ("returned by train_fn (public data, or DP with its event inside dp_event_fn: "
                "the caller's contract, not checked)")


class TrainFunctionError(RuntimeError):
  """`train_fn` raised: the message names the candidate's hyperparameters; the function's own
  exception is the cause (`__cause__`).

  Attributes:
    hyperparameters: what `train_fn` was called with.
    seed: the seed it was called with, to reproduce the call. Not in the message: a seed is
      the run's noise, as secret as the search key (a log of the message must not hold it).
  """

  def __init__(self, message: str, hyperparameters: Mapping[str, Any], seed: int):
    super().__init__(message)
    self.hyperparameters, self.seed = dict(hyperparameters), seed

  def __reduce__(self):  # a Ray worker's exception travels to the driver by pickle
    return type(self), (self.args[0], self.hyperparameters, self.seed)


def call_seed(candidate: Candidate) -> int:
  """The seed `train_fn` gets for `candidate`: an integer in [0, 2**63), the leading bits of
  sha256 of its PRNG key's data (a key split from the search's key, every bit of it), so the
  same on every resume and in any process; two distinct candidates of a search share it with
  probability about K**2 / 2**64. As secret as the search key: it is the run's noise."""
  words = np.asarray(jax.random.key_data(candidate.key()), np.uint32).reshape(-1)
  digest = hashlib.sha256(candidate.key_impl.encode() + words.astype(">u4").tobytes()).digest()
  return int.from_bytes(digest[:8], "big") >> (64 - SEED_BITS)


def checked_event(event_fn: Callable, hparams: Mapping[str, Any]) -> dp_accounting.DpEvent:
  """`event_fn(hparams)` (a `TrainFunction`'s `dp_event_fn`), checked: a `dp_accounting.DpEvent`, the same on a second call.

  Raises:
    ValueError: naming the hyperparameters, when it is not, or when `event_fn` raises (its
      exception is the cause): before a search draws anything.
  """
  try:
    events = [event_fn(copy.deepcopy(dict(hparams))) for _ in range(2)]
  except Exception as err:  # the user's function: say which point, keep its error as the cause
    raise ValueError(f"dp_event_fn raised {type(err).__name__} for hyperparameters {dict(hparams)}: "
                     f"{err}") from err
  if not isinstance(events[0], dp_accounting.DpEvent):
    raise ValueError(f"dp_event_fn must return a dp_accounting.DpEvent for every grid point, got "
                     f"{type(events[0]).__name__} ({events[0]!r:.200}) for hyperparameters {dict(hparams)}")
  if events[0] != events[1]:
    raise ValueError(f"dp_event_fn returned two different events for hyperparameters {dict(hparams)} "
                     f"({events[0]!r:.200} and {events[1]!r:.200}): it must be a function of the "
                     "hyperparameters alone (a resume checks the events it recorded)")
  return events[0]


@dataclasses.dataclass(frozen=True, eq=False)
class FunctionRun:
  """One grid point of a function search: the hyperparameters `train_fn` gets (the grid point,
  and a calibrated noise) and its DpEvent."""
  hparams: Mapping[str, Any]
  dp_event: dp_accounting.DpEvent


@dataclasses.dataclass(frozen=True)
class FunctionResult:
  """One call of `train_fn`.

  Attributes:
    score: its score as a float (a non-finite one counts as the worst).
    stored: what it returned beside the score, encoded when it returned
      (`artifacts.snapshot`: the form a run directory stores), or None when not kept.
    wall_time_s: seconds the call took.
    seed: the seed it was called with (`call_seed`).
  """
  score: float
  stored: Optional[tuple] = dataclasses.field(repr=False, default=None)
  wall_time_s: float = 0.0
  seed: int = dataclasses.field(default=0, repr=False)  # the call's noise: never printed

  @property
  def artifact(self) -> Any:
    """What `train_fn` returned beside the score, as it was when it returned (None when not
    kept)."""
    return None if self.stored is None else artifacts.decode(*self.stored)


@dataclasses.dataclass(frozen=True)
class TrainFunction:
  """Any DP training function as a search's trainable (docs/guides/tune_any_trainer.md).

  Pass it where a tuner takes a `TrainConfig`:
  `random_search(TrainFunction(train_fn, dp_event_fn), grid, distribution=K, key=key)`.

  Args:
    train_fn: `train_fn(hparams, seed) -> (score, artifact)`: one DP run with the grid point's
      hyperparameters, every random number from `seed` (see the module docstring).
    dp_event_fn: `dp_event_fn(hparams) -> dp_accounting.DpEvent`: the event of one such run,
      its DP score's included; called on every grid point before anything is drawn.
    noise_parameter: the hyperparameter `train_fn` and `dp_event_fn` read as the noise, which a
      tuner's `target_epsilon` calibrates for the whole search (it must not be in the grid);
      None when the grid gives the noise.

  Raises:
    ValueError: a function is not callable, or `noise_parameter` is not a string or None.
  """
  train_fn: Callable
  dp_event_fn: Callable
  noise_parameter: Optional[str] = None

  def __post_init__(self):
    for name in ("train_fn", "dp_event_fn"):
      if not callable(getattr(self, name)):
        raise ValueError(f"{name} must be a callable, got {getattr(self, name)!r:.200}")
    if self.noise_parameter is not None and (not isinstance(self.noise_parameter, str)
                                             or not self.noise_parameter):
      raise ValueError(f"noise_parameter must be None or the name of a hyperparameter (a "
                       f"non-empty string), got {self.noise_parameter!r}")


@dataclasses.dataclass(frozen=True, eq=False)
class FunctionPlan:
  """What a search over a training function runs, checked once (see the module docstring):
  the `jaxdp.sweep.plan.SearchPlan` of a `TrainFunction`, complete when built.

  Attributes:
    function: the `TrainFunction`.
    points: the grid points, in the grid's order.
    runs: one `FunctionRun` per point (its hyperparameters: the point and a calibrated noise).
  """
  function: TrainFunction
  points: tuple
  runs: tuple

  #: A function checkpoints itself, if at all: the store keeps no checkpoints for it.
  checkpointed: ClassVar[bool] = False

  @classmethod
  def build(cls, function: TrainFunction, grid: Mapping[str, Sequence], *,
            noise: Optional[float] = None, argument: str = "grid") -> "FunctionPlan":
    """The plan of every point of `grid`, every event checked (`checked_event`).

    Args:
      function: the `TrainFunction`.
      grid: name -> non-empty sequence of values.
      noise: None, or the value of `function.noise_parameter` in every run (a calibrated noise).
      argument: the grid's name in error messages.

    Raises:
      ValueError: the grid is malformed or sets the noise parameter, a noise is given without
        a noise parameter, or an event is not a DpEvent or not a function of the hyperparameters.
    """
    if not isinstance(function, TrainFunction):
      raise ValueError(f"function must be a TrainFunction, got {type(function).__name__}")
    grid = checked_grid(grid, argument)
    for name, values in grid.items():
      for value in values:
        try:
          json.dumps(value)
        except (TypeError, ValueError):
          raise ValueError(
              f"{argument}[{name!r}] holds {value!r:.100} ({type(value).__name__}): a training "
              "function's hyperparameters must be JSON values (numbers, strings, bools, None, "
              "lists and dicts of them), as they key its candidates and are stored in a run_dir; "
              "name an object by a string and look it up in train_fn") from None
    points = tuple(dict(zip(grid, combo)) for combo in itertools.product(*grid.values()))
    seen: dict = {}
    for point in points:
      other = seen.setdefault(point_key(point), point)
      if other is not point:
        raise ValueError(f"{argument} points {other} and {point} are the same candidate (their "
                         "values are equal as JSON, e.g. a tuple and a list): give each value once")
    name = function.noise_parameter
    if noise is not None and name is None:
      raise ValueError("a noise value needs TrainFunction(noise_parameter=...): the name of the "
                       "hyperparameter train_fn and dp_event_fn read as the noise")
    if noise is not None and name in grid:
      raise ValueError(f"target_epsilon sets {name!r} for the whole search: remove it from the "
                       f"{argument}")
    runs = []
    for point in points:
      hparams = dict(point, **({name: float(noise)} if noise is not None else {}))
      runs.append(FunctionRun(hparams=hparams,
                              dp_event=checked_event(function.dp_event_fn, hparams)))
    return cls(function=function, points=points, runs=tuple(runs))

  # -- the grid, as the draws read it ------------------------------------------

  @property
  def configs(self) -> tuple:
    """What a `Candidate` carries as its configuration: its point's `FunctionRun`."""
    return self.runs

  def __len__(self) -> int:
    return len(self.runs)

  def __getstate__(self):  # a Ray worker rebuilds its own index
    state = dict(self.__dict__)
    state.pop("_by_point", None)
    state.pop("_runs_by_id", None)  # object ids mean nothing in another process
    return state

  @functools.cached_property
  def _identities(self) -> dict:
    # Once per plan: what a function holds is hashed by content, and an unidentifiable one's
    # nonce must be the same in the manifest's fingerprint and mechanism.
    return {"train_fn": function_identity(self.function.train_fn),
            "dp_event_fn": function_identity(self.function.dp_event_fn)}

  @functools.cached_property
  def _runs_by_id(self) -> dict:
    return {id(run): run for run in self.runs}

  @functools.cached_property
  def _by_point(self) -> dict:
    return {point_key(p): run for p, run in zip(self.points, self.runs)}

  def run_of(self, config: FunctionRun) -> FunctionRun:
    """`config` if it is one of the plan's runs (ValueError otherwise)."""
    if self._runs_by_id.get(id(config)) is not config:
      raise ValueError("a candidate's configuration is not one of this FunctionPlan's runs: draw "
                       "candidates from the plan")
    return config

  def check_candidates(self, candidates: Sequence[Candidate]) -> None:
    """Raises ValueError unless every candidate is a grid point of the plan with its run."""
    for c in candidates:
      if not isinstance(c, Candidate):
        raise ValueError(f"candidates must be Candidate objects, got {type(c).__name__}")
      if self._by_point.get(point_key(c.point)) is not self.run_of(c.config):
        raise ValueError(f"a candidate at grid point {dict(c.point)} carries another point's run")

  def check_result(self, candidate: Candidate, result: Any) -> None:
    """Raises ValueError unless `result` is the `FunctionResult` of a call with `candidate`'s
    seed (a result paired with another candidate is refused)."""
    if not isinstance(result, FunctionResult):
      raise ValueError(f"a trainer reported a {type(result).__name__} for a training function's "
                       "candidate, not a FunctionResult")
    if result.seed != call_seed(candidate):
      raise ValueError("a trainer reported a result of another candidate's call (its seed "
                       "differs): trainers must pair each result with its own candidate")

  @property
  def score_source(self) -> str:
    """Where the score comes from: the caller's contract (docs/guides/tune_any_trainer.md)."""
    return SCORE_SOURCE

  # -- what a search releases and reports --------------------------------------------

  def release(self, candidate: Optional[Candidate], result: Optional["FunctionResult"]) -> dict:
    """What the selected candidate's `train_fn` was called with (its grid point and the
    calibrated noise) and what it returned beside the score (its artifact, as `params`)."""
    if candidate is None:
      return {"hyperparameters": None, "config": None, "params": None,
              "score_source": SCORE_SOURCE}
    return {"hyperparameters": copy.deepcopy(dict(self.run_of(candidate.config).hparams)),
            "config": None, "params": result.artifact, "score_source": SCORE_SOURCE}

  def unreleased(self, candidate: Optional[Candidate], result: Optional["FunctionResult"]) -> dict:
    """The seed the selected call got: all of its randomness, its noise included."""
    del candidate
    return {"seed": None if result is None else result.seed}

  def summary(self) -> dict:
    """The function's name: jaxdp does not see inside it (no groups, no compute estimate)."""
    return {"groups": (), "steps": None, "gradients": None, "auto_static": {},
            "function": function_name(self.function.train_fn)}

  # -- what a durable pool records ------------------------------------------

  def mechanism(self, points: Optional[Sequence[Mapping[str, Any]]] = None) -> dict:
    """Per grid point: the hyperparameters the function gets, its DpEvent's repr, and the
    training function's identity (`function_identity`), as `SearchPlan.mechanism` records a
    task's configuration, event and program digest."""
    keys = sorted(self._by_point if points is None else {point_key(p) for p in points})
    program = hashlib.sha256(json.dumps(self._identities["train_fn"], sort_keys=True).encode()
                             ).hexdigest()
    return {
        "configs": {k: scrub(json.dumps({n: _json_value(v) for n, v in
                                         sorted(self._by_point[k].hparams.items())}, sort_keys=True))
                    for k in keys},
        "dp_events": {k: scrub(repr(self._by_point[k].dp_event)) for k in keys},
        "programs": {k: program for k in keys},
    }

  def fingerprint(self, **fields: Any) -> dict:
    """`fields` as they are: the function's data are its own (not seen here)."""
    return dict(fields)

  def search_fields(self, tuner: str, key: jax.Array, **accounted: Any) -> dict:
    """What the search is (`SearchPlan.search_fields`'s counterpart): the tuner, the key, the
    grid, both functions' identities and the arguments that decide the draw or the release.
    Warns when a function cannot be identified (a run directory of the search then cannot be
    resumed)."""
    for name, identity in self._identities.items():
      why = identity.get(UNIDENTIFIED)
      if why is not None:
        warnings.warn(f"{name} holds a value jaxdp cannot identify ({why}): a run_dir of this "
                      "search can never be resumed (each call counts as another function)",
                      stacklevel=4)
    # Digests only: an identity holds the values a function reads (a global list of data, say),
    # and a mismatch message prints what differs.
    identities = {name: {"name": function_name(fn), "sha256": hashlib.sha256(json.dumps(
        self._identities[name], sort_keys=True).encode()).hexdigest()}
        for name, fn in (("train_fn", self.function.train_fn),
                         ("dp_event_fn", self.function.dp_event_fn))}
    return dict(tuner=tuner, key=key_digest(key), points=[dict(p) for p in self.points],
                **identities, noise_parameter=self.function.noise_parameter,
                accounted={k: repr(v) for k, v in sorted(accounted.items())},
                jaxdp=jaxdp.__version__)

  def record(self, candidate: Candidate, result: FunctionResult) -> tuple:
    """(the pool record of a trained candidate, the arrays stored with it)."""
    structure, leaves = result.stored if result.stored is not None else artifacts.encode(None)
    return ({"id": candidate.id, "point": dict(candidate.point), "seed": candidate.seed,
             "call_seed": result.seed, "score": result.score, "wall_time_s": result.wall_time_s,
             "artifact": structure,
             "dp_event": scrub(repr(self.run_of(candidate.config).dp_event))}, leaves)

  def result(self, candidate: Candidate, record: Mapping[str, Any], leaves) -> FunctionResult:
    """The `FunctionResult` a pool record (and its arrays, None when not read) stands for."""
    return FunctionResult(score=float(record["score"]), wall_time_s=float(record["wall_time_s"]),
                          seed=int(record["call_seed"]),
                          stored=None if leaves is None else (record["artifact"], leaves))


def _score(value: Any, hparams: Mapping[str, Any]) -> float:
  """`train_fn`'s score as a float; ValueError unless it is a real number (a one-element
  NumPy, JAX or PyTorch array included)."""
  item = getattr(value, "item", None)
  if callable(item) and not isinstance(value, (bool, str, bytes, numbers.Number)):
    try:
      value = item()
    except Exception:  # pylint: disable=broad-except  # more than one element: refused below
      pass
  if isinstance(value, np.generic):
    value = value.item()
  message = (f"train_fn must return (score, artifact) with a real score (higher is better), got "
             f"a score of type {type(value).__name__} ({value!r:.100}) for hyperparameters "
             f"{dict(hparams)}")
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise ValueError(message)
  try:
    return float(value)
  except OverflowError:  # an int beyond float's range
    raise ValueError(message + ", beyond a float's range") from None


def call(plan: FunctionPlan, candidate: Candidate) -> FunctionResult:
  """One call of `plan.function.train_fn` for `candidate`, its output checked.

  Raises:
    TrainFunctionError: the function raised (its exception is the cause).
    ValueError: it returned something else than a (score, artifact) tuple with a real score.
  """
  run = plan.run_of(candidate.config)
  seed = call_seed(candidate)
  began = time.perf_counter()
  try:
    # Which programs a call compiles tells which candidates were drawn, and how many: jaxdp
    # training inside it (`train_candidate`...) writes none to the persistent cache.
    with compilation_cache.unwritten():
      out = plan.function.train_fn(copy.deepcopy(dict(run.hparams)),
                                   seed)  # its own: what it mutates stays there
  except Exception as err:
    raise TrainFunctionError(
        f"train_fn raised {type(err).__name__} for hyperparameters {dict(run.hparams)}: {err}. "
        "The search stopped here (candidates stored before it stay in run_dir); "
        "a value train_fn rejects can be rejected by dp_event_fn too, which is called on every grid "
        "point before anything is drawn (the call's seed: this error's .seed)", run.hparams, seed) from err
  elapsed = time.perf_counter() - began
  if not isinstance(out, tuple) or len(out) != 2:
    raise ValueError(f"train_fn must return a (score, artifact) tuple, got {type(out).__name__} "
                     f"({out!r:.100}) for hyperparameters {dict(run.hparams)}")
  # Encoded now, arrays copied: a function that reuses one buffer or model for every call must
  # not change what an earlier candidate releases, and a run directory stores this very form.
  return FunctionResult(score=_score(out[0], run.hparams), stored=artifacts.snapshot(out[1]),
                        wall_time_s=elapsed, seed=seed)


def train_functions(candidates: Sequence[Candidate], plan: FunctionPlan, *, keep_params: bool = True,
                    progress: bool = False,
                    on_chunk: Optional[Callable[[list], None]] = None) -> list:
  """Calls `plan.function.train_fn` once per candidate, in order (what
  `jaxdp.sweep.trainers.LocalTrainer` runs for a `FunctionPlan`).

  Args:
    candidates: candidates drawn from `plan`.
    plan: their `FunctionPlan`.
    keep_params: keep each artifact in its result.
    progress: a progress bar with ETA.
    on_chunk: called with [(candidate, result)] after each call: a durable store writes it
      before the next call starts.

  Returns:
    One `FunctionResult` per candidate.
  """
  plan.check_candidates(candidates)
  results = []
  with candidates_bar(len(candidates), progress) as bar:
    for c in candidates:
      result = call(plan, c)
      if not keep_params:
        result = dataclasses.replace(result, stored=None)
      results.append(result)
      if on_chunk is not None:
        on_chunk([(c, result)])
      bar.update(1)
  return results
