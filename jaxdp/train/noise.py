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
import optax


class GaussianNoiseState(NamedTuple):
  """State of `add_gaussian_noise`."""
  key: jax.Array
  noise_multiplier: jax.Array
  l2_clip_norm: jax.Array


def _check_key(key) -> None:
  if not isinstance(key, jax.Array) or not (
      jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
      or (key.dtype == jnp.uint32 and key.shape[-1:] == (2,))):
    raise ValueError(f"key must be a JAX PRNG key (jax.random.key(seed)), got {key!r}")


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
  _check_key(key)

  def init_fn(params):
    del params
    return GaussianNoiseState(key=key,
                              noise_multiplier=jnp.asarray(noise_multiplier, jnp.float32),
                              l2_clip_norm=jnp.asarray(l2_clip_norm, jnp.float32))

  def update_fn(updates, state, params=None):
    del params
    next_key, step_key = jax.random.split(state.key)
    leaves, treedef = jax.tree.flatten(updates)
    keys = jax.random.split(step_key, len(leaves))
    std = state.noise_multiplier * state.l2_clip_norm
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
  a data-dependent count that the privacy analysis does not cover. Dividing by
  q*N instead assumes the dataset size N is public (README, "Privacy
  assumptions"): N is not hidden by the accounted add/remove-one guarantee.

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
