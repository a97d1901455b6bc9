import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdp.train import add_gaussian_noise, dp_adam, dp_sgd, normalize_by_expected_batch_size


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


def test_dp_sgd_without_noise_is_sgd_on_the_mean_clipped_gradient():
  params = {"w": jnp.array([1.0, -2.0, 3.0])}
  grad_sum = {"w": jnp.array([4.0, 0.0, -8.0])}
  tx = dp_sgd(learning_rate=0.1, l2_clip_norm=1.0, noise_multiplier=0.0,
              expected_batch_size=4.0, key=jax.random.key(0), weight_decay=0.5)
  state = tx.init(params)
  updates, state = tx.update(grad_sum, state, params)
  want = -0.1 * (np.array([4.0, 0.0, -8.0]) / 4.0 + 0.5 * np.array([1.0, -2.0, 3.0]))
  np.testing.assert_allclose(updates["w"], want, rtol=1e-6)
  np.testing.assert_allclose(state[2].hyperparams["learning_rate"], 0.1)


def test_dp_adam_without_noise_matches_optax_adamw():
  params = {"w": jnp.array([1.0, -2.0, 3.0])}
  grad_sum = {"w": jnp.array([4.0, 1.0, -8.0])}
  tx = dp_adam(learning_rate=0.01, l2_clip_norm=1.0, noise_multiplier=0.0,
               expected_batch_size=2.0, key=jax.random.key(0), weight_decay=0.1)
  ref = optax.adamw(0.01, weight_decay=0.1)
  s, r = tx.init(params), ref.init(params)
  for _ in range(3):
    u, s = tx.update(grad_sum, s, params)
    v, r = ref.update(jax.tree.map(lambda g: g / 2.0, grad_sum), r, params)
    np.testing.assert_allclose(u["w"], v["w"], rtol=1e-5)


def test_rejects_non_key():
  with pytest.raises(ValueError, match="key"):
    add_gaussian_noise(1.0, 1.0, 42)
