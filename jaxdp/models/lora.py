"""Low-rank adapters (LoRA, Hu et al., ICLR 2022) for Flax `Dense`, `DenseGeneral` and `Conv` layers.

`LoRADense` is a drop-in `flax.linen.Dense`: its own parameters are named as
Dense's (`kernel`, `bias`), so a pretrained Dense's parameters load into it
unchanged, and it adds two submodules, `lora_a` (d_in -> r, no bias) and
`lora_b` (r -> d_out, no bias, zero-initialised), both `DenseGeneral` layers:

  y = x W + b + (alpha / r) (x A) B.

At initialisation B = 0, so the layer computes the pretrained function. Train
only the adapters with `Task(trainable=lora.adapters)`: the frozen W and b get
no per-example gradient, no noise and no update (see `jaxdp.train.Task`).
`lora_a` and `lora_b` are plain `flax.linen.DenseGeneral` calls, so ghost
clipping (`Task(clipping="ghost")`) computes their norms without per-example
kernel gradients.

`LoRADenseGeneral` does the same for `flax.linen.DenseGeneral` (any
contracted `axis`, any `features` tuple), the layer of attention's
query/key/value/output projections: `lora_a` is a `DenseGeneral` over the
same axes to r features, `lora_b` a `DenseGeneral` from r to the features.
`jaxdp.models.transformer.SelfAttention(lora_rank=r)` puts one on each
projection of a Flax-compatible attention layer.

`LoRAConv` does the same for `flax.linen.Conv` (same `kernel`/`bias` names):
`lora_a` is a convolution with the layer's window to r channels, `lora_b` a
1x1 convolution to the output channels (zero-initialised).

The rank r and the scale alpha are model hyperparameters: tune them like any
other (`lambda hp: Net(rank=hp["rank"])` makes `rank` static).
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validate

ADAPTER_NAMES = ("lora_a", "lora_b")


def adapters(path: str) -> bool:
  """`Task(trainable=...)` predicate: True for the LoRA adapters' parameters only."""
  return any(part in ADAPTER_NAMES for part in path.split("/"))


def _scale(rank: int, alpha: float | None) -> float:
  rank = _validate.integer("rank", rank, low=1)
  alpha = float(rank) if alpha is None else _validate.real("alpha", alpha, low=0.0, low_open=True)
  return alpha / rank


def _as_tuple(value) -> tuple:
  return tuple(value) if isinstance(value, (tuple, list)) else (value,)


class LoRADenseGeneral(nn.Module):
  """`flax.linen.DenseGeneral` (no `batch_dims`) plus a rank-`rank` adapter over the same axes.

  Its `kernel` (the contracted input axes, then `features`) and `bias`
  (`features`) are shaped and initialised as DenseGeneral's, so a pretrained
  DenseGeneral's parameters load into it unchanged.

  Attributes:
    features: output features, an int or a tuple (e.g. (heads, head_dim)).
    rank: the adapter's rank r >= 1.
    alpha: the adapter's scale numerator (None: r, i.e. scale 1).
    axis: the contracted input axes, as in DenseGeneral.
    use_bias, kernel_init, bias_init: as in DenseGeneral.
  """
  features: int | tuple[int, ...]
  rank: int
  alpha: float | None = None
  axis: int | tuple[int, ...] = -1
  use_bias: bool = True
  kernel_init: Callable[..., Any] = nn.initializers.lecun_normal()
  bias_init: Callable[..., Any] = nn.initializers.zeros_init()

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    scale = _scale(self.rank, self.alpha)
    features = _as_tuple(self.features)
    axis = tuple(sorted(a % x.ndim for a in _as_tuple(self.axis)))  # as DenseGeneral's kernel lays them out
    contracted = tuple(x.shape[a] for a in axis)

    def flat(init, fan):  # DenseGeneral initialises the flattened (d_in, d_out) matrix
      return lambda key, shape, dtype=jnp.float32: init(key, fan, dtype).reshape(shape)

    kernel = self.param("kernel", flat(self.kernel_init, (int(np.prod(contracted)), int(np.prod(features)))),
                        contracted + features, jnp.float32)
    y = jax.lax.dot_general(x, kernel, ((axis, tuple(range(len(axis)))), ((), ())))
    if self.use_bias:
      y = y + self.param("bias", flat(self.bias_init, (int(np.prod(features)),)), features, jnp.float32)
    down = nn.DenseGeneral(self.rank, axis=axis, use_bias=False, name="lora_a")(x)
    up = nn.DenseGeneral(features, use_bias=False, kernel_init=nn.initializers.zeros_init(),
                         name="lora_b")(down)
    return y + scale * up


class LoRADense(LoRADenseGeneral):
  """`flax.linen.Dense` plus a rank-`rank` adapter, scaled by `alpha / rank` (alpha None: 1):
  `LoRADenseGeneral` over the last axis, with Dense's `kernel` (d_in, features) and `bias`.

  Attributes:
    features: output features.
    rank: the adapter's rank r >= 1.
    alpha: the adapter's scale numerator (None: r, i.e. scale 1).
    use_bias: as in Dense.
    kernel_init, bias_init: as in Dense (the frozen weights' initialisers,
      used when no pretrained parameters are given).
  """
  features: int


class LoRAConv(nn.Module):
  """`flax.linen.Conv` plus a rank-`rank` adapter (a `rank`-channel conv, then a zero 1x1 conv).

  Attributes:
    features: output channels.
    kernel_size: the window, as in Conv.
    rank: the adapter's rank r >= 1 (its inner channels).
    alpha: the adapter's scale numerator (None: r, i.e. scale 1).
    strides, padding, use_bias: as in Conv.
  """
  features: int
  kernel_size: tuple[int, ...]
  rank: int
  alpha: float | None = None
  strides: tuple[int, ...] | int = 1
  padding: Any = "SAME"
  use_bias: bool = True

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    scale = _scale(self.rank, self.alpha)
    kernel_size = tuple(self.kernel_size)
    kernel = self.param("kernel", nn.initializers.lecun_normal(),
                        (*kernel_size, x.shape[-1], self.features), jnp.float32)
    strides = (self.strides,) * len(kernel_size) if isinstance(self.strides, int) else tuple(self.strides)
    spatial = "".join("HWD"[:len(kernel_size)])
    dims = jax.lax.conv_dimension_numbers(x.shape, kernel.shape,
                                          (f"N{spatial}C", f"{spatial}IO", f"N{spatial}C"))
    y = jax.lax.conv_general_dilated(x, kernel, strides, self.padding, dimension_numbers=dims)
    if self.use_bias:
      y = y + self.param("bias", nn.initializers.zeros_init(), (self.features,), jnp.float32)
    down = nn.Conv(self.rank, kernel_size, strides=strides, padding=self.padding, use_bias=False,
                   name="lora_a")(x)
    up = nn.Conv(self.features, (1,) * len(kernel_size), use_bias=False,
                 kernel_init=nn.initializers.zeros_init(), name="lora_b")(down)
    return y + scale * up
