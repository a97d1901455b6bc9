import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdp.train import (ClippedGrad, DpSgdPlan, add_gaussian_noise, normalize_by_expected_batch_size,
                         presets)
from jaxdp.train.noise import round_up_float32


@pytest.mark.parametrize("sigma,clip,expected_batch", [(1.0, 1.0, 1.0), (2.0, 0.5, 50.0), (0.7, 3.0, 256.0)])
def test_noise_std_is_sigma_c_over_expected_batch(sigma, clip, expected_batch):
  zeros = {"a": jnp.zeros((400, 250)), "b": jnp.zeros((100_000,))}
  tx = optax.chain(add_gaussian_noise(sigma, clip, jax.random.key(3)),
                   normalize_by_expected_batch_size(expected_batch))
  out, _ = jax.jit(tx.update)(zeros, tx.init(zeros))
  values = np.concatenate([np.ravel(v) for v in jax.tree.leaves(out)])
  want = sigma * clip / expected_batch
  # 200,000 samples: the std estimate's relative error is ~0.16%.
  np.testing.assert_allclose(values.std(), want, rtol=0.01)
  assert abs(values.mean()) < 5 * want / np.sqrt(values.size)


def test_noise_key_is_split_every_step_and_reproducible():
  zeros = {"a": jnp.zeros((1000,))}
  tx = add_gaussian_noise(1.0, 1.0, jax.random.key(0))
  state = tx.init(zeros)
  first, state = tx.update(zeros, state)
  second, _ = tx.update(zeros, state)
  assert not np.allclose(first["a"], second["a"])
  again, _ = tx.update(zeros, tx.init(zeros))
  np.testing.assert_array_equal(first["a"], again["a"])


def test_zero_noise_multiplier_adds_nothing():
  g = {"a": jnp.arange(5.0)}
  tx = add_gaussian_noise(0.0, 1.0, jax.random.key(0))
  out, _ = tx.update(g, tx.init(g))
  np.testing.assert_array_equal(out["a"], g["a"])


def test_hyperparameters_live_in_state_and_vmap_over_candidates():
  zeros = {"a": jnp.zeros((50_000,))}
  sigmas = jnp.array([0.5, 1.0, 4.0])

  def run(sigma):
    tx = add_gaussian_noise(sigma, 2.0, jax.random.key(1))
    state = tx.init(zeros)
    return tx.update(zeros, state)[0]["a"].std(), state.noise_multiplier

  stds, stored = jax.jit(jax.vmap(run))(sigmas)
  np.testing.assert_allclose(stored, sigmas)
  np.testing.assert_allclose(stds, 2.0 * sigmas, rtol=0.02)


def _plan(expected_batch_size, noise_multiplier=0.0, l2_clip_norm=1.0):
  # q * N = expected_batch_size with q = 1/2.
  return DpSgdPlan(l2_clip_norm=l2_clip_norm, noise_multiplier=noise_multiplier, sampling_prob=0.5,
                   num_steps=1, num_examples=int(2 * expected_batch_size))


def _privatizer(plan, key):
  clipped = plan.clipped_grad(lambda p, batch: jnp.zeros(1))
  return plan.privatizer(clipped, key)


def test_dp_sgd_without_noise_is_sgd_on_the_mean_clipped_gradient():
  # DP-SGD = the plan's privatizer (noise, / qN) chained with the task's optimizer.
  params = {"w": jnp.array([1.0, -2.0, 3.0])}
  grad_sum = {"w": jnp.array([4.0, 0.0, -8.0])}
  plan = _plan(expected_batch_size=4.0)
  assert plan.expected_batch_size == 4.0

  def update(learning_rate):
    tx = optax.chain(_privatizer(plan, jax.random.key(0)),
                     presets.classifier_optimizer({"learning_rate": learning_rate, "weight_decay": 0.5}))
    return tx.update(grad_sum, tx.init(params), params)[0]["w"]

  updates = update(0.1)
  want = -0.1 * (np.array([4.0, 0.0, -8.0]) / 4.0 + 0.5 * np.array([1.0, -2.0, 3.0]))
  np.testing.assert_allclose(updates, want, rtol=1e-6)
  # The learning rate may be a traced array: one program vmaps over candidates.
  batched = jax.jit(jax.vmap(update))(jnp.array([0.1, 0.3]))
  np.testing.assert_allclose(batched, [want, 3.0 * want], rtol=1e-6)


def test_dp_adam_without_noise_matches_optax_adamw():
  params = {"w": jnp.array([1.0, -2.0, 3.0])}
  grad_sum = {"w": jnp.array([4.0, 1.0, -8.0])}
  tx = optax.chain(_privatizer(_plan(expected_batch_size=2.0), jax.random.key(0)),
                   presets.classifier_optimizer(
                       {"optimizer": "adam", "learning_rate": 0.01, "weight_decay": 0.1}))
  ref = optax.adamw(0.01, weight_decay=0.1)
  s, r = tx.init(params), ref.init(params)
  for _ in range(3):
    u, s = tx.update(grad_sum, s, params)
    v, r = ref.update(jax.tree.map(lambda g: g / 2.0, grad_sum), r, params)
    np.testing.assert_allclose(u["w"], v["w"], rtol=1e-5)


def test_privatizer_noise_reads_the_clipped_gradient_sensitivity():
  # The noise std is sigma x the sensitivity the ClippedGrad carries (its C).
  plan = _plan(expected_batch_size=10.0, noise_multiplier=2.0, l2_clip_norm=0.5)
  clipped = plan.clipped_grad(lambda p, batch: jnp.zeros(1))
  assert clipped.sensitivity == 0.5
  zeros = {"a": jnp.zeros((200_000,))}
  for sensitivity in (0.5, 3.0):
    tx = plan.privatizer(ClippedGrad(fn=clipped.fn, sensitivity=sensitivity), jax.random.key(4))
    out, _ = jax.jit(tx.update)(zeros, tx.init(zeros))
    # 200,000 samples: the std estimate's relative error is ~0.16%.
    np.testing.assert_allclose(np.std(out["a"]), 2.0 * sensitivity / 10.0, rtol=0.01)


def test_rejects_non_key():
  with pytest.raises(ValueError, match="key"):
    add_gaussian_noise(1.0, 1.0, 42)


def _calibrated_sigmas():
  # Noise multipliers as calibration returns them: arbitrary float64s.
  return np.random.default_rng(0).uniform(0.3, 20.0, size=2000)


def test_sigma_enters_the_device_rounded_up_never_down():
  sigmas = _calibrated_sigmas()
  up = round_up_float32(sigmas).astype(np.float64)
  assert np.all(up >= sigmas)
  # The smallest such float32: one step down is below sigma.
  assert np.all(np.nextafter(up.astype(np.float32), np.float32(0)).astype(np.float64) < sigmas)
  # Rounding to nearest would have put about half of them below sigma.
  assert 0.3 < np.mean(sigmas.astype(np.float32).astype(np.float64) < sigmas) < 0.7
  # Exactly representable values are kept.
  np.testing.assert_array_equal(round_up_float32(np.array([0.0, 0.5, 1.0, 3.0])), [0.0, 0.5, 1.0, 3.0])


@pytest.mark.parametrize("sigma", _calibrated_sigmas()[:20].tolist())
def test_noise_state_and_device_plan_hold_at_least_the_accounted_sigma(sigma):
  tx = add_gaussian_noise(sigma, 1.0, jax.random.key(0))
  stored = tx.init({"a": jnp.zeros(3)}).noise_multiplier
  assert stored.dtype == jnp.float32 and float(stored) >= sigma
  plan = DpSgdPlan(l2_clip_norm=0.7, noise_multiplier=sigma, sampling_prob=0.5, num_steps=3,
                   num_examples=10).for_device()
  assert float(plan.noise_multiplier) >= sigma and plan.noise_multiplier.dtype == np.float32
  assert plan.dp_event() == DpSgdPlan(l2_clip_norm=0.7, noise_multiplier=float(plan.noise_multiplier),
                                      sampling_prob=0.5, num_steps=3, num_examples=10).dp_event()

