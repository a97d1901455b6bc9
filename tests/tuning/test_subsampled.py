"""Koskela-Kulkarni tuning on a Poisson subset (`subsampled_search`)."""


import jax
import numpy as np
import pytest

from jaxdp import accounting as acc
from jaxdp.data import DataSplit, Dataset
from jaxdp.train import init_params, LoopSpec, train_candidate
from jaxdp.sweep import engine
from jaxdp.tuning import (extrapolate, LocalTrainer, RunConfig, subsampled, subsampled_search,
                          SubsampledResult, SubsetTuning, TrainFunction)

GRID = {"learning_rate": [0.3, 1.0, 3.0]}
REPS = acc.Poisson(mean=3)


def _run(base_config, digits, two_devices, **kw):
  # One candidate per device: every K reuses one compilation (keeps the tests fast).
  # With no overrides this is tests/conftest.py's `tiny_subsampled`.
  kwargs = dict(subset=SubsetTuning(0.3, 1), distribution=REPS, key=jax.random.key(3),
                run_config=RunConfig(trainer=LocalTrainer(devices=two_devices,
                                                          max_candidates_per_device=1)))
  kwargs.update(kw)
  return subsampled_search(base_config, GRID, digits, **kwargs)


@pytest.fixture
def v1(tiny_subsampled):
  """The session's shared run: `_run` with its defaults (tests/conftest.py)."""
  return tiny_subsampled


def _subset(data, mask, num_examples):
  return Dataset(name="check", train=DataSplit(data.train.inputs[mask], data.train.labels[mask]),
                 test=data.test, num_examples=num_examples, num_classes=data.num_classes)


def test_epsilon_is_the_accountants(v1, base_config):
  ev = acc.SubsampledTuning(tune=acc.RepeatAndSelect(base_config.dp_event(), REPS), final=base_config.dp_event(),
                            q=0.3, variant=1)
  assert v1.epsilon == acc.epsilon(ev, 1e-5, "best")
  assert v1.event == ev
  # Cheaper in privacy than Papernot-Steinke on all the data, dearer than one run.
  assert acc.epsilon(base_config.dp_event(), 1e-5) < v1.epsilon
  assert v1.epsilon < acc.epsilon(acc.RepeatAndSelect(base_config.dp_event(), REPS), 1e-5, "best")


def test_variant1_trains_the_final_model_on_exactly_the_complement(v1, digits):
  n_all = digits.train.inputs.shape[0]
  mask = v1.unreleased.subset_mask
  assert mask.shape == (n_all,) and mask.dtype == bool
  # The released sizes are the declared ones, m = round(q N) and N - m, never
  # the counts drawn: those depend on the private rows.
  assert v1.subset_size == round(0.3 * digits.num_examples)
  assert v1.final_train_size == digits.num_examples - v1.subset_size
  assert 0.2 * n_all < mask.sum() < 0.4 * n_all  # Poisson(q = 0.3) subset
  # Retrain independently on X \ X1 with the documented key: identical parameters.
  final_key = jax.random.split(jax.random.key(3), 3)[2]
  again = train_candidate(v1.config, _subset(digits, ~mask, v1.final_train_size), final_key)
  for a, b in zip(jax.tree.leaves(again.params), jax.tree.leaves(v1.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert again.score == v1.score
  # ... and not what training on all of X gives.
  other = train_candidate(v1.config, digits, final_key)
  assert not np.array_equal(np.asarray(jax.tree.leaves(other.params)[0]), np.asarray(jax.tree.leaves(v1.params)[0]))


def test_variant2_trains_on_all_data_and_composes(digits, base_config, two_devices, v1):
  v2 = _run(base_config, digits, two_devices, subset=SubsetTuning(0.3, 2))
  assert v2.final_train_size == digits.train.inputs.shape[0]
  np.testing.assert_array_equal(v2.unreleased.subset_mask, v1.unreleased.subset_mask)  # same key, same X1
  assert v2.learning_rate_factor == pytest.approx(v2.final_train_size / v2.subset_size)
  ev = acc.SubsampledTuning(tune=v1.event.tune, final=v1.event.final, q=0.3, variant=2)
  assert v2.epsilon == acc.epsilon(ev, 1e-5, "best")


def test_sgd_learning_rate_is_extrapolated_by_n_over_m(v1):
  factor = v1.final_train_size / v1.subset_size
  assert v1.learning_rate_factor == pytest.approx(factor)
  assert v1.tuned_hyperparameters["learning_rate"] in GRID["learning_rate"]
  assert v1.config.hparams["learning_rate"] == pytest.approx(v1.tuned_hyperparameters["learning_rate"] * factor)
  assert v1.hyperparameters["learning_rate"] == v1.config.hparams["learning_rate"]
  assert 0.5 < v1.score <= 1.0 and 0.5 < v1.tuned_score <= 1.0


def test_adam_keeps_the_learning_rate_and_privacy_parameters(base_config):
  adam = base_config.replace(optimizer="adam", learning_rate=0.01)
  out, factor = extrapolate(adam, 400, 1000)
  assert factor == 1.0 and out.hparams["learning_rate"] == 0.01
  sgd, factor = extrapolate(base_config, 400, 1000)
  assert factor == 2.5 and sgd.hparams["learning_rate"] == pytest.approx(2.5)
  assert sgd.dp_event() == base_config.dp_event()  # C, sigma, gamma, T kept


def test_compute_is_counted(v1, base_config, digits):
  cost = base_config.num_steps * base_config.sampling_prob
  expected = cost * (v1.unreleased.num_candidates * v1.subset_size + v1.final_train_size)
  assert v1.unreleased.gradient_evaluations == pytest.approx(expected)
  assert v1.unreleased.baseline_gradient_evaluations == pytest.approx(REPS.mean * cost * digits.train.inputs.shape[0])
  assert v1.unreleased.compute_ratio == pytest.approx(v1.unreleased.baseline_gradient_evaluations / v1.unreleased.gradient_evaluations)


def test_same_key_same_result(v1, digits, base_config, two_devices):
  again = _run(base_config, digits, two_devices)
  assert again.tuned_hyperparameters == v1.tuned_hyperparameters and again.unreleased.num_candidates == v1.unreleased.num_candidates
  assert again.score == v1.score
  np.testing.assert_array_equal(again.unreleased.subset_mask, v1.unreleased.subset_mask)
  # Another key draws another X1 (K = 0 here: only the final run trains).
  other = _run(base_config, digits, two_devices, key=jax.random.key(4),
               distribution=acc.Poisson(mean=1e-9))
  assert not np.array_equal(other.unreleased.subset_mask, v1.unreleased.subset_mask)
  # K = 0 releases nothing: the final run uses the first grid point (data-independent), extrapolated.
  assert other.unreleased.num_candidates == 0 and other.tuned_hyperparameters is None
  assert other.hyperparameters["learning_rate"] == pytest.approx(0.3 * other.learning_rate_factor)


def test_privacy_changing_grid_is_accounted_by_uniform_candidates(digits, base_config, two_devices):
  grid = {"noise_multiplier": [0.8, 2.0]}
  res = subsampled_search(base_config, grid, digits, subset=SubsetTuning(0.3, 1),
                          distribution=acc.Poisson(mean=2),
                          key=jax.random.key(3),
                          run_config=RunConfig(trainer=LocalTrainer(devices=two_devices,
                                                                    max_candidates_per_device=1)))
  events = [base_config.replace(noise_multiplier=s).dp_event() for s in (0.8, 2.0)]
  cand = acc.UniformCandidates(events)
  ev = acc.SubsampledTuning(tune=acc.RepeatAndSelect(cand, acc.Poisson(mean=2)), final=cand, q=0.3, variant=1)
  assert res.epsilon == acc.epsilon(ev, 1e-5, "best")
  assert res.config.noise_multiplier == res.tuned_hyperparameters["noise_multiplier"]


def test_warm_start(digits, base_config, two_devices, v1):
  warm = _run(base_config, digits, two_devices, subset=SubsetTuning(0.3, 1, warm_start=True))
  assert warm.tuned_hyperparameters == v1.tuned_hyperparameters
  assert not np.array_equal(np.asarray(jax.tree.leaves(warm.params)[0]), np.asarray(jax.tree.leaves(v1.params)[0]))
  # (K = 0 releasing the default is checked in test_same_key_same_result.)


def test_train_candidate_initial_params(digits, base_config):
  key = jax.random.key(0)
  default = train_candidate(base_config, digits, key)
  spec = LoopSpec.from_config(base_config, digits)
  same = train_candidate(base_config, digits, key,
                         initial_params=init_params(spec, jax.random.split(key)[0], digits.train))
  for a, b in zip(jax.tree.leaves(default.params), jax.tree.leaves(same.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  bad = jax.tree.map(lambda x: x[..., :1], default.params)
  with pytest.raises(ValueError, match=r"initial_params leaf 'params/Dense_0/\w+' has shape"):
    train_candidate(base_config, digits, key, initial_params=bad)
  with pytest.raises(ValueError, match="initial_params must have the model's parameter structure"):
    train_candidate(base_config, digits, key, initial_params={"w": np.zeros(3)})


BAD_INPUT = [
    ("q_zero", lambda: dict(subset=SubsetTuning(0.0, 1)), r"q must be in \(0.0, 1.0\)"),
    ("q_one", lambda: dict(subset=SubsetTuning(1.0, 1)), r"q must be in \(0.0, 1.0\)"),
    ("q_negative", lambda: dict(subset=SubsetTuning(-0.5, 1)), "q must be"),
    ("q_nan", lambda: dict(subset=SubsetTuning(float("nan"), 1)), "q must be finite, got nan"),
    ("variant_3", lambda: dict(subset=SubsetTuning(0.3, 3)), "variant must be 1"),
    ("variant_bool", lambda: dict(subset=SubsetTuning(0.3, True)), "variant must be 1"),
    ("warm_start_string", lambda: dict(subset=SubsetTuning(0.3, 1, warm_start="yes")), "warm_start"),
    ("subset_tuple", lambda: dict(subset=(0.3, 1)), "subset must be a jaxdp.tuning.SubsetTuning"),
    ("key_int", lambda: dict(key=0), "key must be a typed PRNG key"),
    ("key_batch", lambda: dict(key=jax.random.split(jax.random.key(0), 3)),
     r"key must be a single PRNG key of shape \(\)"),
    ("delta_zero", lambda: dict(target_delta=0.0), r"target_delta must be in \(0.0, 1.0\), got 0.0"),
    ("distribution_int", lambda: dict(distribution=3),
     "distribution must be a jaxdp.accounting K distribution"),
    ("data_tuple", lambda: dict(data=(1, 2)), r"data must be a jaxdp.data.Dataset.*got tuple"),
    ("grid_empty", lambda: dict(search_space={}), "search_space must be a non-empty mapping"),
    ("grid_values_empty", lambda: dict(search_space={"learning_rate": ()}),
     r"search_space\['learning_rate'\] must be a non-empty sequence"),
    ("config_none", lambda: dict(config=None), "config must be a TrainConfig or SearchSpace"),
    ("config_function", lambda: dict(config=TrainFunction(lambda h, s: (0.0, None), lambda h: None)),
     "config must be a TrainConfig or SearchSpace.*a TrainFunction reads its own"),
    ("run_config_dict", lambda: dict(run_config={"batch": 3}),
     "run_config must be None or a jaxdp.tuning.RunConfig"),
    ("zero_per_device",
     lambda: dict(run_config=RunConfig(trainer=LocalTrainer(max_candidates_per_device=0))),
     "max_candidates_per_device"),
]


@pytest.mark.parametrize("kw,match", [c[1:] for c in BAD_INPUT], ids=[c[0] for c in BAD_INPUT])
def test_bad_input_is_rejected_before_any_draw_or_training(no_work, digits, base_config, kw, match):
  kwargs = dict(subset=SubsetTuning(0.3, 1), distribution=REPS, key=jax.random.key(0))
  with pytest.raises(ValueError, match=match):
    kwargs.update(kw())  # a bad SubsetTuning or RunConfig refuses as it is built
    config = kwargs.pop("config", base_config)
    search_space = kwargs.pop("search_space", GRID)
    data = kwargs.pop("data", digits)
    subsampled_search(config, search_space, data, **kwargs)


def test_empty_subset_is_rejected_before_k_is_drawn(digits, base_config, monkeypatch):
  # A declared subset size round(q N) = 0 is known from the public N and q
  # alone, and is reported before the subset or K is drawn or anything trains.
  # (An empty *drawn* subset is a valid outcome, never an error:
  # tests/adversarial/test_scores_and_draws.py.)
  def fail(*args, **kwargs):
    raise AssertionError("drew the subset or K, or trained, before refusing a declared m = 0")
  monkeypatch.setattr(REPS.__class__, "sample", fail)
  monkeypatch.setattr(engine, "train_candidates", fail)
  monkeypatch.setattr(subsampled, "poisson_mask", fail)  # the subset draw
  with pytest.raises(ValueError, match=r"expected size m=0"):
    subsampled_search(base_config, GRID, digits, subset=SubsetTuning(1e-6, 1), distribution=REPS,
                      key=jax.random.key(0))


def test_extrapolate_rejects_bad_input(base_config):
  with pytest.raises(ValueError, match="config must be a TrainConfig"):
    extrapolate({"learning_rate": 1.0}, 10, 20)
  with pytest.raises(ValueError, match=r"subset_size must be an integer in \[1, inf\), got 0"):
    extrapolate(base_config, 0, 20)
  with pytest.raises(ValueError, match=r"final_size must be an integer in \[1, inf\), got -3"):
    extrapolate(base_config, 10, -3)


def test_result_docstring_states_what_is_covered():
  doc = " ".join(SubsampledResult.__doc__.split())
  for fact in ("adding or removing one training example", "declared public `data.num_examples`",
               "never from the rows drawn", "public and revealed exactly", "N = m + n", "data.test", "not accounted", "never returned", "Not to be published: `unreleased`",
               "K (`num_candidates`)"):
    assert fact in doc, fact
