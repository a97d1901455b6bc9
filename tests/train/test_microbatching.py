"""Automatic microbatching: the size rule, the working-set estimate, and that it never changes results."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp.data import DataSplit, Dataset
from jaxdp.train import ExecutionConfig, LoopSpec, TrainConfig, microbatching, presets, train_candidate


@pytest.mark.parametrize("padded,per_example,budget,divide,want", [
    (256, 10, 10_000, False, 256),   # everything fits: one microbatch
    (256, 10, 760, False, 64),       # at most 76 fit: 4 equal parts of 64
    (96, 10, 500, False, 48),        # at most 50: 2 parts of 48
    (100, 10, 340, False, 34),       # at most 34: 3 parts, rounded up to 34 (P becomes 102)
    (100, 10, 340, True, 25),        # P fixed: its largest divisor <= 34
    (97, 10, 340, True, 1),          # a prime P fixed by the user: only 1 divides it
    (8, 10**9, 1, False, 1),         # nothing fits: one example at a time
])
def test_auto_microbatch_size(padded, per_example, budget, divide, want):
  m = microbatching.auto_microbatch_size(padded, per_example, budget, divide=divide)
  assert m == want
  assert m * per_example <= budget or m == 1
  if divide:
    assert padded % m == 0


@pytest.mark.parametrize("kwargs,match", [
    (dict(padded_batch_size=0, bytes_per_example=1, budget=1), "padded_batch_size"),
    (dict(padded_batch_size=4, bytes_per_example=0, budget=1), "bytes_per_example"),
    (dict(padded_batch_size=4, bytes_per_example=1, budget=0), "budget"),
])
def test_auto_microbatch_size_rejects_bad_input(kwargs, match):
  with pytest.raises(ValueError, match=match):
    microbatching.auto_microbatch_size(**kwargs)


def test_per_example_bytes_counts_the_gradient_and_grows_with_the_model():
  task = presets.classifier(10)
  example = DataSplit(jax.ShapeDtypeStruct((1, 8, 8, 1), jnp.float32), jax.ShapeDtypeStruct((1,), jnp.int32))
  sizes = {}
  for name in ("logreg", "mlp"):
    model = task.model_for(dict(model=name, learning_rate=0.1))
    params = jax.eval_shape(model.init, jax.random.key(0), example.inputs)
    param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    sizes[name] = microbatching.per_example_bytes(task.per_example_loss(model), params, example)
    assert sizes[name] >= param_bytes  # it holds at least the example's gradient
  assert sizes["mlp"] > sizes["logreg"]


def test_budget_is_positive_on_this_device():
  assert microbatching.budget_bytes() > 0
  assert microbatching.budget_bytes(jax.devices()[0]) == microbatching.budget_bytes()


def _data(n=120, d=16, classes=3, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, d)).astype(np.float32)
  y = (np.arange(n) % classes).astype(np.int32)
  x[:, 0] += y
  return Dataset(name="mb", train=DataSplit(x, y), test=DataSplit(x[:30], y[:30]), num_examples=n,
                 num_classes=classes)


def _config(**execution):
  return TrainConfig(task=presets.classifier(3), l2_clip_norm=0.5, noise_multiplier=1.0,
                     sampling_prob=0.4, steps=6, hparams=dict(learning_rate=0.5, model="mlp"),
                     execution=ExecutionConfig(**execution))


def test_spec_chooses_the_size_from_the_budget_and_keeps_explicit_settings(monkeypatch):
  data = _data()
  monkeypatch.setattr(microbatching, "budget_bytes", lambda device=None: 1)  # nothing fits
  spec = LoopSpec.from_config(_config(), data)
  assert spec.microbatch_size == 1
  monkeypatch.setattr(microbatching, "budget_bytes", lambda device=None: 1 << 40)  # everything fits
  spec = LoopSpec.from_config(_config(), data)
  assert spec.microbatch_size == spec.padded_batch_size
  # Explicit settings win; a fixed padding gets a microbatch that divides it.
  assert LoopSpec.from_config(_config(microbatch_size=7), data).microbatch_size == 7
  monkeypatch.setattr(microbatching, "budget_bytes", lambda device=None: 1)
  spec = LoopSpec.from_config(_config(padded_batch_size=90), data)
  assert spec.padded_batch_size == 90 and 90 % spec.microbatch_size == 0


# Both variants (11 s and 8 s of compiling) run in the slow set, which CI runs; keeps make test
# < 5 min (tests/train/test_sampling.py checks the microbatches' sum in the default run).
@pytest.mark.slow
@pytest.mark.parametrize("clipping", ["vmap", "ghost"])
def test_automatic_microbatching_gives_the_same_training_as_one_vmap(monkeypatch, clipping):
  data = _data()
  config = _config(padded_batch_size=80)
  config = config.replace(task=dataclasses.replace(config.task, clipping=clipping))
  monkeypatch.setattr(microbatching, "budget_bytes", lambda device=None: 1)
  micro = LoopSpec.from_config(config, data)
  assert micro.microbatch_size == 1  # 80 calls of one example each
  tiny = train_candidate(config, data, jax.random.key(3))
  whole = train_candidate(config.replace(execution=ExecutionConfig(padded_batch_size=80, microbatch_size=80)),
                          data, jax.random.key(3))
  assert tiny.steps == whole.steps == 6
  for a, b in zip(jax.tree.leaves(tiny.params), jax.tree.leaves(whole.params)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert tiny.test_score == pytest.approx(whole.test_score, abs=1e-6)


def test_microbatch_size_for_a_fixed_batch_divides_it(monkeypatch):
  task = presets.classifier(3)
  model = task.model_for(dict(model="mlp", learning_rate=0.1))
  batch = DataSplit(jnp.zeros((90, 16)), jnp.zeros((90,), jnp.int32))
  params = jax.eval_shape(model.init, jax.random.key(0), batch.inputs[:1])
  loss = task.per_example_loss(model)
  per_example = microbatching.per_example_bytes(loss, params, jax.tree.map(lambda a: a[:1], batch))
  monkeypatch.setattr(microbatching, "budget_bytes", lambda device=None: 40 * per_example)
  assert microbatching.microbatch_size_for(loss, params, batch) == 30  # largest divisor of 90 <= 40
