import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

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


@pytest.mark.parametrize("q", [0.0, 0.1, 0.5])
def test_only_the_microbatches_holding_sampled_rows_are_computed(q):
  # Each computed microbatch adds 1 to the second output: ceil(B / m) of them, whatever the padding.
  n, padded, micro = 50, 40, 4
  def fn(idx, valid):
    return jnp.zeros(n).at[idx].add(valid.astype(jnp.float32)), jnp.int32(1)

  for seed in range(3):
    key = jax.random.key(seed)
    (counts, calls), size = jax.jit(lambda k: sampling.poisson_batch_sum(
        k, fn, num_examples=n, sampling_prob=q, padded_batch_size=padded, microbatch_size=micro))(key)
    mask = np.asarray(sampling.poisson_mask(key, n, q))
    np.testing.assert_array_equal(np.asarray(counts), mask.astype(np.float32))
    assert int(calls) == -(-int(mask.sum()) // micro) and int(size) == mask.sum()


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


@pytest.mark.parametrize("q,want", [
    (0.0, 0),
    (2.0**-33, 0),                     # below one step of the 2**-32 grid: never sampled
    (1e-9, 4),                         # 1e-9 * 2**32 = 4.29
    (3e-8, 128),                       # 3e-8 * 2**32 = 128.85
    (0.1, 429496729),                  # 0.1 * 2**32 = 429496729.6
    (0.5, 2**31),                      # exact: no rounding at all
    (1 - 2.0**-40, 2**32 - 1),         # 2**32 - 2**-8, floored
    (1.0, 2**32),                      # everyone
], ids=lambda v: repr(v))
def test_threshold_is_q_times_2_to_32_rounded_down(q, want):
  assert sampling.sampling_threshold(q) == want
  assert sampling.sampling_threshold(np.float64(q)) == want


@pytest.mark.parametrize("q", [1e-9, 3e-8, 0.05, 0.1, 1 / 3, 0.5, 0.999], ids=repr)
def test_mask_is_exactly_bits_below_the_threshold(q):
  # The same bits the mask draws: any rounding up of q would include extra rows.
  key = jax.random.key(11)
  n = 200_000
  bits = np.asarray(jax.random.bits(key, (n,), jnp.uint32)).astype(np.uint64)
  want = bits < math.floor(q * 2**32)
  np.testing.assert_array_equal(np.asarray(sampling.poisson_mask(key, n, q)), want)
  np.testing.assert_array_equal(np.asarray(jax.jit(lambda k: sampling.poisson_mask(k, n, q))(key)), want)


@pytest.mark.parametrize("traced", [False, True], ids=["concrete", "traced"])
def test_q_one_includes_everyone_and_q_zero_nobody(traced):
  key, n = jax.random.key(5), 100_000
  fn = jax.jit(lambda k, q: sampling.poisson_mask(k, n, q)) if traced else (
      lambda k, q: sampling.poisson_mask(k, n, q))
  assert bool(jnp.all(sampling.poisson_mask(key, n, 1.0)))  # the accounted float64 q = 1
  assert not bool(jnp.any(fn(key, 0.0)))


@pytest.mark.parametrize("traced", [False, True], ids=["concrete", "traced"])
@pytest.mark.parametrize("dtype,accounted,below_one,key,n", [
    # float32(1 - 1e-8) == 1: it samples at 1 - 2**-24, threshold 2**32 - 2**8.
    (jnp.float32, 1 - 1e-8, 1 - 2.0**-24, 14, 2**20),
    # bfloat16(0.9993) == 1: at 1 - 2**-8, threshold 2**32 - 2**24.
    (jnp.bfloat16, 0.9993, 1 - 2.0**-8, 5, 100_000),
], ids=["float32", "bfloat16"])
def test_narrow_array_q_that_rounds_to_one_never_samples_everyone(dtype, accounted, below_one, key,
                                                                   n, traced):
  q = jnp.asarray(accounted, dtype)
  assert float(q) == 1.0  # the cast rounded the accounted q up to 1
  key = jax.random.key(key)
  bits = np.asarray(jax.random.bits(key, (n,), jnp.uint32)).astype(np.uint64)
  want = bits < math.floor(below_one * 2**32)
  assert not want.all()  # this key draws bits that only q = 1 would include
  fn = jax.jit(lambda k, q: sampling.poisson_mask(k, n, q)) if traced else (
      lambda k, q: sampling.poisson_mask(k, n, q))
  np.testing.assert_array_equal(np.asarray(fn(key, q)), want)
  assert below_one <= accounted


@pytest.mark.parametrize("q", [1e-9, 3e-8, 0.1, 1 / 3, 0.999], ids=repr)
def test_traced_q_never_rounds_above_the_accounted_float64(q):
  # A traced q arrives as float32; float32(0.1) is *above* 0.1, so its own floor
  # would overshoot. The traced path stays at or below floor(q * 2**32).
  key, n = jax.random.key(3), 200_000
  bits = np.asarray(jax.random.bits(key, (n,), jnp.uint32)).astype(np.uint64)
  traced = np.asarray(jax.jit(lambda k, q: sampling.poisson_mask(k, n, q))(key, q))
  assert not np.any(traced & ~(bits < math.floor(q * 2**32)))
  q32 = float(np.float32(q))
  # The shortfall is at most one float32 ulp of q (2**-24 relative) plus 2**-32.
  assert np.all(traced | ~(bits < math.floor((q32 - 2 * q32 * 2.0**-24) * 2**32)))


@pytest.mark.parametrize("q", [1e-9, 3e-8], ids=repr)
def test_tiny_q_is_never_rounded_up(q):
  # 10**8 draws in chunks of 10**7. The old float32-uniform rule rounded q up to
  # the 2**-23 grid: 9 inclusions at q = 1e-9 (expected ~0.1), 9 at 3e-8. The
  # count must stay below the 1 - 1e-6 upper quantile of Binomial(10**8, q)
  # with q the *accounted* probability: 4 for 1e-9, 14 for 3e-8.
  chunk, chunks = 10**7, 10
  count_fn = jax.jit(lambda k: sampling.poisson_mask(k, chunk, q).sum(dtype=jnp.int32))
  count = sum(int(count_fn(k)) for k in jax.random.split(jax.random.key(2024), chunks))
  bound = scipy.stats.binom.ppf(1 - 1e-6, chunk * chunks, q)
  assert bound == {1e-9: 4, 3e-8: 14}[q]
  assert count <= bound


def test_concrete_q_outside_unit_interval_is_rejected():
  with pytest.raises(ValueError, match=r"sampling_prob must be in \[0.0, 1.0\], got 1.5"):
    sampling.poisson_mask(jax.random.key(0), 10, 1.5)
