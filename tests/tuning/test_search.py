"""Private tuners release only what the guarantee covers."""

import math
import warnings

import jax
import numpy as np
import pytest

from jaxdp import accounting as acc
from jaxdp.sweep import SearchSpace
from examples import dp_logistic_regression as ex
from jaxdp.tuning import (LocalTrainer, NothingReleasedWarning, random_search, RunConfig,
                          threshold_search, TrainFunction)

GRID = {"learning_rate": [0.3, 1.0, 3.0]}  # = tests/conftest.py SEARCH_GRID


def test_random_search_releases_only_the_selected_candidate(tiny_random_search, base_config):
  res, caught = tiny_random_search
  assert not caught, [str(w.message) for w in caught]
  # The other candidates' scores are kept apart from the release, never in it.
  assert len(res.unreleased.all_scores) == res.unreleased.num_candidates
  assert "all_scores" not in repr(res) and "all_scores" not in res.to_json()
  assert res.unreleased.num_candidates >= 1 and res.hyperparameters["learning_rate"] in GRID["learning_rate"]
  assert 0.5 < res.score <= 1.0 and res.params is not None
  assert res.config.hparams["learning_rate"] == res.hyperparameters["learning_rate"]
  event = acc.RepeatAndSelect(base_config.dp_event(), acc.Poisson(mean=4))
  assert res.epsilon == acc.epsilon(event, 1e-5, method="best")
  assert res.epsilon > acc.epsilon(base_config.dp_event(), 1e-5)


def test_same_key_same_result_and_scores(tiny_random_search, digits, base_config, two_devices):
  a, _ = tiny_random_search  # same arguments as below
  b = random_search(base_config, GRID, digits, distribution=acc.Poisson(mean=4), key=jax.random.key(5),
                    run_config=RunConfig(trainer=LocalTrainer(devices=two_devices)))
  assert a.unreleased.all_scores == b.unreleased.all_scores
  assert a.hyperparameters == b.hyperparameters and a.score == b.score and a.unreleased.num_candidates == b.unreleased.num_candidates
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert len(b.unreleased.all_scores) == b.unreleased.num_candidates
  assert max(s for _, s in b.unreleased.all_scores) == b.score


def test_k_zero_releases_the_default(digits, base_config):
  with pytest.warns(NothingReleasedWarning, match="random_search released nothing"):
    res = random_search(base_config, GRID, digits, distribution=acc.Poisson(mean=1e-9),
                        key=jax.random.key(0))
  assert res.unreleased.num_candidates == 0 and res.hyperparameters is None and res.params is None
  assert math.isnan(res.score) and res.epsilon >= 0


def _scoring(score):
  """A training function that trains nothing and scores `score` (no compilation)."""
  def train_fn(hparams, seed):
    return score, None
  return TrainFunction(train_fn, ex.dp_event)


FUNCTION_GRID = {**ex.GRID, "noise_multiplier": [1.0]}


def _nothing_released(caught):
  return [str(w.message) for w in caught if issubclass(w.category, NothingReleasedWarning)]


def test_a_search_that_releases_nothing_warns_the_same_words_for_k_zero_and_no_finite_score():
  # Issue 45: a search that released nothing said nothing. Whether K = 0 was drawn or every
  # score was NaN is not covered by epsilon (only the empty release is), so both read alike.
  law = acc.Poisson(mean=1.0)
  messages, sizes = set(), set()
  for seed in range(6):
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      res = random_search(_scoring(float("nan")), FUNCTION_GRID, distribution=law, key=jax.random.key(seed))
    assert res.hyperparameters is None and len(_nothing_released(caught)) == 1
    messages.update(_nothing_released(caught))
    sizes.add(min(res.unreleased.num_candidates, 1))
  assert sizes == {0, 1} and len(messages) == 1
  (message,) = messages
  assert message.startswith("random_search released nothing")
  assert f"P(K=0) = {math.exp(-1):.3g} under Poisson(mean=1.0)" in message
  assert "working as designed" in message and "acc.Geometric" in message
  with warnings.catch_warnings(record=True) as caught:  # something released: no warning
    warnings.simplefilter("always")
    assert random_search(_scoring(0.5), FUNCTION_GRID, distribution=acc.Fixed(1),
                         key=jax.random.key(0)).hyperparameters is not None
  assert not _nothing_released(caught)


def test_a_threshold_search_that_releases_nothing_warns():
  with pytest.warns(NothingReleasedWarning, match=r"threshold_search released nothing .*: no "
                    r"candidate's score reached the threshold 0.9 .*lower threshold"):
    res = threshold_search(_scoring(0.5), FUNCTION_GRID, threshold=0.9,
                           distribution=acc.Geometric(gamma=0.5), key=jax.random.key(0))
  assert res.hyperparameters is None


def test_privacy_changing_hyperparameters_are_accounted_by_the_worst_candidate(digits, base_config):
  grid = {"noise_multiplier": [0.8, 2.0]}
  res = random_search(base_config, grid, digits, distribution=acc.Poisson(mean=2), key=jax.random.key(1))
  weakest = base_config.replace(noise_multiplier=0.8).dp_event()
  assert res.epsilon == pytest.approx(
      acc.epsilon(acc.RepeatAndSelect(weakest, acc.Poisson(mean=2)), 1e-5, "best"), rel=1e-9)


def test_threshold_search(digits, base_config):
  easy = threshold_search(base_config, GRID, digits, threshold=0.0,
                          distribution=acc.Geometric(gamma=0.5), key=jax.random.key(2))
  assert easy.unreleased.num_candidates == 1 and easy.hyperparameters is not None
  never = threshold_search(base_config, GRID, digits, threshold=2.0, distribution=acc.Fixed(1),
                           key=jax.random.key(2))
  assert never.unreleased.num_candidates == 1 and never.hyperparameters is None
  capped = threshold_search(base_config, GRID, digits, threshold=2.0,
                            distribution=acc.CappedGeometric(0.01, 2), key=jax.random.key(2))
  assert capped.unreleased.num_candidates == 2 and capped.hyperparameters is None
  assert capped.epsilon == acc.epsilon(acc.ThresholdSelect(base_config.dp_event(), 0.01, 2), 1e-5)


# --- Every argument is checked before K is drawn and before any training. ---
# The `no_work` fixture (tests/conftest.py) makes drawing K or training
# raise, so each ValueError below is proven to come first, whatever K would be.

# (id, overrides of the common arguments, expected message). A `config` given
# as a callable is built from the base config fixture.
COMMON_BAD = [
    ("data_tuple", dict(data=(1, 2)), r"data must be a jaxdp.data.Dataset.*got tuple"),
    ("data_none", dict(data=None), "data must be a jaxdp.data.Dataset"),
    ("data_model_mismatch", dict(config=lambda c: c.replace(model="opacus_cnn")),
     "opacus_cnn.*cannot take inputs of shape"),
    ("config_dict", dict(config={"learning_rate": 1.0}),
     "the trainable must be a TrainConfig, a SearchSpace or a jaxdp.tuning.TrainFunction"),
    ("space_and_grid", dict(config=lambda c: SearchSpace(c, GRID), search_space=GRID),
     "search_space must be None when the trainable is a SearchSpace"),
    ("grid_none", dict(search_space=None), "search_space must be a non-empty mapping"),
    ("grid_empty", dict(search_space={}), r"search_space must be a non-empty mapping.*got \{\}"),
    ("grid_values_empty", dict(search_space={"learning_rate": []}),
     r"search_space\['learning_rate'\] must be a non-empty sequence"),
    ("grid_values_string", dict(search_space={"learning_rate": "0.1"}),
     r"search_space\['learning_rate'\] must be a non-empty sequence"),
    ("grid_unknown_name", dict(search_space={"batch": [1]}), r"\['batch'\] are not read by task"),
    ("grid_bad_value", dict(search_space={"learning_rate": [0.1, -1.0]}), "learning_rate must be in"),
    ("key_int", dict(key=0), "key must be a typed PRNG key"),
    ("key_raw_uint32", dict(key=jax.random.PRNGKey(0)), "key must be a typed PRNG key"),
    ("key_batch", dict(key=jax.random.split(jax.random.key(0), 2)), r"key must be a single PRNG key of shape \(\)"),
    ("delta_zero", dict(target_delta=0.0), r"target_delta must be in \(0.0, 1.0\), got 0.0"),
    ("delta_one", dict(target_delta=1.0), r"target_delta must be in \(0.0, 1.0\), got 1.0"),
    ("delta_nan", dict(target_delta=float("nan")), "target_delta must be finite, got nan"),
    ("delta_string", dict(target_delta="1e-5"), "target_delta must be a real number"),
    ("run_config_dict", dict(run_config={"run_dir": "x"}),
     "run_config must be None or a jaxdp.tuning.RunConfig"),
    # A trainer's options are checked when it is built (inside the check here), a run_config's
    # trainer when the run_config is.
    ("trainer_not_one", dict(run_config=lambda: RunConfig(trainer=3)),
     "trainer must be None, a jaxdp.sweep.LocalTrainer or RayTrainer"),
    ("engine_zero_per_device", dict(run_config=lambda: RunConfig(trainer=LocalTrainer(
        max_candidates_per_device=0))), "max_candidates_per_device must be an integer in"),
    ("engine_no_devices", dict(run_config=lambda: RunConfig(trainer=LocalTrainer(devices=[]))),
     "devices must be a non-empty sequence of jax.Device"),
    ("engine_progress_string", dict(run_config=lambda: RunConfig(trainer=LocalTrainer(progress="no"))),
     "progress must be a bool"),
    ("engine_on_chunk_not_callable",
     dict(run_config=lambda: RunConfig(trainer=LocalTrainer(on_chunk=3))),
     "on_chunk must be a callable"),
]

RANDOM_BAD = COMMON_BAD + [
    ("repetitions_int", dict(distribution=10), "distribution must be a jaxdp.accounting K distribution"),
    ("repetitions_none", dict(distribution=None),
     "distribution must be a jaxdp.accounting K distribution"),
    ("mean_overflows", dict(distribution=lambda: acc.TruncatedNegativeBinomial(0.5, log_gamma=-800.0)),
     "distribution must have a finite mean E\\[K\\], got a TruncatedNegativeBinomial"),
]

THRESHOLD_BAD = COMMON_BAD + [
    ("threshold_nan", dict(threshold=float("nan")), r"threshold must be a finite real number.*got nan"),
    ("threshold_inf", dict(threshold=float("inf")), r"threshold must be a finite real number.*got inf"),
    ("threshold_minus_inf", dict(threshold=-float("inf")), r"threshold must be a finite real number.*got -inf"),
    ("threshold_string", dict(threshold="0.9"), r"threshold must be a finite real number.*got '0.9'"),
    ("threshold_none", dict(threshold=None), r"threshold must be a finite real number.*got None"),
    ("threshold_bool", dict(threshold=True), r"threshold must be a finite real number.*got True"),
    # The stop coin's law: its parameters are checked by the law itself.
    ("stop_prob_zero", dict(distribution=lambda: acc.Geometric(gamma=0.0)),
     r"gamma must be in \(0.0, 1.0\), got 0.0"),
    ("stop_prob_above_one", dict(distribution=lambda: acc.CappedGeometric(1.5, 3)),
     r"stop_prob must be in \(0.0, 1.0\), got 1.5"),
    ("stop_prob_nan", dict(distribution=lambda: acc.Geometric(gamma=float("nan"))),
     "gamma must be finite, got nan"),
    ("max_candidates_zero", dict(distribution=lambda: acc.CappedGeometric(0.5, 0)),
     r"max_k must be an integer in \[1, inf\), got 0"),
    ("max_candidates_fraction", dict(distribution=lambda: acc.CappedGeometric(0.5, 1.5)),
     "max_k must be an integer, got 1.5"),
    ("distribution_poisson", dict(distribution=acc.Poisson(mean=2)),
     "distribution must be the law of the number of candidates tried when none reaches"),
    ("distribution_fixed_two", dict(distribution=acc.Fixed(2)),
     "distribution must be the law of the number of candidates tried when none reaches"),
    ("stop_prob_underflows", dict(distribution=lambda: acc.TruncatedNegativeBinomial(1.0,
                                                                                     log_gamma=-800.0)),
     r"distribution's stop probability must be positive, got gamma=exp\(-800.0\)"),
]


def _call(tuner, digits, base_config, overrides, defaults):
  kwargs = dict(defaults)
  kwargs.update(overrides)
  for name in ("run_config", "distribution"):  # objects whose own checks are under test: built here
    if callable(kwargs.get(name)) and not isinstance(kwargs[name], acc.KDistribution):
      kwargs[name] = kwargs[name]()
  config = kwargs.pop("config", base_config)
  config = config(base_config) if callable(config) else config
  data = kwargs.pop("data", digits)
  search_space = kwargs.pop("search_space", None if isinstance(config, SearchSpace) else GRID)
  return tuner(config, search_space, data, **kwargs)


@pytest.mark.parametrize("overrides,match", [c[1:] for c in RANDOM_BAD], ids=[c[0] for c in RANDOM_BAD])
def test_random_search_rejects_bad_arguments_before_drawing_k(no_work, digits, base_config, overrides, match):
  with pytest.raises(ValueError, match=match):
    _call(random_search, digits, base_config, overrides,
          dict(distribution=acc.Poisson(mean=2), key=jax.random.key(0)))


@pytest.mark.parametrize("overrides,match", [c[1:] for c in THRESHOLD_BAD], ids=[c[0] for c in THRESHOLD_BAD])
def test_threshold_search_rejects_bad_arguments_before_training(no_work, digits, base_config, overrides, match):
  with pytest.raises(ValueError, match=match):
    _call(threshold_search, digits, base_config, overrides,
          dict(threshold=0.5, distribution=acc.Geometric(gamma=0.5), key=jax.random.key(0)))


def test_bad_data_raises_even_when_k_is_zero(digits, base_config):
  repetitions = acc.Poisson(mean=1e-9)
  # Without the guard `no_work`: K really is 0 for this key (checked below), so
  # the search would train nothing; the bad data must be rejected all the same.
  assert random_search(base_config, GRID, digits, distribution=repetitions,
                       key=jax.random.key(0)).unreleased.num_candidates == 0
  with pytest.raises(ValueError, match="data must be a jaxdp.data.Dataset"):
    random_search(base_config, GRID, (1, 2), distribution=repetitions, key=jax.random.key(0))


def test_nan_threshold_is_rejected_not_silently_unreleased(digits, base_config):
  # Before the check, NaN compared False with every score: the search trained
  # and then released nothing, exactly like an honest failure.
  with pytest.raises(ValueError, match="threshold must be a finite real number"):
    threshold_search(base_config, GRID, digits, threshold=float("nan"), distribution=acc.Fixed(1),
                     key=jax.random.key(2))


def test_result_docstring_states_what_is_covered():
  from jaxdp.tuning import TunedResult  # pylint: disable=g-import-not-at-top
  doc = TunedResult.__doc__
  # The neighbouring relation now covers the private validation split too (DP scores).
  for fact in ("adding or removing one private example (training or private validation)",
               "size N is the declared public", "never counted from the rows", "data.test", "data.private_validation",
               "NOT accounted", "K (`num_candidates`)", "Not covered, not for publication",
               "left out of repr, `to_json`, `save` and pickling"):
    assert fact in " ".join(doc.split()), fact
