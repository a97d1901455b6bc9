import dataclasses
import math
import warnings

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from dp_accounting import rdp

from jaxdp.data import DataSplit, Dataset
import jaxdp
from jaxdp import accounting as acc
from jaxdp.train import (CONFIG_FIELDS, EPSILON_METHOD, ExecutionConfig, NotPrivateWarning, TrainConfig,
                         epsilon, presets, program, train_candidate)
from jaxdp.train import loop_spec

# One task object per class count: a Task compares by identity, so sharing it
# lets tests share compiled programs.
TINY_TASK = presets.classifier(3)
DIGITS_TASK = presets.classifier(10)


def _tiny_dataset(n=40, d=6, classes=3, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, d)).astype(np.float32)
  y = (np.arange(n) % classes).astype(np.int32)
  x[:, 0] += y  # learnable signal
  return Dataset(name="tiny", train=DataSplit(x, y), test=DataSplit(x[:10], y[:10]),
                 num_examples=n, num_classes=classes)


def _cfg(**kw):
  """The tiny classifier's config; names that are not config fields are hyperparameters."""
  fields = dict(task=TINY_TASK, l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=0.1, steps=20)
  hparams = dict(learning_rate=0.5)
  for name, value in kw.items():
    (fields if name in CONFIG_FIELDS + ("task", "execution") else hparams)[name] = value
  return TrainConfig(hparams=hparams, **fields)


def test_dp_event_and_epsilon_match_the_accountant():
  cfg = _cfg(sampling_prob=0.01, noise_multiplier=1.1, epochs=5, steps=None)
  assert cfg.num_steps == 500
  want = dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1)), 500)
  assert cfg.dp_event() == want
  eps = rdp.RdpAccountant().compose(want).get_epsilon(1e-5)
  assert epsilon(cfg) == pytest.approx(eps, rel=1e-12)
  assert 0.5 < eps < 5.0
  with pytest.warns(NotPrivateWarning):
    assert math.isinf(epsilon(_cfg(noise_multiplier=0.0)))


def test_zero_noise_warns_that_the_run_is_not_private():
  with pytest.warns(NotPrivateWarning, match=r"noise_multiplier=0.*NOT differentially private \(epsilon = inf\)"):
    cfg = _cfg(noise_multiplier=0.0)
  assert issubclass(NotPrivateWarning, UserWarning)  # shown by default, filterable by class
  assert math.isinf(epsilon(cfg))
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # any positive sigma, however small, is silent
    _cfg(noise_multiplier=1e-3)
    _cfg(noise_multiplier=1.0)


def test_full_batch_without_noise_is_exact_gradient_descent():
  # q = 1 includes everyone, expected batch = N: DP-SGD with a huge clip norm
  # and no noise must equal plain full-batch gradient descent on the mean loss.
  data = _tiny_dataset()
  with pytest.warns(NotPrivateWarning):
    cfg = _cfg(sampling_prob=1.0, noise_multiplier=0.0, l2_clip_norm=1e6, steps=3,
               learning_rate=0.3, weight_decay=0.01)
  spec = loop_spec.LoopSpec.from_config(cfg, data)
  assert spec.traced_names == ("learning_rate", "weight_decay")
  params0 = program.init_params(spec, jax.random.key(0), data.train)
  out = jax.jit(program.build_train_loop(spec))(params0, cfg.plan(data.num_examples),
                                                loop_spec.traced_hparams(spec, cfg), jax.random.key(1),
                                                data.train)
  module = spec.model()

  def mean_loss(p):
    return optax.softmax_cross_entropy_with_integer_labels(
        module.apply(p, data.train.inputs), data.train.labels).mean()
  p = params0
  for _ in range(3):
    g = jax.grad(mean_loss)(p)
    p = jax.tree.map(lambda w, gw: w - 0.3 * (gw + 0.01 * w), p, g)
  assert int(out.steps) == 3 and bool(out.finite)
  for a, b in zip(jax.tree.leaves(out.params), jax.tree.leaves(p)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_same_key_same_result_and_different_key_differs():
  data = _tiny_dataset()
  cfg = _cfg()
  a = train_candidate(cfg, data, jax.random.key(5))
  b = train_candidate(cfg, data, jax.random.key(5))
  c = train_candidate(cfg, data, jax.random.key(6))
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_array_equal(x, y)
  assert (a.test_score, a.test_loss) == (b.test_score, b.test_loss)
  assert not all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a.params),
                                                      jax.tree.leaves(c.params)))
  assert a.steps == a.planned_steps == 20 and not a.diverged


def test_vmapped_inner_loop_equals_separate_runs():
  # What the sweep engine will do: a candidate axis of traced hyperparameters.
  data = _tiny_dataset()
  # C and sigma are leaves of the DpSgdPlan; learning rate and weight decay traced hparams.
  cfg = _cfg(steps=5, weight_decay=0.0)
  spec = loop_spec.LoopSpec.from_config(cfg, data)
  params = program.init_params(spec, jax.random.key(0), data.train)
  plan = dataclasses.replace(cfg.plan(data.num_examples), l2_clip_norm=jnp.array([0.5, 2.0]),
                             noise_multiplier=jnp.array([0.5, 2.0]))
  hp = dict(learning_rate=jnp.array([0.1, 1.0]), weight_decay=jnp.array([0.0, 0.1]))
  keys = jax.random.split(jax.random.key(3), 2)
  loop = program.build_train_loop(spec)
  batched = jax.jit(jax.vmap(loop, in_axes=(None, 0, 0, 0, None)))(params, plan, hp, keys, data.train)
  for i in range(2):
    single = jax.jit(loop)(params, jax.tree.map(lambda v: v[i], plan),
                           jax.tree.map(lambda v: v[i], hp), keys[i], data.train)
    for a, b in zip(jax.tree.leaves(batched.params), jax.tree.leaves(single.params)):
      np.testing.assert_allclose(a[i], b, rtol=1e-5, atol=1e-6)


def test_candidate_epsilon_is_accounted_by_jaxdp_accounting_with_its_stated_method():
  data = _tiny_dataset()
  cfg = _cfg()
  result = train_candidate(cfg, data, jax.random.key(5))
  assert result.epsilon_method == EPSILON_METHOD == "rdp"
  # The same process: exactly what the package's accounting says for that method.
  assert result.epsilon == acc.epsilon(cfg.dp_event(data.num_examples), cfg.target_delta,
                                       method=result.epsilon_method)


def test_clear_caches_reaches_the_compiled_programs():
  data = _tiny_dataset()
  cfg = _cfg()
  first = train_candidate(cfg, data, jax.random.key(5))
  assert train_candidate(cfg, data, jax.random.key(5)).compile_time_s == 0.0  # cached
  jaxdp.clear_caches()
  again = train_candidate(cfg, data, jax.random.key(5))
  assert again.compile_time_s > 0.0  # compiled anew: the trainer's caches were emptied
  for x, y in zip(jax.tree.leaves(first.params), jax.tree.leaves(again.params)):
    np.testing.assert_array_equal(x, y)


def test_diverging_learning_rate_ends_early_with_nan_score():
  data = _tiny_dataset()
  # lr * weight_decay = 1e4: parameters grow 1e4-fold per step and overflow.
  cfg = _cfg(learning_rate=1e3, weight_decay=10.0, steps=200)
  result = train_candidate(cfg, data, jax.random.key(0))
  assert result.diverged
  assert math.isnan(result.score) and math.isnan(result.test_score)
  assert result.steps < 200 == result.planned_steps
  assert result.epsilon == pytest.approx(epsilon(cfg))  # planned, never less


def test_overflowing_padding_still_uses_every_sampled_example():
  # Padding 2 at q = 0.5 on 40 examples overflows every step; the result must
  # equal the default-padded run exactly (same key -> same sample and noise).
  data = _tiny_dataset()
  base = dict(sampling_prob=0.5, steps=4, noise_multiplier=0.7)
  small = train_candidate(_cfg(**base, execution=ExecutionConfig(padded_batch_size=2,
                                                                 microbatch_size=2)),
                          data, jax.random.key(9))
  big = train_candidate(_cfg(**base), data, jax.random.key(9))
  for a, b in zip(jax.tree.leaves(small.params), jax.tree.leaves(big.params)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_digits_logreg_reaches_85_percent_with_epsilon_below_8(digits):
  cfg = TrainConfig(task=DIGITS_TASK, l2_clip_norm=1.0, noise_multiplier=1.0,
                    sampling_prob=0.05, epochs=20, target_delta=1e-5,
                    hparams=dict(model="logreg", learning_rate=2.0))
  result = train_candidate(cfg, digits, jax.random.key(0))
  assert result.epsilon <= 8.0
  assert result.test_score >= 0.85
  # It ran every planned step and learned (test loss below log(10), that of
  # uniform guessing); how long it took is the benchmarks' business.
  assert result.steps == result.planned_steps == 400 and not result.diverged
  assert result.test_loss < math.log(10)


@pytest.mark.slow
def test_digits_cnn_reaches_85_percent_with_epsilon_below_8(digits):
  cfg = TrainConfig(task=DIGITS_TASK, l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=0.05,
                    epochs=10, hparams=dict(model="papernot_steinke_cnn", learning_rate=1.0))
  result = train_candidate(cfg, digits, jax.random.key(0))
  assert result.epsilon <= 8.0 and result.test_score >= 0.85


def test_epochs_use_the_one_step_rule(base_config):
  # T = ceil(epochs / q) (jaxdp.accounting.dpsgd_steps): never fewer steps, never 0.
  cfg = dataclasses.replace(base_config, steps=None, epochs=0.001)
  assert cfg.num_steps == 1
  cfg = dataclasses.replace(base_config, steps=None, epochs=60, sampling_prob=256 / 60000)
  assert cfg.num_steps == 14063 and cfg.dp_event().count == 14063


@pytest.mark.parametrize("kwargs,match", [
    (dict(sampling_prob=0.0), "sampling_prob"),
    (dict(sampling_prob=1.2), "sampling_prob"),
    (dict(noise_multiplier=-1.0), "noise_multiplier"),
    (dict(noise_multiplier=float("nan")), "noise_multiplier"),
    (dict(l2_clip_norm=0.0), "l2_clip_norm"),
    (dict(learning_rate=0.0), "learning_rate must be in"),
    (dict(learning_rate=float("inf")), "hyperparameter 'learning_rate' must be finite"),
    (dict(steps=0), "steps"),
    (dict(steps=None), "exactly one of steps and epochs"),
    (dict(epochs=1.0), "exactly one of steps and epochs"),
    (dict(steps=None, epochs=0.0), "epochs"),
    (dict(target_delta=0.0), "target_delta"),
    (dict(optimizer="rmsprop"), "optimizer must be one of"),
    (dict(momentum=1.0), "momentum must be in"),
    (dict(optimizer="adam", momentum=0.9), "momentum applies to optimizer='sgd' only"),
    (dict(weight_decay=-0.1), "weight_decay must be in"),
    (dict(model="vgg"), "model must be one of"),
    (dict(activation="swish"), "activation must be one of"),
    (dict(execution="fast"), "execution"),
])
def test_config_rejects_bad_input(kwargs, match):
  # Hyperparameters (learning_rate, optimizer, momentum, weight_decay, model,
  # activation) are checked by the preset's factories when the config is built.
  with pytest.raises(ValueError, match=match):
    _cfg(**kwargs)


@pytest.mark.parametrize("kwargs,match", [
    (dict(padded_batch_size=0), "padded_batch_size"),
    (dict(microbatch_size=-2), "microbatch_size"),
    (dict(padded_batch_size=10, microbatch_size=4), "multiple"),
    (dict(eval_batch_size=0), "eval_batch_size"),
])
def test_execution_config_rejects_bad_input(kwargs, match):
  with pytest.raises(ValueError, match=match):
    ExecutionConfig(**kwargs)


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_classes=10, conv_impl="winograd"), "conv_impl"),  # was ExecutionConfig(conv_impl=)
    (dict(num_classes=1), "num_classes"),
])
def test_classifier_preset_rejects_bad_input(kwargs, match):
  with pytest.raises(ValueError, match=match):
    presets.classifier(**kwargs)


def test_train_candidate_rejects_mismatched_model_data_and_key(digits):
  with pytest.raises(ValueError, match="opacus_cnn.*cannot take inputs of shape"):
    train_candidate(_cfg(task=DIGITS_TASK, model="opacus_cnn"), digits, jax.random.key(0))
  with pytest.raises(ValueError, match="data must be a jaxdp.data.Dataset"):
    train_candidate(_cfg(task=DIGITS_TASK), (digits.train.inputs, digits.train.labels),
                    jax.random.key(0))
  with pytest.raises(ValueError, match="key"):
    train_candidate(_cfg(task=DIGITS_TASK), digits, 0)
  with pytest.raises(ValueError, match="config must be a TrainConfig"):
    train_candidate({"learning_rate": 1.0}, digits, jax.random.key(0))
