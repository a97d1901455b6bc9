import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp.train import sampling


def test_poisson_batch_sizes_follow_binomial():
  n, q, draws = 1000, 0.05, 4000
  keys = jax.random.split(jax.random.key(123), draws)
  sizes = np.asarray(jax.jit(jax.vmap(lambda k: sampling.poisson_mask(k, n, q).sum()))(keys))
  mean, var = n * q, n * q * (1 - q)
  # Standard error of the mean is sqrt(var / draws) ~ 0.11; of the variance ~ 1.1.
  assert abs(sizes.mean() - mean) < 5 * np.sqrt(var / draws)
  assert abs(sizes.var() - var) < 0.15 * var
  # Each example is included with probability q, independently of its index.
  incl = np.asarray(jax.vmap(lambda k: sampling.poisson_mask(k, n, q))(keys[:2000])).mean(0)
  assert abs(incl.mean() - q) < 0.003
  assert np.all(np.abs(incl - q) < 6 * np.sqrt(q * (1 - q) / 2000))


def test_sampled_indices_lists_selected_first():
  mask = jnp.array([False, True, True, False, True])
  idx, count = sampling.sampled_indices(mask, 8)
  assert int(count) == 3
  np.testing.assert_array_equal(idx, [1, 2, 4, 0, 0, 0, 0, 0])


@pytest.mark.parametrize("padded,micro", [(4, 2), (6, 3), (8, 8), (60, 20)])
def test_every_sampled_example_is_processed_exactly_once_even_past_the_padding(padded, micro):
  n, q = 50, 0.5   # ~25 sampled per step: well beyond small paddings
  key = jax.random.key(7)

  def fn(idx, valid):
    return jnp.zeros(n).at[idx].add(valid.astype(jnp.float32))

  counts, size = jax.jit(lambda k: sampling.poisson_batch_sum(
      k, fn, num_examples=n, sampling_prob=q, padded_batch_size=padded,
      microbatch_size=micro))(key)
  mask = np.asarray(sampling.poisson_mask(key, n, q))
  np.testing.assert_array_equal(np.asarray(counts), mask.astype(np.float32))
  assert int(size) == mask.sum()


def test_overflow_is_actually_exercised():
  # Guards the test above: with q = 0.5 and padding 4 the sample overflows.
  assert int(sampling.poisson_mask(jax.random.key(7), 50, 0.5).sum()) > 8


@pytest.mark.parametrize("n,q,micro,want", [
    (60000, 256 / 60000, None, 320),   # 256 + 4 * sqrt(256 * (1 - q)) = 319.86
    (60000, 256 / 60000, 64, 320),
    (60000, 256 / 60000, 100, 400),
    (1797, 0.05, None, 127),           # 89.85 + 4 * 9.24 = 126.8
    (10, 1.0, None, 10),
    (10, 0.9, None, 10),               # capped at N
])
def test_default_padded_batch_size(n, q, micro, want):
  assert sampling.default_padded_batch_size(n, q, micro) == want


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_examples=0, sampling_prob=0.1), "num_examples"),
    (dict(num_examples=10, sampling_prob=0.0), "sampling_prob"),
    (dict(num_examples=10, sampling_prob=1.5), "sampling_prob"),
    (dict(num_examples=10, sampling_prob=0.5, microbatch_size=0), "microbatch_size"),
])
def test_default_padded_batch_size_rejects_bad_input(kwargs, match):
  with pytest.raises(ValueError, match=match):
    sampling.default_padded_batch_size(**kwargs)


@pytest.mark.parametrize("padded,micro,match", [
    (0, 1, "padded_batch_size"), (10, 0, "microbatch_size"), (10, 3, "multiple"),
    (2.5, 1, "padded_batch_size"),
])
def test_poisson_batch_sum_rejects_bad_sizes(padded, micro, match):
  with pytest.raises(ValueError, match=match):
    sampling.poisson_batch_sum(jax.random.key(0), lambda i, v: v, num_examples=10,
                               sampling_prob=0.5, padded_batch_size=padded, microbatch_size=micro)
