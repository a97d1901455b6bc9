"""Trainer objects (`jaxdp.sweep.trainers`): options refused when built, plans refused before any
draw, and any object with the protocol's methods trains a search to the same release."""

import jax
import numpy as np
import pytest

from examples import dp_logistic_regression as ex
from jaxdp import accounting as acc
from jaxdp.sweep import LocalTrainer, RayTrainer, TrainFunction, build_plan
from jaxdp.tuning import RunConfig, random_search

GRID = {"learning_rate": [0.3, 1.0]}

BAD_OPTIONS = [
    ("per_device_zero", lambda: LocalTrainer(max_candidates_per_device=0),
     r"max_candidates_per_device must be an integer in \[1, inf\), got 0"),
    ("devices_empty", lambda: LocalTrainer(devices=[]), "devices must not be empty"),
    ("devices_string", lambda: LocalTrainer(devices="cpu"),
     "devices must be a non-empty sequence of jax.Device"),
    ("progress_string", lambda: LocalTrainer(progress="yes"),
     r"progress must be a bool \(True or False\), got 'yes'"),
    ("on_chunk_not_callable", lambda: LocalTrainer(on_chunk=3),
     "on_chunk must be a callable or None, got 3"),
    ("chunk_size_zero", lambda: RayTrainer(chunk_size=0),
     r"chunk_size must be an integer in \[1, inf\), got 0"),
    ("num_cpus_negative", lambda: RayTrainer(num_cpus=-1), r"num_cpus must be in \[0.0, inf\)"),
    ("num_gpus_nan", lambda: RayTrainer(num_gpus=float("nan")), "num_gpus must be finite, got nan"),
    ("max_retries_negative", lambda: RayTrainer(max_retries=-1),
     r"max_retries must be an integer in \[0, inf\)"),
    ("address_bad", lambda: RayTrainer(address="nowhere"),
     "address must be None, 'auto', 'local' or 'host:port'"),
    ("local_not_a_trainer", lambda: RayTrainer(local="local"), "local must be a LocalTrainer, got str"),
    ("run_config_trainer", lambda: RunConfig(trainer="ray"),
     "trainer must be None, a jaxdp.sweep.LocalTrainer or RayTrainer"),
]


@pytest.mark.parametrize("make,match", [c[1:] for c in BAD_OPTIONS], ids=[c[0] for c in BAD_OPTIONS])
def test_a_bad_option_is_refused_when_the_trainer_is_built(make, match):
  with pytest.raises(ValueError, match=match):
    make()


def test_on_chunk_warns_that_it_sees_the_whole_search():
  with pytest.warns(UserWarning, match="on_chunk receives every trained candidate"):
    LocalTrainer(on_chunk=lambda chunk: None)


def test_a_training_function_is_given_no_devices():
  plan = build_plan(TrainFunction(ex.train_fn, ex.dp_event), {"learning_rate": [0.3],
                    "l2_clip_norm": [0.5], "sampling_prob": [0.1], "steps": [5],
                    "noise_multiplier": [4.0]}, None)
  LocalTrainer().check(plan)
  with pytest.raises(ValueError, match="a TrainFunction picks its own devices"):
    LocalTrainer(devices=jax.devices()[:1]).check(plan)
  with pytest.raises(ValueError, match="a TrainFunction picks its own devices"):
    LocalTrainer(max_candidates_per_device=1).check(plan)


def test_the_trainers_check_runs_before_k_is_drawn(digits, base_config, monkeypatch):
  # Whether a call fails must never depend on K: the tuner asks `check(plan)` first.
  def drawn(*args, **kwargs):
    raise AssertionError("K was drawn before the trainer checked the plan")
  monkeypatch.setattr(acc.Poisson, "sample", drawn)

  class Refusing:
    def check(self, plan):
      raise ValueError(f"this trainer cannot train {len(plan)} grid points")

    def __call__(self, candidates, plan, **kwargs):
      raise AssertionError("trained")

  with pytest.raises(ValueError, match="this trainer cannot train 2 grid points"):
    random_search(base_config, GRID, digits, distribution=acc.Poisson(mean=2), key=jax.random.key(0),
                  run_config=RunConfig(trainer=Refusing()))


def test_any_object_with_the_protocol_trains_the_same_release(digits, base_config, two_devices):
  calls = []

  class Delegating:
    """Not a jaxdp trainer: a user's, with the protocol's two methods."""

    def check(self, plan):
      calls.append(("check", len(plan)))

    def __call__(self, candidates, plan, **kwargs):
      calls.append(("train", len(candidates)))
      return LocalTrainer(devices=two_devices)(candidates, plan, **kwargs)

  kwargs = dict(distribution=acc.Poisson(mean=2), key=jax.random.key(5))
  mine = random_search(base_config, GRID, digits, run_config=RunConfig(trainer=Delegating()), **kwargs)
  local = random_search(base_config, GRID, digits,
                        run_config=RunConfig(trainer=LocalTrainer(devices=two_devices)), **kwargs)
  assert calls[0] == ("check", 2) and sum(n for what, n in calls[1:] if what == "train") >= 1
  assert mine.hyperparameters == local.hyperparameters and mine.score == local.score
  for a, b in zip(jax.tree.leaves(mine.params), jax.tree.leaves(local.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_trainers_are_frozen_values_that_compare_by_options():
  assert LocalTrainer() == LocalTrainer() and RayTrainer(chunk_size=2) != RayTrainer(chunk_size=3)
  with pytest.raises(AttributeError):
    LocalTrainer().progress = True  # frozen: a RunConfig's trainer cannot change under a search


# -- a trainer's contract, held by the store on every path -------------------------------------

FUNCTION_GRID = {"lr": [1, 2, 3, 4, 5, 6]}


def _train_fn(hparams, seed):
  return float(hparams["lr"]), {"lr": hparams["lr"]}


FUNCTION = TrainFunction(_train_fn, lambda hparams: acc.PureDp(0.5))


class _Wrapping:
  """A user's trainer around `LocalTrainer`, changing what it returns or reports."""

  def __init__(self, change_returned=None, change_reported=None):
    self.change_returned, self.change_reported = change_returned, change_reported

  def __call__(self, candidates, plan, *, on_chunk=None, **kwargs):
    pairs = []
    results = LocalTrainer()(candidates, plan, on_chunk=pairs.extend, **kwargs)
    if self.change_reported:
      pairs = self.change_reported(pairs)
    on_chunk(pairs)
    return self.change_returned(results) if self.change_returned else results


@pytest.mark.parametrize("run_dir", [False, True], ids=["memory", "run_dir"])
def test_the_release_follows_the_reported_pairs_not_the_returned_order(run_dir, tmp_path):
  kwargs = dict(distribution=acc.Fixed(4), key=jax.random.key(3))
  local = random_search(FUNCTION, FUNCTION_GRID, **kwargs)
  reversed_ = random_search(FUNCTION, FUNCTION_GRID, **kwargs, run_config=RunConfig(
      tmp_path if run_dir else None, _Wrapping(change_returned=lambda results: results[::-1])))
  assert reversed_.hyperparameters == local.hyperparameters == {"lr": local.params["lr"]}
  assert reversed_.unreleased.all_scores == local.unreleased.all_scores


@pytest.mark.parametrize("run_dir", [False, True], ids=["memory", "run_dir"])
@pytest.mark.parametrize("wrapping,match", [
    (_Wrapping(change_returned=lambda results: results[:1]),
     "without reporting one result per candidate"),
    (_Wrapping(change_reported=lambda pairs: pairs[1:]), "without reporting one result per candidate"),
    (_Wrapping(change_reported=lambda pairs: pairs + pairs[:1]),
     "a candidate it was not given, or one twice"),
    (_Wrapping(change_reported=lambda pairs: [(c, r) for (c, _), (_, r) in zip(pairs,
                                                                               pairs[1:] + pairs[:1])]),
     "a result of another candidate's call"),
], ids=["returns-fewer", "reports-fewer", "reports-twice", "mislabels"])
def test_a_trainer_that_breaks_its_contract_is_refused_and_nothing_wrong_is_stored(wrapping, match,
                                                                                   run_dir,
                                                                                  tmp_path):
  with pytest.raises(RuntimeError, match=match):
    random_search(FUNCTION, FUNCTION_GRID, distribution=acc.Fixed(4), key=jax.random.key(3),
                  run_config=RunConfig(tmp_path if run_dir else None, wrapping))
  if run_dir and match.startswith("a "):  # refused in on_chunk, before the pool appends
    assert not (tmp_path / "results.jsonl").exists() or not (tmp_path / "results.jsonl").read_text()


@pytest.mark.parametrize("trainer,match", [
    (LocalTrainer, "got <class 'jaxdp.sweep.trainers.LocalTrainer'>"),
    (lambda: None, "missing a required argument|too many positional arguments"),
    (lambda candidates, plan: [], "unexpected keyword argument"),
], ids=["a-class", "no-arguments", "no-keywords"])
def test_a_trainer_that_cannot_be_called_as_one_is_refused_when_configured(trainer, match):
  with pytest.raises(ValueError, match=match):
    RunConfig(trainer=trainer)


def test_a_plan_ray_cannot_send_is_refused_before_the_search_draws(monkeypatch):
  pytest.importorskip("ray")
  import threading  # pylint: disable=g-import-not-at-top
  lock = threading.Lock()

  def holds_a_lock(hparams, seed):
    with lock:
      return 1.0, None

  def drawn(*args, **kwargs):
    raise AssertionError("K was drawn before the plan was found unsendable")
  monkeypatch.setattr(acc.Poisson, "sample", drawn)
  with pytest.raises(ValueError, match=r"cannot be sent to Ray workers.*cannot pickle '_thread.lock'"):
    random_search(TrainFunction(holds_a_lock, lambda hparams: acc.PureDp(0.5)), {"lr": [1, 2]},
                  distribution=acc.Poisson(mean=2), key=jax.random.key(0),
                  run_config=RunConfig(trainer=RayTrainer(chunk_size=1)))
