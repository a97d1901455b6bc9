"""Layers whose parameters match `flax.linen.Conv` but whose lowering is selectable.

Per-example gradients of a convolution (what `jax.vmap(jax.grad(...))` builds)
lower to a batch-grouped convolution, which XLA's CPU backend runs far slower
than the equivalent batched matrix multiply.  Writing the convolution as
patch extraction followed by `dot_general` ("im2col") keeps the per-example
weight gradient a plain batched matmul on every backend, and on CPU also makes
the ordinary (non-private) step faster.  Both lowerings compute the same
function with the same parameter tree, so parameters are interchangeable.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

CONV_IMPLS = ("im2col", "native")


def _pad_amounts(padding, kernel_size, strides, spatial):
  if isinstance(padding, str):
    return [tuple(p) for p in jax.lax.padtype_to_pads(spatial, kernel_size, strides, padding)]
  return [tuple(p) for p in padding]


def extract_patches(x: jax.Array, kernel_size: Sequence[int], strides: Sequence[int],
                    padding) -> jax.Array:
  """Returns (N, H', W', kh*kw*C) patches, feature axis ordered (kh, kw, C).

  The order matches `kernel.reshape(-1, out)` for a flax kernel of shape
  (kh, kw, C, out), so the convolution is a single matmul.

  Args:
    x: array of shape (N, H, W, C).
    kernel_size: (kh, kw).
    strides: (sh, sw).
    padding: 'SAME', 'VALID' or ((top, bottom), (left, right)).

  Returns:
    The patch array.
  """
  kh, kw = kernel_size
  sh, sw = strides
  h, w = x.shape[1], x.shape[2]
  (pt, pb), (pl, pr) = _pad_amounts(padding, (kh, kw), (sh, sw), (h, w))
  x = jnp.pad(x, [(0, 0), (pt, pb), (pl, pr), (0, 0)])
  out_h = (h + pt + pb - kh) // sh + 1
  out_w = (w + pl + pr - kw) // sw + 1
  # Strided slices, not lax.conv_general_dilated_patches: the patches op
  # compiles faster but its per-example backward ran ~10x slower on CPU.
  cols = []
  for i in range(kh):
    for j in range(kw):
      cols.append(x[:, i:i + sh * (out_h - 1) + 1:sh, j:j + sw * (out_w - 1) + 1:sw, :])
  return jnp.concatenate(cols, axis=-1)


class Conv2D(nn.Module):
  """2-D convolution over NHWC inputs (N, H, W, C) with `flax.linen.Conv`'s parameter layout.

  Attributes:
    features: number of output channels.
    kernel_size: (kh, kw).
    strides: (sh, sw).
    padding: 'SAME', 'VALID' or explicit ((top, bottom), (left, right)).
    impl: 'im2col' (patches + matmul) or 'native' (`lax.conv_general_dilated`).
  """
  features: int
  kernel_size: tuple[int, int] = (3, 3)
  strides: tuple[int, int] = (1, 1)
  padding: str | tuple = "SAME"
  impl: str = "im2col"

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    if self.impl not in CONV_IMPLS:
      raise ValueError(f"conv impl must be one of {CONV_IMPLS}, got {self.impl!r}")
    cin = x.shape[-1]
    kernel = self.param("kernel", nn.initializers.lecun_normal(),
                        (*self.kernel_size, cin, self.features), jnp.float32)
    bias = self.param("bias", nn.initializers.zeros_init(), (self.features,), jnp.float32)
    if self.impl == "native":
      pads = _pad_amounts(self.padding, self.kernel_size, self.strides, x.shape[-3:-1])
      y = jax.lax.conv_general_dilated(x, kernel, self.strides, pads,
                                       dimension_numbers=("NHWC", "HWIO", "NHWC"))
    else:
      patches = extract_patches(x, self.kernel_size, self.strides, self.padding)
      y = jnp.dot(patches, kernel.reshape(-1, self.features))
    return y + bias


def max_pool(x: jax.Array, window: tuple[int, int], strides: tuple[int, int]) -> jax.Array:
  """VALID max pooling over the two spatial axes of (N, H, W, C)."""
  dims = (1, *window, 1)
  strd = (1, *strides, 1)
  return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, dims, strd, "VALID")
