"""DP-SGD and DP-Adam as optax chains over the clipped per-example gradient sum.

Input to `update` is sum_i clip(g_i) over the sampled batch (from
`clipped_grad_sum` or `clip_per_example_l2`).  The chain adds Gaussian noise,
divides by the expected batch size and applies the optimiser; everything after
the noise is post-processing and costs no privacy.
"""

from __future__ import annotations

import jax
import optax

from jaxdp.train.noise import add_gaussian_noise, normalize_by_expected_batch_size


def _sgd(learning_rate, weight_decay, momentum):
  return optax.chain(optax.add_decayed_weights(weight_decay),
                     optax.sgd(learning_rate, momentum=momentum if momentum else None))


def _adam(learning_rate, weight_decay, b1, b2, eps):
  return optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)


def dp_sgd(*, learning_rate, l2_clip_norm, noise_multiplier, expected_batch_size,
           key: jax.Array, weight_decay=0.0, momentum: float = 0.0
           ) -> optax.GradientTransformation:
  """DP-SGD over clipped gradient sums; hyperparameters are arrays in the state.

  Args:
    learning_rate: step size (float or traced scalar).
    l2_clip_norm: clip norm C used to clip the incoming sum's terms.
    noise_multiplier: sigma; the noise std is sigma * C.
    expected_batch_size: q * N, the divisor of the noisy sum.
    key: PRNG key for the noise.
    weight_decay: L2 decay added to the (noisy) gradient.
    momentum: heavy-ball momentum, static; 0 disables it.

  Returns:
    The optax transformation.
  """
  return optax.chain(
      add_gaussian_noise(noise_multiplier, l2_clip_norm, key),
      normalize_by_expected_batch_size(expected_batch_size),
      optax.inject_hyperparams(_sgd, static_args=("momentum",))(
          learning_rate=learning_rate, weight_decay=weight_decay, momentum=momentum))


def dp_adam(*, learning_rate, l2_clip_norm, noise_multiplier, expected_batch_size,
            key: jax.Array, weight_decay=0.0, b1: float = 0.9, b2: float = 0.999,
            eps: float = 1e-8) -> optax.GradientTransformation:
  """DP-Adam (decoupled weight decay, i.e. AdamW) over clipped gradient sums.

  Args:
    learning_rate: step size.
    l2_clip_norm: clip norm C.
    noise_multiplier: sigma.
    expected_batch_size: q * N.
    key: PRNG key for the noise.
    weight_decay: decoupled weight decay.
    b1: first-moment decay.
    b2: second-moment decay.
    eps: denominator epsilon.

  Returns:
    The optax transformation.
  """
  return optax.chain(
      add_gaussian_noise(noise_multiplier, l2_clip_norm, key),
      normalize_by_expected_batch_size(expected_batch_size),
      optax.inject_hyperparams(_adam, static_args=("b1", "b2", "eps"))(
          learning_rate=learning_rate, weight_decay=weight_decay, b1=b1, b2=b2, eps=eps))
