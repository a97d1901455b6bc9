"""Gaussian noise for the clipped gradient sum, and the expected-batch normalisation.

Hyperparameters live in the transformation state as arrays (like
`optax.inject_hyperparams`), so a sweep can `jax.vmap` over a candidate axis of
noise multipliers and clip norms without recompiling.  The PRNG key also lives
in the state and is split on every update, so two steps never reuse noise.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdp import _validate


def round_up_float32(value) -> np.ndarray:
  """The smallest float32 >= `value` (a concrete number or NumPy array, read as float64).

  Noise scales enter the device as float32; rounding to nearest would put
  the noise below the accounted sigma in about half the cases. Rounding up
  errs on the private side, as `jaxdp.train.sampling` does for q.
  """
  wide = np.asarray(value, np.float64)
  narrow = wide.astype(np.float32)
  return np.where(narrow < wide, np.nextafter(narrow, np.float32(np.inf)), narrow)


def _as_float32(value) -> jax.Array:
  """A noise multiplier on device: concrete numbers rounded up, JAX arrays (traced) as they are."""
  if isinstance(value, jax.Array):
    return jnp.asarray(value, jnp.float32)
  return jnp.asarray(round_up_float32(value))


class GaussianNoiseState(NamedTuple):
  """State of `add_gaussian_noise`."""
  key: jax.Array
  noise_multiplier: jax.Array
  l2_clip_norm: jax.Array


def add_gaussian_noise(noise_multiplier: float | jax.Array, l2_clip_norm: float | jax.Array,
                       key: jax.Array) -> optax.GradientTransformation:
  """Adds N(0, (noise_multiplier * l2_clip_norm)^2) independently to every coordinate.

  Feed it the *sum* of per-example clipped gradients (sensitivity
  `l2_clip_norm`); this is the Gaussian mechanism of DP-SGD.

  Args:
    noise_multiplier: sigma >= 0, noise std in units of the clip norm.
    l2_clip_norm: clip norm C > 0.
    key: PRNG key, split on every update.

  Returns:
    The gradient transformation.

  Raises:
    ValueError: if `key` is not a PRNG key.
  """
  _validate.prng_key("key", key, raw_ok=True)

  def init_fn(params):
    del params
    return GaussianNoiseState(key=key,
                              noise_multiplier=_as_float32(noise_multiplier),
                              l2_clip_norm=jnp.asarray(l2_clip_norm, jnp.float32))

  def update_fn(updates, state, params=None):
    del params
    next_key, step_key = jax.random.split(state.key)
    leaves, treedef = jax.tree.flatten(updates)
    keys = jax.random.split(step_key, len(leaves))
    # One ulp up (zero stays zero): the float32 product rounded to nearest may
    # fall below sigma * C, and the noise must never be below what is accounted.
    std = state.noise_multiplier * state.l2_clip_norm
    std = jnp.where(std > 0, jnp.nextafter(std, jnp.float32(jnp.inf)), std)
    noisy = [g + std * jax.random.normal(k, g.shape, g.dtype) for g, k in zip(leaves, keys)]
    return jax.tree.unflatten(treedef, noisy), state._replace(key=next_key)

  return optax.GradientTransformation(init_fn, update_fn)


class ExpectedBatchState(NamedTuple):
  """State of `normalize_by_expected_batch_size`."""
  expected_batch_size: jax.Array


def normalize_by_expected_batch_size(expected_batch_size: float | jax.Array
                                     ) -> optax.GradientTransformation:
  """Divides by the expected batch size q*N, never by the realised one.

  Dividing by the realised Poisson batch size would make the update depend on
  a data-dependent count that the privacy analysis does not cover. q*N is a
  constant of the mechanism: N is the declared public training set size
  (`jaxdp.data.Dataset.num_examples`), never the number of rows present
  (docs/guides/privacy.md).

  Args:
    expected_batch_size: q * N > 0.

  Returns:
    The gradient transformation.
  """
  def init_fn(params):
    del params
    return ExpectedBatchState(jnp.asarray(expected_batch_size, jnp.float32))

  def update_fn(updates, state, params=None):
    del params
    return jax.tree.map(lambda g: g / state.expected_batch_size, updates), state

  return optax.GradientTransformation(init_fn, update_fn)
