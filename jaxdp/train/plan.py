"""One DP-SGD plan: the object every private piece of a run is derived from.

`DpSgdPlan` holds the privacy parameters of one run (clip norm C, noise
multiplier sigma, Poisson rate q, steps T, training set size N). The
clipped-gradient function it builds carries its sensitivity (C, as in
jax_privacy's `clipped_grad`), the noise transform reads that sensitivity,
the batch selection uses q, the loop runs T steps, and `dp_event()` is built
from the same fields, so what is accounted cannot drift from what ran.

C and sigma are pytree leaves (a sweep vmaps them over candidates); q, T and
N are static. N is the declared, public training set size
(`jaxdp.data.Dataset.num_examples`): the normaliser q*N is this constant, and
the rows actually sampled are whatever the data holds.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

import dp_accounting
import jax
import numpy as np
import optax

from jaxdp.accounting import events as acc_events
from jaxdp.train.clipping import clipped_grad_sum
from jaxdp.train.ghost import ghost_sum_for
from jaxdp.train.noise import add_gaussian_noise, normalize_by_expected_batch_size, round_up_float32
from jaxdp.train.sampling import poisson_batch_sum

PyTree = Any


@dataclasses.dataclass(frozen=True)
class ClippedGrad:
  """`(params, batch, mask) -> sum over unmasked rows of clipped per-example gradients`.

  Attributes:
    fn: the function.
    sensitivity: the L2 sensitivity of its output under adding or removing
      one example (the clip norm).
  """
  fn: Callable[[PyTree, PyTree, jax.Array], PyTree]
  sensitivity: Any

  def __call__(self, params, batch, mask):
    return self.fn(params, batch, mask)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DpSgdPlan:
  """Privacy parameters of one DP-SGD run.

  Attributes:
    l2_clip_norm: C > 0 (a float, or an array when vmapped).
    noise_multiplier: sigma >= 0 (likewise); noise std is sigma * C.
    sampling_prob: q in (0, 1], static.
    num_steps: T, static.
    num_examples: N, static: the declared public training set size (updates
      divide by q*N whatever the number of rows). None only for a plan that
      is accounted, never run.
  """
  l2_clip_norm: Any
  noise_multiplier: Any
  sampling_prob: float = dataclasses.field(metadata=dict(static=True))
  num_steps: int = dataclasses.field(metadata=dict(static=True))
  num_examples: int = dataclasses.field(metadata=dict(static=True))

  @property
  def expected_batch_size(self) -> float:
    if self.num_examples is None:
      raise ValueError("this DpSgdPlan has no num_examples: it can be accounted, not run")
    return self.sampling_prob * self.num_examples

  def for_device(self) -> "DpSgdPlan":
    """This plan with C and sigma as float32 scalars, sigma rounded *up*.

    What a jitted program receives: a float64 sigma cast to float32 by
    rounding to nearest would fall below the accounted sigma half the time.
    """
    return dataclasses.replace(self, l2_clip_norm=np.float32(self.l2_clip_norm),
                               noise_multiplier=np.float32(round_up_float32(self.noise_multiplier)))

  def dp_event(self) -> dp_accounting.DpEvent:
    """T self-composed Poisson-subsampled Gaussian mechanisms (needs concrete C and sigma)."""
    return acc_events.dpsgd_event(self.sampling_prob, float(np.asarray(self.noise_multiplier)),
                                  self.num_steps)

  def clipped_grad(self, loss_fn: Callable[[PyTree, PyTree], jax.Array], *,
                   method: str = "auto") -> ClippedGrad:
    """Clipped per-example gradient sum of `loss_fn(params, batch) -> (b,)`; sensitivity C.

    `method` 'vmap' clips vmap per-example gradients; 'ghost' computes the
    norms of Embed/Dense/DenseGeneral/Conv layers without materialising their per-example
    gradients (`jaxdp.train.ghost`); 'auto' (default) chooses between the two
    per layer from their per-example bytes and work (`ghost_clipped_grad_sum`
    with `auto=True`). Every way, every example's contribution is clipped to
    norm C.
    """
    clip = self.l2_clip_norm
    if method not in ("auto", "vmap", "ghost"):
      raise ValueError(f"method must be 'auto', 'vmap' or 'ghost', got {method!r}")
    # One layer analysis for every call of fn in a trace (ghost_sum_for).
    summed = (functools.partial(clipped_grad_sum, loss_fn) if method == "vmap"
              else ghost_sum_for(loss_fn, auto=method == "auto"))

    def fn(params, batch, mask):
      return summed(params, batch, mask, clip)[0]
    return ClippedGrad(fn=fn, sensitivity=clip)

  def privatizer(self, clipped: ClippedGrad, key: jax.Array) -> optax.GradientTransformation:
    """Gaussian noise of std sigma x `clipped.sensitivity`, then division by q*N."""
    return optax.chain(add_gaussian_noise(self.noise_multiplier, clipped.sensitivity, key),
                       normalize_by_expected_batch_size(self.expected_batch_size))

  def batch_sum(self, key: jax.Array, fn, *, num_rows: int, padded_batch_size: int,
                microbatch_size: int, axis_name: Optional[str] = None,
                real_rows: Optional[jax.Array] = None):
    """Sums `fn(indices, valid)` over one Poisson sample at rate q of `num_rows` rows.

    `num_rows` is the number of rows of the training data (a static shape:
    a public capacity when `real_rows` masks the real ones among them,
    `jaxdp.train.padding`); each real row is sampled independently with
    probability q, a padding row never (see `poisson_batch_sum`). It never
    enters the normaliser, which is q*N with the declared N. With `axis_name` (data parallelism inside `shard_map`)
    the devices of that axis draw the same sample from the same key, each
    sums a disjoint share of its microbatches, and every device returns the
    `psum`: the same sum of the same clipped gradients, so the sensitivity,
    the noise that follows and `dp_event()` are those of one device.
    """
    return poisson_batch_sum(key, fn, num_examples=num_rows, sampling_prob=self.sampling_prob,
                             padded_batch_size=padded_batch_size, microbatch_size=microbatch_size,
                             axis_name=axis_name, real_rows=real_rows)
