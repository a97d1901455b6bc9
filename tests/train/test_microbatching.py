"""Automatic microbatching: the size rule, the working-set estimate, and that it never changes results."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxdp.data import DataSplit, Dataset
from jaxdp.train import ExecutionConfig, LoopSpec, TrainConfig, microbatching, presets, train_candidate
from jaxdp.train import loop_spec, sampling


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
  # The least expected work for B ~ Binomial(120, 0.4), from the declared N and q.
  per_example = loop_spec.per_example_bytes(spec, data.train)
  assert spec.microbatch_size == microbatching.poisson_microbatch_size(120, 0.4, per_example, 1 << 40)
  assert spec.microbatch_size > 48 and spec.padded_batch_size % spec.microbatch_size == 0
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


# --- The microbatch of a Poisson batch: least expected work, from public N and q. ---


@pytest.mark.parametrize("n,q", [(200, 0.1), (4096, 32 / 4096), (50, 1.0), (1000, 0.003)])
def test_expected_microbatches_is_the_mean_of_ceil_b_over_m(n, q):
  sizes = np.arange(n + 1)
  pmf = stats.binom(n, q).pmf(sizes)
  for m in (1, 3, 7, 28, n):
    want = float(np.sum(pmf * -(-sizes // m)))
    assert microbatching.expected_microbatches(n, q, m) == pytest.approx(want, rel=1e-9, abs=1e-9)


def _work(n, q, m, per, overhead):
  return microbatching.expected_microbatches(n, q, m) * (m * per + overhead)


@pytest.mark.parametrize("n,q,per,budget,overhead", [
    (4096, 32 / 4096, 16_129_488, 768 << 20, 32 << 20),  # the transformer benchmark's shapes
    (60000, 256 / 60000, 10_549_024, 768 << 20, 32 << 20),  # the CNN at batch 256
    (120, 0.4, 100, 10**9, 32 << 20),  # a tiny model: one microbatch covers every likely batch
    (500, 0.2, 1000, 20_000, 0),  # no overhead: the smallest m that pads nothing
    (300, 0.1, 10**9, 1, 1000),  # nothing fits: one row at a time
])
def test_poisson_microbatch_size_minimises_expected_work_within_the_budget(n, q, per, budget, overhead):
  m = microbatching.poisson_microbatch_size(n, q, per, budget, overhead)
  most = max(1, budget // per)
  assert 1 <= m <= most
  best = min(_work(n, q, k, per, overhead) for k in range(1, min(most, n) + 1))
  assert _work(n, q, m, per, overhead) == pytest.approx(best, rel=1e-12)
  # A pure function of its (public) arguments.
  microbatching._poisson_microbatch_size.cache_clear()
  microbatching._survival.cache_clear()
  assert microbatching.poisson_microbatch_size(n, q, per, budget, overhead) == m


def test_poisson_microbatch_size_pads_less_on_the_transformer_benchmark():
  n, q, per, budget = 4096, 32 / 4096, 16_129_488, 768 << 20
  m = microbatching.poisson_microbatch_size(n, q, per, budget)
  old = microbatching.auto_microbatch_size(55, per, budget)  # the padded batch's equal split
  assert old == 28
  rows = lambda k: microbatching.expected_microbatches(n, q, k) * k
  assert rows(old) == pytest.approx(48.4, abs=0.05)  # docs/benchmarks.md, issue 34
  assert rows(m) < rows(old) and m * per <= budget


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_examples=0, sampling_prob=0.1, bytes_per_example=1, budget=1), "num_examples"),
    (dict(num_examples=10, sampling_prob=0.0, bytes_per_example=1, budget=1), "sampling_prob"),
    (dict(num_examples=10, sampling_prob=1.5, bytes_per_example=1, budget=1), "sampling_prob"),
    (dict(num_examples=10, sampling_prob=0.1, bytes_per_example=0, budget=1), "bytes_per_example"),
    (dict(num_examples=10, sampling_prob=0.1, bytes_per_example=1, budget=0), "budget"),
    (dict(num_examples=10, sampling_prob=0.1, bytes_per_example=1, budget=1, overhead_bytes=-1),
     "overhead_bytes"),
])
def test_poisson_microbatch_size_rejects_bad_input(kwargs, match):
  with pytest.raises(ValueError, match=match):
    microbatching.poisson_microbatch_size(**kwargs)
  if "overhead_bytes" not in kwargs and "bytes_per_example" not in kwargs and "budget" not in kwargs:
    with pytest.raises(ValueError, match=match):
      microbatching.expected_microbatches(kwargs["num_examples"], kwargs["sampling_prob"], 1)


def test_spec_microbatch_depends_only_on_the_declared_size(monkeypatch):
  # Two data sets of different private row counts, the same declared N: the same microbatch.
  monkeypatch.setattr(microbatching, "budget_bytes", lambda device=None: 1 << 40)
  config = _config()
  small, large = _data(n=100), _data(n=120)
  small = dataclasses.replace(small, num_examples=120)
  specs = [LoopSpec.from_config(config, d) for d in (small, large)]
  assert specs[0].microbatch_size == specs[1].microbatch_size
  assert specs[0].padded_batch_size % specs[0].microbatch_size == 0


def test_a_step_sums_the_same_with_the_new_and_the_old_microbatch():
  # The same key samples the same rows; only how they are cut into microbatches differs, so the
  # sums agree up to float32 reordering (relative 1e-6).
  n, q = 4096, 32 / 4096
  per, budget = 16_129_488, 768 << 20
  new = microbatching.poisson_microbatch_size(n, q, per, budget)
  old = microbatching.auto_microbatch_size(55, per, budget)
  assert new != old
  values = jax.random.normal(jax.random.key(0), (n, 5))

  def step(key, m):
    padded = m * -(-55 // m)
    return sampling.poisson_batch_sum(
        key, lambda idx, valid: jnp.sum(jnp.where(valid[:, None], values[idx], 0.0), axis=0),
        num_examples=n, sampling_prob=q, padded_batch_size=padded, microbatch_size=m)

  for seed in range(5):
    key = jax.random.key(seed)
    (a, count_a), (b, count_b) = step(key, new), step(key, old)
    assert count_a == count_b
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-5)
