"""What a tuner returns: the release its epsilon covers, and beside it, marked, what it does not.

A private search's epsilon covers the output of the selection mechanism: the
selected candidate (its hyperparameters or configuration, its parameters or
artifact, its score), or "nothing". The number of candidates K, every seed and
key, the candidates' ids, how many were read back from a `run_dir`, the other
candidates' scores and the subset a search tuned on are the mechanism's
internal randomness and book-keeping: publishing K beside the best turns the
mixture over K that the theorems bound into best-of-k for the published k,
whose cost grows like k-fold composition (REFERENCE §7c; measured in
`tests/tuning/test_results.py`), and a seed with the parameters lets anyone
retrain on both neighbours and see which reproduces them.

So every result holds its release as its own fields, and all the rest in one
field, `unreleased` (an `Unreleased`), which:

  - `repr`/`str` of the result leave out, and whose own repr names its fields
    without their values;
  - `to_json()` and `save(path)` never write (they write the release only, the
    parameters or artifact included, for publication; `load_release` reads it);
  - pickling leaves out: a pickled result is its release (`unreleased` is None
    after unpickling). `copy.copy` and `copy.deepcopy` keep it;
  - is not a dataclass field: `dataclasses.fields`, `asdict` and `astuple`
    see the release only (`replace` keeps it, as a copy does).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
from typing import Any, Mapping, Optional

import numpy as np

import jaxdp
from jaxdp import accounting as acc
from jaxdp.sweep import artifacts
from jaxdp.sweep.space import _json_value, config_record
from jaxdp.train.task import Model, Task

#: The name of a saved release's description (beside its arrays, `ARRAYS`).
RELEASE_JSON = "release.json"
#: The arrays of a saved release's parameters or artifact (`numpy.savez`, read without pickle).
ARRAYS = "arrays.npz"
#: What `save` writes in `RELEASE_JSON`'s "format".
FORMAT = "jaxdp-release-1"


class NothingReleasedWarning(UserWarning):
  """A search released nothing (`TunedResult.hyperparameters` is None): the mechanism as
  designed, not a failure (its epsilon is spent all the same)."""


def nothing_released(tuner: str, why: str, remedy: str) -> str:
  """The `NothingReleasedWarning` text: which search, `why` it can release nothing (the same
  words for every way it can happen) and the `remedy` that makes it rarer."""
  return (f"{tuner} released nothing (hyperparameters, params: None; score: nan): {why}. This "
          f"is the mechanism working as designed, and its epsilon is spent all the same. "
          f"{remedy}").rstrip()


@dataclasses.dataclass(frozen=True, eq=False, repr=False, slots=True)
class Unreleased:
  """What a search computed that its epsilon does NOT cover: never publish any of it.

  Each field is None (or empty) where a search has no such value.

  Attributes:
    num_candidates: how many candidates were trained. `random_search`,
      `subsampled_search`: K, internal randomness; published beside the
      release it is not covered (the pair (K, best) costs up to the k-fold
      composition of one candidate: account it with `acc.SelectionWithCount`). `threshold_search`: how many were tried
      before one reached the threshold, which depends on the data.
    resumed: how many of them (and a subsampled search's final run) were read
      back from `run_dir` instead of trained now (a count of candidates).
    resumed_steps: candidate id -> the step its training resumed at from a
      checkpoint (`ExecutionConfig.checkpoint_every`). Candidate ids hash the
      candidates' keys.
    all_scores: every candidate's (grid point, score), in the order they were drawn.
    seed: the seed a training function's selected call got: all of its
      randomness, its noise included.
    auto_static: hyperparameter -> why it compiled as a static value though a
      float (`jaxdp.train.Task.concrete_hparams`): a property of the grid,
      kept here as a diagnostic, not part of the release.
    subset_mask: `subsampled_search`'s tuning subset X1 over `data.train` (who
      is in it).
    gradient_evaluations: `subsampled_search`'s per-example gradients over
      the K tuning runs and the final one (a function of K).
    baseline_gradient_evaluations: E[K] x (mean over the grid of steps x
      gamma) x N: Papernot-Steinke's expected cost on all of X (public, for
      `compute_ratio`).
  """

  num_candidates: Optional[int] = None
  resumed: int = 0
  resumed_steps: Mapping[str, int] = dataclasses.field(default_factory=dict)
  all_scores: Optional[tuple] = None
  seed: Optional[int] = None
  auto_static: Mapping[str, str] = dataclasses.field(default_factory=dict)
  subset_mask: Optional[np.ndarray] = None
  gradient_evaluations: Optional[float] = None
  baseline_gradient_evaluations: Optional[float] = None

  def __repr__(self) -> str:
    held = [f.name for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None and not _empty(getattr(self, f.name))]
    return f"Unreleased(<not covered by epsilon, not for publication: {', '.join(held)}>)"

  @property
  def compute_ratio(self) -> Optional[float]:
    """`baseline_gradient_evaluations` / `gradient_evaluations` (a subsampled search's saving)."""
    if self.gradient_evaluations is None or self.baseline_gradient_evaluations is None:
      return None
    return self.baseline_gradient_evaluations / self.gradient_evaluations


def _empty(value) -> bool:
  return isinstance(value, (dict, tuple, list)) and not value


@dataclasses.dataclass(frozen=True, eq=False)
class TunedResult:
  """What a private search releases, and apart from it what it does not: one type for
  `random_search` and `threshold_search`, of a jaxdp task or of a training function
  (`SubsampledResult` extends it).

  Privacy assumptions (docs/guides/privacy.md): neighbouring data sets
  differ by adding or removing one private example (training or private
  validation), which is what `event` accounts; the training set size N is
  the declared public `data.num_examples`, never counted from the rows (every
  step divides by q N, and an expected batch size b means q = b / N), and a
  `NoisyMean` divides by its declared `num_examples`; `score_source` says
  where the score came from: a plain score reads `data.test`, which is
  treated as public and is NOT accounted, a DP score reads
  `data.private_validation` and its event is in `event`; a training
  function's score is its contract.

  Attributes:
    hyperparameters: the selected grid point (a training function's: what its `train_fn` was
      called with, the calibrated noise included), or None when nothing is released (K = 0,
      every candidate diverged or had no finite score, or no score reached the threshold): the
      documented default output. Released.
    config: the selected candidate's `TrainConfig` (None likewise, and for a training
      function). Released.
    params: what the selected candidate trained: a task's parameters, or the artifact a
      training function returned beside its score (None likewise; with a `run_dir`, read back
      from there). Released.
    score: its selection score, NaN if nothing is released. Released.
    epsilon: epsilon of the whole search at `delta`. Released.
    delta: target delta. Released.
    event: the accounted DpEvent (public: the configurations and K's law). Released.
    accounting_method: the method that gave `epsilon` ("best" = tightest valid).
    score_source: where the score comes from (see above).
    noise_multiplier: the noise calibrated for `target_epsilon` (a task's sigma, a training
      function's `noise_parameter`), or None.
    unreleased: an `Unreleased`: K (`num_candidates`), a function's `seed`, `resumed`,
      `resumed_steps`, `all_scores`, `auto_static`. Not covered, not for publication; left out
      of repr, `to_json`, `save` and pickling, and not a dataclass field.

  Publishing: every field but `unreleased` is the release and may be
  published (`save`, `to_json`); `unreleased` may not (see `Unreleased`). To
  publish K as well, account for it: `acc.epsilon(acc.SelectionWithCount(result.event),
  result.delta)` (much larger: K published costs up to k runs composed). The
  key must stay secret too: it regenerates every candidate's noise.
  """

  hyperparameters: Optional[Mapping[str, Any]]
  config: Any
  params: Any = dataclasses.field(repr=False)
  score: float
  epsilon: float
  delta: float
  event: Any
  accounting_method: str = "best"
  score_source: str = ""
  noise_multiplier: Optional[float] = None
  # Not a field: `dataclasses.fields`, `asdict` and `astuple` see the release only.
  unreleased: dataclasses.InitVar[Optional[Unreleased]] = None

  def __post_init__(self, unreleased: Optional[Unreleased]):
    object.__setattr__(self, "unreleased", unreleased)

  def to_json(self) -> dict:
    """The release as JSON-safe values (its parameters aside: `save` writes them).

    Holds every released field (a configuration as its record, the event as its repr and
    description) and the jaxdp version; never anything of `unreleased`.
    """
    out = {"format": FORMAT, "kind": type(self).__name__, "jaxdp": jaxdp.__version__}
    for field in dataclasses.fields(self):
      if field.name not in ("params", "event"):
        out[field.name] = _jsonable(getattr(self, field.name))
    out["event"] = None if self.event is None else repr(self.event)
    out["event_description"] = None if self.event is None else acc.describe(self.event)
    return out

  def save(self, path: str) -> str:
    """Writes the release to directory `path` for publication: `release.json` (`to_json`) and
    `arrays.npz` (the parameters or artifact, `jaxdp.sweep.artifacts`'s encoding: arrays as
    raw bytes, anything else pickled). Nothing of `unreleased` is written.

    Returns:
      `path`. Read it back with `jaxdp.tuning.load_release`.

    Raises:
      ValueError: `path` exists and is not an empty directory (a release is never
        overwritten or mixed with other files).
    """
    if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
      raise ValueError(f"path={path!r} exists and is not an empty directory: save a release to a "
                       "new directory")
    os.makedirs(path, exist_ok=True)
    structure, leaves = artifacts.encode(self.params)
    description = dict(self.to_json(), structure=structure)
    np.savez(os.path.join(path, ARRAYS), **{str(i): np.asarray(leaf) for i, leaf in enumerate(leaves)})
    with open(os.path.join(path, RELEASE_JSON), "w", encoding="utf-8") as f:
      json.dump(description, f, indent=1, sort_keys=True)
    return path

  def model(self, task: Task) -> Model:
    """The released model: `task`'s model for the selected configuration's hyperparameters
    (every one the model factory reads, those the grid did not vary included).

    Raises:
      ValueError: nothing was released, the result is a training function's (its artifact is
        `params`, yours to apply), or `task` is not the task the search trained.
    """
    # The hyperparameters the candidate trained with, as they were (the record's are JSON).
    record = None if self.config is None else {"task": self.config.task.name,
                                               "hparams": self.config.hparams}
    return _released_model(task, self.params, self.hyperparameters, record)

  def apply(self, task: Task, inputs: Any) -> Any:
    """The released model's outputs on `inputs` (a batch): `self.model(task).apply(params, inputs)`."""
    return self.model(task).apply(self.params, inputs)

  def __getstate__(self):
    # A pickled result is its release: what is not covered stays in this process.
    state = dict(self.__dict__)
    state["unreleased"] = None
    return state

  def __copy__(self):
    return dataclasses.replace(self)

  def __deepcopy__(self, memo):
    return dataclasses.replace(self, unreleased=copy.deepcopy(self.unreleased, memo),
                               **{f.name: copy.deepcopy(getattr(self, f.name), memo)
                                  for f in dataclasses.fields(self)})


def _jsonable(value: Any) -> Any:
  """`value` as JSON: numbers (non-finite ones by repr), strings, containers, a `TrainConfig`
  as its record (`jaxdp.sweep.space.config_record`)."""
  if hasattr(value, "task") and hasattr(value, "hparams"):
    return config_record(value)
  if isinstance(value, Mapping):
    return {str(k): _jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_jsonable(v) for v in value]
  if isinstance(value, float) and not math.isfinite(value):
    return repr(value)
  return _json_value(value)


@dataclasses.dataclass(frozen=True, eq=False)
class SubsampledResult(TunedResult):
  """What `subsampled_search` releases (Koskela & Kulkarni's tuning on a subset, then one final
  run), and apart from it what it does not: a `TunedResult` whose release is the final model.

  `hyperparameters`, `config`, `params` and `score` are the final run's (the
  tuned hyperparameters after the task's extrapolation, its `TrainConfig`, its
  parameters, its public test score); besides them the release holds what was
  tuned on the subset. Not to be published: `unreleased`: K
  (`num_candidates`), `resumed`, `resumed_steps`, `subset_mask` (who is in
  X1; returned so callers can audit the split), `gradient_evaluations` (a
  function of K) and the `compute_ratio` it gives.

  Privacy assumptions (docs/guides/privacy.md): neighbouring data sets
  differ by adding or removing one training example, as `event` accounts. The
  training set size N is the declared public `data.num_examples`, and every
  size the procedure uses derives from it and q, never from the rows drawn:
  m = `subset_size` = round(q N) and n = `final_train_size` (N - m for
  variant 1, N for variant 2) are the normalisers of the runs on X1 and of
  the final run, and the SGD learning-rate factor n / m is visible in
  `config`: N, m and n are public and revealed exactly (variant 1:
  N = m + n; variant 2: N = n). Candidates must give `sampling_prob` (not an
  expected `batch_size`, whose q = b / N would not be the rate of a run on
  X1). Scores (`tuned_score`, `score`) are the task's public score on
  `data.test`, which is treated as public and not accounted (DP scores on
  private validation data are not supported here: KK's amplification covers
  the subsampled training set only). Of the K candidates only the selected
  one's hyperparameters and score are covered; the others are never
  returned. The key must stay secret (it regenerates the subset and the
  noise).

  Attributes (beside `TunedResult`'s):
    tuned_hyperparameters: the grid point selected on X1 (before extrapolation), or None if
      the search released nothing (then the final run uses the first grid point, a
      data-independent default).
    tuned_score: the selected candidate's score after training on the subset (NaN if nothing
      was released).
    learning_rate_factor: final / tuned learning rate (n / m for DP-SGD, 1 for DP-Adam; 1 if
      the task has no `learning_rate`).
    subset_size: m = round(q N), the declared size of X1 (public; X1's actual size is
      `unreleased.subset_mask.sum()`, private, and may be 0: the candidates then train on
      noise only, as does the final run on an empty final set).
    final_train_size: n, the declared size of the final training set (N - m for variant 1, N
      for variant 2).

    variant: 1 or 2.
    q: subset sampling rate.
  """

  tuned_hyperparameters: Optional[Mapping[str, Any]] = None
  tuned_score: float = float("nan")
  learning_rate_factor: float = 1.0
  subset_size: int = 0
  final_train_size: int = 0
  variant: int = 1
  q: float = 0.0


@dataclasses.dataclass(frozen=True)
class Release:
  """A release read back from disk (`load_release`): what a tuner's result saved (`save`).

  Attributes:
    kind: the result type that saved it ("TunedResult", "SubsampledResult").
    hyperparameters: the released hyperparameters (None: nothing was released).
    score: the released score (NaN: nothing was released).
    epsilon, delta: the guarantee of the whole search.
    event: the accounted DpEvent's repr.
    params: what the search released of the model: a task's parameters, a
      training function's artifact.
    details: the kind's other released fields, as JSON (a configuration as its
      record, `jaxdp.sweep.space.config_record`; non-finite numbers as strings).
  """

  kind: str
  hyperparameters: Optional[Mapping[str, Any]]
  score: float
  epsilon: float
  delta: float
  event: Optional[str]
  params: Any = dataclasses.field(repr=False)
  details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def model(self, task: Task) -> Model:
    """The released model, rebuilt from `task` (the `Task` the search trained: its functions are
    code, not saved) and the released configuration's hyperparameters (`TunedResult.model`).

    Raises:
      ValueError: as `TunedResult.model`.
    """
    return _released_model(task, self.params, self.hyperparameters, self.details.get("config"))

  def apply(self, task: Task, inputs: Any) -> Any:
    """The released model's outputs on `inputs` (a batch): `self.model(task).apply(params, inputs)`."""
    return self.model(task).apply(self.params, inputs)


def _released_model(task: Task, params: Any, hyperparameters: Optional[Mapping[str, Any]],
                    record: Optional[Mapping[str, Any]]) -> Model:
  """`task`'s model for the released configuration `record` (`config_record`'s "task" and
  "hparams")."""
  if hyperparameters is None or params is None:
    raise ValueError("the search released nothing (hyperparameters=None: K = 0, or no candidate "
                     "had a finite score or reached the threshold): there is no model to apply")
  if record is None:
    raise ValueError("a training function's release has no model to rebuild: its artifact is "
                     "`params`, in the form the training function returned it")
  if not isinstance(task, Task):
    raise ValueError(f"task must be the jaxdp.train.Task the search trained, got {task!r:.200}")
  if task.name != record["task"]:
    raise ValueError(f"task={task.name!r} is not the task the search trained ({record['task']!r}): "
                     "its model would not fit the released parameters")
  # The configuration's hyperparameters, not only the grid point: a model factory may read
  # a value the grid did not vary (`hparams=dict(model="mlp")` on the base configuration).
  return task.model_for(dict(record["hparams"]))


def _number(value) -> float:
  return float(value) if isinstance(value, str) else value


def load_release(path: str) -> Release:
  """The release `save` wrote to directory `path`.

  A training function's artifact that was not arrays is read by unpickling: it
  runs code the file names, so load only releases you trust like code.

  Raises:
    ValueError: `path` holds no release, or one of another format.
  """
  try:
    with open(os.path.join(path, RELEASE_JSON), encoding="utf-8") as f:
      description = json.load(f)
  except (OSError, json.JSONDecodeError) as err:
    raise ValueError(f"path={path!r} holds no readable jaxdp release ({RELEASE_JSON}): {err}") from err
  if description.get("format") != FORMAT:
    raise ValueError(f"path={path!r} holds a release of format {description.get('format')!r}; "
                     f"this jaxdp reads {FORMAT!r}")
  with np.load(os.path.join(path, ARRAYS), allow_pickle=False) as arrays:
    leaves = [arrays[str(i)] for i in range(len(arrays.files))]
  params = artifacts.decode(description.pop("structure"), leaves)
  common = {name: description.pop(name) for name in ("kind", "hyperparameters", "score", "epsilon",
                                                      "delta", "event")}
  description.pop("format")
  for name in ("score", "epsilon", "delta"):
    common[name] = _number(common[name])
  return Release(params=params, details=description, **common)
