"""The distinguishing game over jaxdp's own private search."""

import math
import warnings

import jax
import numpy as np
import pytest

from jaxdp import accounting as acc
from jaxdp.audit import attacks, game
from jaxdp.sweep import engine
from jaxdp.tuning import LocalTrainer, random_search, RunConfig, TrainFunction


@pytest.fixture(scope="module")
def gadget():
  return attacks.selection_gadget(0.5)


@pytest.fixture(scope="module")
def gadget_audit(gadget, two_devices):
  return game.audit_search(gadget.config, gadget.grid, gadget.without, gadget.with_,
                           distribution=acc.Poisson(mean=3), statistic=gadget.statistic, trials=300,
                           key=jax.random.key(0),
                           run_config=RunConfig(trainer=LocalTrainer(devices=two_devices,
                                                                     max_candidates_per_device=64)))


@pytest.mark.slow  # the shared 300-search audit: 15 s; CI's slow set runs it
def test_audited_lower_bound_never_exceeds_the_accounted_epsilon(gadget_audit):
  res = gadget_audit
  assert not res.violated
  assert set(res.accounted) == {"rdp", "profile", "best"}
  assert 0 <= res.bound.epsilon <= min(res.accounted.values())
  # The gadget leaks: with 300 searches per side the bound is already clearly positive.
  assert res.bound.epsilon > 0.3
  assert res.trials == 300 and res.statistics_with.shape == res.statistics_without.shape == (300,)


@pytest.mark.slow  # the shared 300-search audit: 15 s; CI's slow set runs it
def test_the_game_runs_exactly_the_searches_random_search_runs(gadget, gadget_audit, two_devices):
  # Trial t on D' uses key fold_in(key, 2t + 1): random_search with that key
  # must release the very score the game recorded.
  for t in (3,):
    for side, data in ((0, gadget.without), (1, gadget.with_)):
      res = random_search(gadget.config, gadget.grid, data, distribution=acc.Poisson(mean=3),
                          key=jax.random.fold_in(jax.random.key(0), 2 * t + side),
                          run_config=RunConfig(trainer=LocalTrainer(devices=two_devices)))
      recorded = (gadget_audit.statistics_with if side else gadget_audit.statistics_without)[t]
      expected = -1e6 if res.hyperparameters is None else res.score
      assert recorded == pytest.approx(expected, rel=1e-6)


@pytest.mark.slow  # the shared 300-search audit: 15 s; CI's slow set runs it
def test_gadget_scores_are_the_gaussian_mechanism(gadget_audit):
  # Released score under D: the max of K ~ Poisson(3) draws of N(0, 0.25)
  # (minus -1e6 sentinels for K = 0); its median is about 0.5 * 0.56 = 0.28.
  released = gadget_audit.statistics_without[gadget_audit.statistics_without > -1e5]
  assert 0.1 < np.median(released) < 0.45
  shifted = gadget_audit.statistics_with[gadget_audit.statistics_with > -1e5]
  assert np.median(shifted) - np.median(released) > 0.5


@pytest.mark.slow  # 11 s of searches; the suite's 5-minute budget (CI runs the slow set)
def test_the_non_private_search_leaks(two_devices):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    attack = attacks.selection_gadget(0.0)
  res = game.audit_search(attack.config, attack.grid, attack.without, attack.with_,
                          distribution=acc.Poisson(mean=3), statistic=attack.statistic, trials=200,
                          key=jax.random.key(1),
                          run_config=RunConfig(trainer=LocalTrainer(devices=two_devices,
                                                                    max_candidates_per_device=64)))
  assert math.isinf(res.accounted["best"])
  assert res.bound.epsilon > 2.0 and res.bound.fpr == 0.0


@pytest.mark.slow
def test_realistic_outlier_search_stays_below_its_accounted_epsilon(two_devices):
  attack = attacks.outlier_lr_tuning(1.0)
  res = game.audit_search(attack.config, attack.grid, attack.without, attack.with_,
                          distribution=acc.Poisson(mean=3), statistic=attack.statistic, trials=100,
                          key=jax.random.key(2),
                          run_config=RunConfig(trainer=LocalTrainer(devices=two_devices)))
  assert not res.violated and res.bound.epsilon <= res.accounted["best"]


@pytest.fixture
def no_training(monkeypatch):
  def fail(*args, **kwargs):
    raise AssertionError("trained before every argument was checked")
  monkeypatch.setattr(engine, "train_candidates", fail)


@pytest.mark.parametrize("kwargs,match", [
    (dict(trials=3), "too few"),
    (dict(trials=1), "trials"),
    (dict(target_delta=0.0), "target_delta"),
    (dict(target_delta=1.5), "target_delta"),
    (dict(confidence=1.0), "confidence"),
    (dict(statistic=lambda release: np.zeros(2)), "statistic must return a scalar"),
    (dict(statistic=lambda release: release.hyperparameters["arm"]), "released nothing"),
    (dict(statistic=3), "statistic must be a callable"),
    (dict(config=TrainFunction(lambda hp, seed: (0.0, None), lambda hp: acc.PureDp(1.0))),
     "config must be a TrainConfig or SearchSpace here: a TrainFunction reads its own data"),
])
def test_bad_input_is_refused_before_training(gadget, no_training, kwargs, match):
  args = dict(distribution=acc.Poisson(mean=3), statistic=gadget.statistic, trials=100,
              key=jax.random.key(0))
  args.update(kwargs)
  config = args.pop("config", gadget.config)
  with pytest.raises(ValueError, match=match):
    game.audit_search(config, gadget.grid, gadget.without, gadget.with_, **args)


def test_built_in_statistics():
  release = game.Release({"arm": 1, "learning_rate": 0.5}, 0.75, None)
  empty = game.Release(None, float("nan"), None)
  assert game.released_score()(release) == 0.75 and game.released_score(-5.0)(empty) == -5.0
  assert game.released_value("learning_rate")(release) == 0.5
  assert game.released_value("learning_rate", -1.0)(empty) == -1.0
