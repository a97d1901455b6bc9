"""A private search over any DP training function (issue 35), end to end on the NumPy example.

`examples/dp_logistic_regression.py` is DP-SGD logistic regression in plain
NumPy; here it is tuned by `random_search` / `threshold_search` / `dry_run`
through the protocol `train_fn(hparams, seed) -> (score, artifact)`,
`dp_event_fn(hparams) -> DpEvent`, as a `TrainFunction`. Every epsilon is compared with the one built
by hand from the same events in the same process, so exactly.
"""

import math
import os
import pickle

import dp_accounting as dpa
import jax
import numpy as np
import pytest

from examples import dp_logistic_regression as ex
from jaxdp import accounting as acc
from jaxdp.sweep import SearchMismatchError, artifacts
from jaxdp.sweep.functions import FunctionPlan, TrainFunctionError, call_seed
from jaxdp.train import NotPrivateWarning
from jaxdp.tuning import (LocalTrainer, RunConfig, TrainFunction, TunedResult, draws, dry_run,
                          random_search, threshold_search)

GRID = dict(ex.GRID, noise_multiplier=[4.0])  # every candidate's event: dpsgd_event(0.1, 4.0, 200)
K = acc.Poisson(mean=5)
EVENT = acc.dpsgd_event(0.1, 4.0, 200)


class Counted:
  """`train_fn` that records the seed of every call."""

  def __init__(self, fn=ex.train_fn):
    self.fn, self.seeds = fn, []

  def __call__(self, hparams, seed):
    self.seeds.append(seed)
    return self.fn(hparams, seed)


def _k(key, grid=GRID, law=K):
  """K of the search with `key`, drawn apart from the search (the same draw)."""
  return len(draws.draw_search(FunctionPlan.build(TrainFunction(ex.train_fn, ex.dp_event), grid), law,
                               key))


def test_example_end_to_end_calls_k_times_accounts_by_hand_and_resumes(tmp_path):
  key = jax.random.key(1)
  train = Counted()
  result = random_search(TrainFunction(train, ex.dp_event), GRID, distribution=K, key=key,
                         run_config=RunConfig(run_dir=str(tmp_path)))
  assert isinstance(result, TunedResult) and result.config is None
  k = _k(key)
  assert k >= 2 and result.unreleased.num_candidates == k
  assert len(set(train.seeds)) == len(train.seeds) == k  # distinct candidates here, each called once
  # The whole search's epsilon, built by hand: K-law repetition of one run's event.
  assert result.epsilon == acc.epsilon(acc.RepeatAndSelect(EVENT, K), 1e-5)
  assert result.event == acc.RepeatAndSelect(EVENT, K)
  # What is released: the best candidate, with the hyperparameters and seed it was called with.
  assert result.hyperparameters == {"learning_rate": result.hyperparameters["learning_rate"],
                                    "l2_clip_norm": result.hyperparameters["l2_clip_norm"],
                                    "sampling_prob": 0.1, "steps": 200, "noise_multiplier": 4.0}
  again = ex.train_fn(result.hyperparameters, result.unreleased.seed)
  assert result.score == again[0] and math.isfinite(result.score)
  np.testing.assert_array_equal(result.params["w"], again[1]["w"])
  assert result.unreleased.resumed == 0
  # A rerun on the same run_dir calls the function 0 times and releases the same.
  rerun = Counted()
  second = random_search(TrainFunction(rerun, ex.dp_event), GRID, distribution=K, key=key,
                         run_config=RunConfig(run_dir=str(tmp_path)))
  assert rerun.seeds == []
  assert (second.hyperparameters, second.score, second.unreleased.seed, second.epsilon) == \
      (result.hyperparameters, result.score, result.unreleased.seed, result.epsilon)
  np.testing.assert_array_equal(second.params["w"], result.params["w"])
  assert type(second.params["b"]) is type(result.params["b"])  # pylint: disable=unidiomatic-typecheck
  assert second.unreleased.resumed == k
  # Another key on that run_dir is another draw: refused before anything is called.
  other = Counted()
  with pytest.raises(SearchMismatchError, match="key"):
    random_search(TrainFunction(other, ex.dp_event), GRID, distribution=K, key=jax.random.key(2),
                  run_config=RunConfig(run_dir=str(tmp_path)))
  assert other.seeds == []


def test_without_run_dir_the_same_key_gives_the_same_seeds_and_release():
  key = jax.random.key(3)
  first, second = Counted(), Counted()
  a = random_search(TrainFunction(first, ex.dp_event), GRID, distribution=K, key=key)
  b = random_search(TrainFunction(second, ex.dp_event), GRID, distribution=K, key=key)
  assert first.seeds == second.seeds and len(first.seeds) == a.unreleased.num_candidates == _k(key)
  assert (a.hyperparameters, a.score, a.unreleased.seed) == (b.hyperparameters, b.score, b.unreleased.seed)
  assert all(0 <= s < 2**63 for s in first.seeds)


def test_a_grid_of_several_events_is_accounted_as_uniform_candidates():
  grid = dict(GRID, steps=[100, 200])
  result = random_search(TrainFunction(ex.train_fn, ex.dp_event), grid, distribution=K,
                         key=jax.random.key(0))
  events = [acc.dpsgd_event(0.1, 4.0, 100), acc.dpsgd_event(0.1, 4.0, 200)]
  assert result.epsilon == acc.epsilon(acc.RepeatAndSelect(acc.UniformCandidates(events), K), 1e-5)


def test_target_epsilon_calibrates_the_declared_noise_through_dp_event():
  train = Counted()
  result = random_search(TrainFunction(train, ex.dp_event, noise_parameter="noise_multiplier"), ex.GRID,
                         distribution=K, key=jax.random.key(0), target_epsilon=2.0)
  sigma = result.noise_multiplier
  assert result.hyperparameters["noise_multiplier"] == sigma
  by_hand = acc.RepeatAndSelect(acc.dpsgd_event(0.1, sigma, 200), K)
  assert result.epsilon == acc.epsilon(by_hand, 1e-5) <= 2.0
  # The smallest such noise, within calibrate's 0.1%.
  assert acc.epsilon(acc.RepeatAndSelect(acc.dpsgd_event(0.1, sigma / 1.002, 200), K), 1e-5) > 2.0


def test_dry_run_accounts_the_same_and_never_calls_the_function(no_work):
  report = dry_run(TrainFunction(ex.train_fn, ex.dp_event), GRID, distribution=K)
  assert report.epsilon == acc.epsilon(acc.RepeatAndSelect(EVENT, K), 1e-5)
  assert report.groups == () and report.expected_steps is None
  text = str(report)
  assert "examples.dp_logistic_regression.train_fn" in text and "E[calls]=5" in text


def test_threshold_search_releases_the_first_candidate_that_reaches_it():
  train = Counted()
  result = threshold_search(TrainFunction(train, ex.dp_event), GRID, threshold=0.9,
                            distribution=acc.Geometric(gamma=0.5), key=jax.random.key(0),
                            )
  assert result.epsilon == acc.epsilon(acc.ThresholdSelect(EVENT, 0.5, None), 1e-5)
  assert result.unreleased.num_candidates == len(train.seeds) and result.score >= 0.9
  assert result.unreleased.seed == train.seeds[-1]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_score_counts_as_the_worst(bad):
  """+inf too: it must not be selected, nor reach a threshold."""
  def train(hparams, seed):
    return (bad if hparams["learning_rate"] == 3.0 else 0.5 + hparams["learning_rate"] / 10), None
  grid = {"learning_rate": [0.3, 1.0, 3.0], "noise_multiplier": [4.0], "l2_clip_norm": [1.0],
          "sampling_prob": [0.1], "steps": [200]}
  result = random_search(TrainFunction(train, ex.dp_event), grid, distribution=acc.Poisson(mean=20),
                         key=jax.random.key(0))
  assert result.hyperparameters["learning_rate"] == 1.0 and result.score == 0.6
  only_bad = threshold_search(TrainFunction(lambda hp, seed: (bad, None), ex.dp_event), grid,
                              threshold=-1e300, distribution=acc.Fixed(1),
                              key=jax.random.key(0))
  assert only_bad.hyperparameters is None and math.isnan(only_bad.score)


@pytest.mark.parametrize("score", [np.float32(0.25), np.array(0.25), jax.numpy.asarray(0.25), 1])
def test_scores_may_be_numpy_or_jax_scalars(score):
  result = random_search(TrainFunction(lambda hp, seed: (score, None), ex.dp_event), GRID,
                         distribution=acc.Fixed(2),
                         key=jax.random.key(0))
  assert result.score == float(score) and type(result.score) is float  # pylint: disable=unidiomatic-typecheck


# --- Bad input fails fast and clearly, before K is drawn where it can. ------------------------


@pytest.mark.parametrize("kwargs, match", [
    (dict(dp_event_fn=lambda hp: "not an event"),
     r"dp_event_fn must return a dp_accounting.DpEvent .*str"),
    (dict(dp_event_fn=lambda hp: dpa.UnsupportedDpEvent()), "cannot account UnsupportedDpEvent"),
    (dict(dp_event_fn=lambda hp, box=[]: box.append(0) or dpa.GaussianDpEvent(len(box))),
     "two different events"),
    (dict(grid={"learning_rate": -1.0}), r"search_space\['learning_rate'\] must be a non-empty sequence"),
    (dict(grid={}), "search_space must be a non-empty mapping"),
    (dict(grid=dict(GRID, learning_rate=[1.0, -1.0])), "learning_rate must be a number in"),
    (dict(data=object()), "data must be None when tuning a TrainFunction"),
    (dict(initial_params={"w": 1}), "initial_params must be None"),
    (dict(run_config=RunConfig(trainer=LocalTrainer(devices=jax.devices()))),
     "options of jaxdp's training engine"),
    (dict(target_epsilon=1.0), r"target_epsilon needs TrainFunction\(noise_parameter=...\)"),
    (dict(target_epsilon=1.0, noise_parameter="noise_multiplier"),
     "target_epsilon sets 'noise_multiplier' for the whole search: remove it"),
    (dict(target_epsilon=1.0, noise_parameter="sigma"), "does not read noise_parameter='sigma'"),
    (dict(grid=ex.GRID), r"dp_event_fn raised KeyError for hyperparameters \{'learning_rate': 0.3"),
    (dict(grid=ex.GRID, target_epsilon=1e-3, noise_parameter="noise_multiplier"),
     "target_epsilon=0.001 is out of reach for this search: even noise_multiplier=1000.0"),
    (dict(grid={"sigma": [float("nan"), 0.5]}, dp_event_fn=lambda hp: dpa.GaussianDpEvent(hp["sigma"])),
     r"noise_multiplier is NaN"),
    (dict(grid={"sigma": [0.0]}, dp_event_fn=lambda hp: dpa.LaplaceDpEvent(hp["sigma"])),
     "the search's events cannot be accounted"),
    (dict(grid={"size": [(64, 64), [64, 64]]}), "are the same candidate"),
    (dict(grid={"activation": [np.tanh]}), "must be JSON values"),
    (dict(key=0), "key"),
    (dict(distribution=5), "distribution must be"),
])
def test_bad_arguments_fail_before_anything_is_drawn_or_called(no_work, kwargs, match):
  function = {k: kwargs.pop(k) for k in ("dp_event_fn", "noise_parameter") if k in kwargs}
  args = dict(grid=GRID, distribution=K, key=jax.random.key(0))
  args.update(kwargs)
  grid = args.pop("grid")
  with pytest.raises(ValueError, match=match):
    random_search(TrainFunction(ex.train_fn, **{"dp_event_fn": ex.dp_event, **function}), grid,
                  **args)


@pytest.mark.parametrize("kwargs, match", [
    (dict(dp_event_fn=None), "dp_event_fn must be a callable"),
    (dict(dp_event_fn="event"), "dp_event_fn must be a callable"),
    (dict(train_fn=3), "train_fn must be a callable"),
    (dict(noise_parameter=""), "noise_parameter must be None or the name of a hyperparameter"),
])
def test_a_train_function_is_checked_when_built(kwargs, match):
  with pytest.raises(ValueError, match=match):
    TrainFunction(**{"train_fn": ex.train_fn, "dp_event_fn": ex.dp_event, **kwargs})


def test_a_run_config_is_checked_when_built():
  with pytest.raises(ValueError, match="run_dir must be None or a directory path"):
    RunConfig(run_dir=3)


def test_a_train_function_is_not_a_config(no_work, digits):
  with pytest.raises(ValueError, match="the trainable must be a TrainConfig, a SearchSpace or a "
                                       "jaxdp.tuning.TrainFunction, got function"):
    random_search(ex.train_fn, GRID, digits, distribution=K, key=jax.random.key(0))


@pytest.mark.parametrize("returned, match", [
    (0.5, r"must return a \(score, artifact\) tuple, got float"),
    ([0.5, None], r"must return a \(score, artifact\) tuple, got list"),
    ((0.5,), r"must return a \(score, artifact\) tuple, got tuple"),
    (("high", None), "real score .* got a score of type str"),
    ((True, None), "real score .* got a score of type bool"),
    ((np.ones(3), None), "real score .* got a score of type ndarray"),
    ((1 + 2j, None), "real score .* got a score of type complex"),
    ((10**400, None), "beyond a float's range"),
])
def test_a_bad_return_fails_at_the_first_call_naming_the_candidate(returned, match):
  calls = []

  def train(hparams, seed):
    calls.append(seed)
    return returned
  with pytest.raises(ValueError, match=match) as err:
    random_search(TrainFunction(train, ex.dp_event), GRID, distribution=K, key=jax.random.key(0))
  # The seed is the call's noise: never in a message that a log may keep (issue 42).
  assert len(calls) == 1 and "hyperparameters {" in str(err.value) and str(calls[0]) not in str(err.value)


def test_a_value_only_train_fn_rejects_stops_the_search_at_its_first_candidate(tmp_path):
  calls = []

  def train(hparams, seed):
    calls.append(hparams["learning_rate"])
    if hparams["learning_rate"] > 2.0:
      raise ValueError(f"learning_rate={hparams['learning_rate']} diverges in my trainer")
    return ex.train_fn(hparams, seed)
  with pytest.raises(TrainFunctionError, match=r"raised ValueError for hyperparameters \{.*'learning_rate': 3.0") as err:
    random_search(TrainFunction(train, ex.dp_event), GRID, distribution=acc.Poisson(mean=30),
                  key=jax.random.key(0),
                  run_config=RunConfig(run_dir=str(tmp_path)))
  assert isinstance(err.value.__cause__, ValueError)
  assert calls[-1] == 3.0 and calls.count(3.0) == 1  # nothing after it was called
  with open(tmp_path / "results.jsonl") as f:  # the ones before it are stored
    assert len(f.read().splitlines()) == len(calls) - 1


# --- Artifacts: arrays where they are arrays, pickle otherwise. ---------------------------------


class Model:
  """A stand-in for a PyTorch module or a scikit-learn estimator: neither arrays nor a dict."""

  def __init__(self, w):
    self.w = w

  def __eq__(self, other):
    return isinstance(other, Model) and np.array_equal(self.w, other.w)


@pytest.mark.parametrize("artifact, pickled", [
    (None, False), (1.5, False), (float("nan"), False), (7, False), (2**80, False), (True, False),
    ("text", False), (np.float32(2.5), False), (np.arange(6, dtype=np.int16).reshape(2, 3), False),
    (jax.numpy.ones(3, jax.numpy.bfloat16), False),
    ({"w": np.ones(2), "meta": [1, (2.0, None)], "nested": {"b": np.float64(0.5)}}, False),
    (Model(np.ones(2)), True), ({1: np.ones(1)}, True), (np.array(["a", "b"]), True),
    (np.array([object()]), True), (jax.random.key(3), True),
])
def test_artifacts_round_trip_in_type_and_bits(artifact, pickled):
  structure, leaves = artifacts.encode(artifact)
  assert (structure[0] == "pickle") == pickled
  # Through the raw bytes a pool stores (each array as uint8, read back by its dtype and shape).
  stored = [np.frombuffer(np.ascontiguousarray(a).reshape(-1).view(np.uint8).tobytes(),
                          dtype=jax.numpy.dtype(str(a.dtype))).reshape(a.shape) for a in leaves]
  back = artifacts.decode(structure, stored)
  if pickled and isinstance(artifact, np.ndarray) and artifact.dtype == object:
    assert back.shape == artifact.shape
    return
  assert type(back) is type(artifact)  # pylint: disable=unidiomatic-typecheck
  flat = lambda t: jax.tree.leaves(t, is_leaf=lambda x: x is None)
  if isinstance(artifact, jax.Array) and jax.numpy.issubdtype(artifact.dtype, jax.dtypes.prng_key):
    np.testing.assert_array_equal(jax.random.key_data(back), jax.random.key_data(artifact))
    return
  for a, b in zip(flat(artifact), flat(back)):
    if isinstance(a, float) and math.isnan(a):
      assert math.isnan(b)
    else:
      assert type(a) is type(b) and np.array_equal(np.asarray(a), np.asarray(b))  # pylint: disable=unidiomatic-typecheck
      assert getattr(a, "dtype", None) == getattr(b, "dtype", None)


def test_a_container_that_holds_itself_is_pickled_with_its_reference():
  loop = [np.ones(1)]
  loop.append(loop)
  structure, leaves = artifacts.encode(loop)
  back = artifacts.decode(structure, leaves)
  assert structure[0] == "pickle" and back[1] is back


def test_a_wrapper_is_recorded_with_what_it_wraps():
  import functools  # pylint: disable=g-import-not-at-top
  from jaxdp.sweep.identity import function_identity  # pylint: disable=g-import-not-at-top
  plain = function_identity(ex.train_fn)
  assert function_identity(functools.lru_cache(ex.train_fn))["wraps"] == plain
  assert function_identity(jax.jit(ex.dp_event))["wraps"] == function_identity(ex.dp_event)
  assert plain["name"] == "examples.dp_logistic_regression.train_fn" and plain["code_sha256"]


def _train_on(hparams, seed, x=None):
  return float(np.sum(x)), None


class _Slotted:
  __slots__ = ("x",)

  def __init__(self, x):
    self.x = x

  def __call__(self, hparams, seed):
    return float(np.sum(self.x)), None


def _decorated(x):
  def decorator(fn):
    @__import__("functools").wraps(fn)
    def wrapper(hparams, seed):
      return fn(hparams, seed, x=x)
    return wrapper
  return decorator(_train_on)


def _nested(x, depth):
  fn = lambda hparams, seed: (float(np.sum(x)), None)  # noqa: E731
  for _ in range(depth):
    fn = (lambda inner: lambda hparams, seed: inner(hparams, seed))(fn)
  return fn


@pytest.mark.parametrize("make", [
    lambda x: __import__("functools").partial(_train_on, x=x),
    lambda x: jax.jit(__import__("functools").partial(_train_on, x=x)),
    lambda x: __import__("functools").lru_cache(__import__("functools").partial(_train_on, x=x)),
    _decorated, _Slotted, lambda x: _Slotted(x).__call__, lambda x: _nested(x, 5),
], ids=["partial", "jit(partial)", "lru_cache(partial)", "wraps", "slots", "method", "5 closures deep"])
def test_a_function_over_other_data_has_another_identity(make):
  from jaxdp.sweep.identity import function_identity  # pylint: disable=g-import-not-at-top
  a, b = np.zeros(3), np.ones(3)
  assert function_identity(make(a)) == function_identity(make(a.copy()))
  assert function_identity(make(a)) != function_identity(make(b))


def test_two_lambdas_on_one_line_differ():
  from jaxdp.sweep.identity import function_identity  # pylint: disable=g-import-not-at-top
  one, two = (lambda hp, s: (1.0, None)), (lambda hp, s: (2.0, None))  # noqa: E731
  assert function_identity(one) != function_identity(two)


def test_a_function_holding_what_cannot_be_read_is_never_resumed(tmp_path):
  gen = (x for x in range(3))

  def train(hparams, seed):
    return float(next(iter([1.0]))) + 0 * len(str(gen)), None
  args = dict(distribution=K, key=jax.random.key(0), run_config=RunConfig(run_dir=str(tmp_path)))
  with pytest.warns(UserWarning, match="can never be resumed"):
    random_search(TrainFunction(train, ex.dp_event), GRID, **args)
  with pytest.warns(UserWarning, match="can never be resumed"), \
      pytest.raises(SearchMismatchError, match=r"train_fn: another training function"):  # a new nonce each call
    random_search(TrainFunction(train, ex.dp_event), GRID, **args)


def test_an_unpicklable_artifact_is_refused_clearly():
  with pytest.raises(ValueError, match="stored neither as arrays nor by pickle"):
    artifacts.encode({"fn": lambda: None, "w": np.ones(1)})


def test_a_pickled_artifact_survives_a_resume_and_a_damaged_file_is_retrained(tmp_path):
  seeds = []

  def train(hparams, seed):
    seeds.append(seed)
    return ex.train_fn(hparams, seed)[0], Model(np.full(2, seed % 1000, np.float64))
  first = random_search(TrainFunction(train, ex.dp_event), GRID, distribution=K, key=jax.random.key(4),
                        run_config=RunConfig(run_dir=str(tmp_path)))
  assert first.params == Model(np.full(2, first.unreleased.seed % 1000, np.float64))
  for name in os.listdir(tmp_path / "params"):  # every artifact file damaged
    path = tmp_path / "params" / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
  del seeds[:]
  with pytest.warns(UserWarning, match="moved to"):
    second = random_search(TrainFunction(train, ex.dp_event), GRID, distribution=K,
                           key=jax.random.key(4), run_config=RunConfig(run_dir=str(tmp_path)))
  assert len(seeds) == len(set(seeds)) == first.unreleased.num_candidates  # each retrained once
  assert (second.params, second.score, second.unreleased.seed) == (first.params, first.score,
                                                                   first.unreleased.seed)


def test_run_dir_refuses_another_function_or_event(tmp_path):
  random_search(TrainFunction(ex.train_fn, ex.dp_event), GRID, distribution=K, key=jax.random.key(0),
                run_config=RunConfig(run_dir=str(tmp_path)))

  def other_train(hparams, seed):  # another function: another mechanism
    return ex.train_fn(hparams, seed)
  with pytest.raises(SearchMismatchError, match="train_fn"):
    random_search(TrainFunction(other_train, ex.dp_event), GRID, distribution=K, key=jax.random.key(0),
                  run_config=RunConfig(run_dir=str(tmp_path)))
  # The same functions, one grid point's event changed (a noise the function now reads).
  def other_event(hparams):
    return acc.dpsgd_event(0.1, 5.0, 200)
  with pytest.raises(SearchMismatchError, match="dp_event_fn"):
    random_search(TrainFunction(ex.train_fn, other_event), GRID, distribution=K, key=jax.random.key(0),
                  run_config=RunConfig(run_dir=str(tmp_path)))
  with pytest.raises(SearchMismatchError, match="dp_event_fn"):  # the dry run refuses it too
    dry_run(TrainFunction(ex.train_fn, other_event), GRID, distribution=K, key=jax.random.key(0),
            run_config=RunConfig(run_dir=str(tmp_path)))


def test_run_dir_refuses_other_data_a_function_holds(tmp_path):
  """A partial's bound values and a closure's cells are recorded by their bytes: the same
  function over other data is another mechanism."""
  import functools  # pylint: disable=g-import-not-at-top

  def train_on(hparams, seed, data):
    return float(data.sum()) + ex.train_fn(hparams, seed)[0], None
  data = np.arange(4.0)
  args = dict(distribution=K, key=jax.random.key(0), run_config=RunConfig(run_dir=str(tmp_path)))
  fn = lambda train: TrainFunction(train, ex.dp_event)
  random_search(fn(functools.partial(train_on, data=data)), GRID, **args)
  again = functools.partial(train_on, data=data.copy())  # equal data: the same search, resumed
  assert random_search(fn(again), GRID, **args).unreleased.resumed > 0
  other = data.copy()
  other[0] = -1.0
  with pytest.raises(SearchMismatchError, match="train_fn"):
    random_search(fn(functools.partial(train_on, data=other)), GRID, **args)

  def closure_over(values):
    def train(hparams, seed):
      return float(values.sum()), None
    return train
  closure_args = dict(args, run_config=RunConfig(run_dir=str(tmp_path / "closure")))
  random_search(fn(closure_over(data)), GRID, **closure_args)
  assert random_search(fn(closure_over(data.copy())), GRID, **closure_args).unreleased.resumed > 0
  with pytest.raises(SearchMismatchError, match="train_fn"):
    random_search(fn(closure_over(other)), GRID, **closure_args)


@pytest.mark.slow  # three fresh interpreters importing JAX: about 8 s
def test_a_functions_identity_is_the_same_in_another_process():
  """Sets iterate in an order the process's hash seed decides: the identity must not."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  code = ("import json, functools, dataclasses, jax; from jaxdp.sweep.identity import function_identity; "
          "from examples.dp_logistic_regression import train_fn; "
          "Cfg = dataclasses.make_dataclass('Cfg', ['tags']); cfg = Cfg({'a', 'b', 'c', 'd', 'e'}); "
          "fns = [train_fn, functools.partial(train_fn, names={'a', 'b', 'c', 'd'}), "
          "functools.partial(train_fn, cfg=cfg), jax.jit(train_fn), "
          "(lambda hp, s: (1.0 if s in {'x', 'y', 'z'} else 0.0, None))]; "
          "print(json.dumps([function_identity(f) for f in fns], sort_keys=True))")
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=root, env=dict(os.environ, PYTHONHASHSEED=str(h), PYTHONPATH=root)).stdout
          for h in (1, 2, 3)}
  assert len(outs) == 1 and "held" in outs.pop()


def test_a_non_private_event_warns():
  with pytest.warns(NotPrivateWarning, match="epsilon = inf"):
    result = random_search(TrainFunction(lambda hp, seed: (1.0, None),
                                         lambda hp: dpa.NonPrivateDpEvent()), {"a": [1]}, distribution=K,
                           key=jax.random.key(0))
  assert result.epsilon == math.inf


def test_call_seeds_are_63_bits_hashed_from_the_candidates_keys():
  import hashlib  # pylint: disable=g-import-not-at-top
  plan = FunctionPlan.build(TrainFunction(ex.train_fn, ex.dp_event), GRID)
  cands = draws.draw_search(plan, acc.Poisson(mean=50), jax.random.key(0))
  seeds = [call_seed(c) for c in cands]
  # sha256("threefry2x32" + the key's two words, big-endian), its 63 leading bits.
  assert seeds == [int.from_bytes(hashlib.sha256(b"threefry2x32" + np.asarray(
      jax.random.key_data(c.key()), ">u4").tobytes()).digest()[:8], "big") >> 1 for c in cands]
  assert len(set(seeds)) == len({c.id for c in cands}) == len(cands)
  assert all(0 <= s < 2**63 for s in seeds) and max(seeds) >= 2**62  # the high bits are used
  assert pickle.loads(pickle.dumps(plan)).points == plan.points  # a Ray worker gets it whole


def test_a_function_that_mutates_its_hyperparameters_changes_nothing_recorded_or_released():
  seen = []

  def train(hparams, seed):
    seen.append(dict(hparams, sizes=list(hparams["sizes"])))
    hparams["learning_rate"] = 99.0
    hparams["extra"] = [1]
    hparams["sizes"][0] *= 2  # in place, inside a value
    return hparams["l2_clip_norm"], None
  grid = dict(GRID, sizes=[[4, 4]])
  result = random_search(TrainFunction(train, ex.dp_event), grid, distribution=acc.Poisson(mean=10),
                         key=jax.random.key(0))
  assert len(seen) > 2 and all(s["learning_rate"] in GRID["learning_rate"] and "extra" not in s
                               and s["sizes"] == [4, 4] for s in seen)
  assert result.hyperparameters["learning_rate"] in GRID["learning_rate"]
  assert "extra" not in result.hyperparameters and result.hyperparameters["sizes"] == [4, 4]
  assert grid["sizes"] == [[4, 4]]


@pytest.mark.parametrize("durable", [False, True])
def test_a_reused_buffer_releases_the_selected_candidates_values(durable, tmp_path):
  """A function that trains one buffer in place returns the same object every call: what is
  released is the selected call's values, with or without a run_dir."""
  buffer, calls = np.zeros(2), []

  def train(hparams, seed):
    calls.append(hparams["lr"])
    buffer[:] = [hparams["lr"], len(calls)]
    return -abs(hparams["lr"] - 0.1), buffer
  result = random_search(TrainFunction(train, lambda hp: dpa.GaussianDpEvent(5.0)), {"lr": [0.1, 0.5,
                                                                                            0.9]},
                                                                                            distribution=acc.Fixed(6),
                         key=jax.random.key(3),
                         run_config=RunConfig(run_dir=str(tmp_path) if durable else None))
  chosen = calls.index(0.1) + 1
  assert result.hyperparameters == {"lr": 0.1} and result.params.tolist() == [0.1, chosen]
  assert result.params is not buffer
