"""A small pre-LN transformer classifier whose attention projections may carry LoRA adapters.

`TransformerClassifier` maps token ids (b, T) to logits (b, num_classes):
token `flax.linen.Embed` + learned positions (`Embed` over 0..T-1), `depth`
blocks of multi-head self-attention and an MLP (each after a LayerNorm, with
a residual), a final LayerNorm, the mean over the non-padding tokens, and a
`Dense` head. Token `pad_id` is padding: no query attends to it and the
pooling skips it.

`SelfAttention` is multi-head self-attention whose query/key/value/output
projections are `flax.linen.DenseGeneral`, with the parameter tree of
`flax.linen.MultiHeadDotProductAttention` (`query`, `key`, `value`, `out`,
each `kernel` and `bias`), so the weights of a Flax attention layer load into
it unchanged. With `lora_rank` set, every projection is a
`jaxdp.models.lora.LoRADenseGeneral`: the pretrained projection plus a
low-rank adapter, the standard place for LoRA (Hu et al., ICLR 2022); train
the adapters alone with `Task(trainable=lora.adapters)` (and the head, for a
new task).

Every trainable parameter of this model has a ghost norm or a cheap exact
per-example gradient under `Task(clipping="auto")`: the embeddings and
projections by `jaxdp.train.ghost`, the LayerNorm scales and biases by
per-example gradients (2 d numbers per example each).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxdp import _validate
from jaxdp.models import lora


class SelfAttention(nn.Module):
  """Multi-head self-attention with `flax.linen.MultiHeadDotProductAttention`'s parameter tree.

  Attributes:
    num_heads: heads; the input width must be a multiple of it.
    lora_rank: None for plain projections; r >= 1 puts a rank-r adapter on
      each of the four projections (`lora.LoRADenseGeneral`).
    lora_alpha: the adapters' scale numerator (None: r).
  """
  num_heads: int
  lora_rank: int | None = None
  lora_alpha: float | None = None

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """x (..., T, d), mask broadcastable to (..., heads, T, T) (True: attend) -> (..., T, d)."""
    width = x.shape[-1]
    if width % self.num_heads:
      raise ValueError(f"the input width ({width}) must be a multiple of num_heads ({self.num_heads})")
    if self.lora_rank is None:
      dense = nn.DenseGeneral
    else:
      dense = functools.partial(lora.LoRADenseGeneral, rank=self.lora_rank, alpha=self.lora_alpha)
    heads = (self.num_heads, width // self.num_heads)
    query, key, value = (dense(features=heads, name=name)(x) for name in ("query", "key", "value"))
    y = nn.dot_product_attention(query, key, value, mask=mask)
    return dense(features=width, axis=(-2, -1), name="out")(y)


class TransformerClassifier(nn.Module):
  """Token ids (b, T) -> logits (b, num_classes): a pre-LN transformer encoder, mean-pooled.

  Attributes:
    vocab_size: tokens are in [0, vocab_size).
    num_classes: output logits.
    max_length: the longest sequence (the positional table's rows).
    width: the model width d.
    depth: transformer blocks.
    num_heads: attention heads.
    mlp_width: the MLP's hidden width (None: 4 d).
    pad_id: the padding token (None: no padding).
    lora_rank, lora_alpha: adapters on the attention projections (see
      `SelfAttention`).
  """
  vocab_size: int
  num_classes: int = 2
  max_length: int = 64
  width: int = 128
  depth: int = 2
  num_heads: int = 4
  mlp_width: int | None = None
  pad_id: int | None = 0
  lora_rank: int | None = None
  lora_alpha: float | None = None

  @nn.compact
  def __call__(self, tokens: jax.Array) -> jax.Array:
    _validate.integer("vocab_size", self.vocab_size, low=2)
    _validate.integer("num_classes", self.num_classes, low=2)
    length = tokens.shape[-1]
    if length > self.max_length:
      raise ValueError(f"sequence length {length} exceeds max_length={self.max_length}")
    h = nn.Embed(self.vocab_size, self.width, name="tokens")(tokens)
    h = h + nn.Embed(self.max_length, self.width, name="positions")(jnp.arange(length))
    if self.pad_id is None:
      keep = jnp.ones(tokens.shape, bool)
    else:
      keep = tokens != self.pad_id
    attend = keep[..., None, None, :]  # every query attends to the non-padding keys
    for i in range(self.depth):
      h = h + SelfAttention(self.num_heads, self.lora_rank, self.lora_alpha, name=f"attention_{i}")(
          nn.LayerNorm(name=f"ln_attention_{i}")(h), attend)
      m = nn.LayerNorm(name=f"ln_mlp_{i}")(h)
      m = nn.Dense(self.mlp_width or 4 * self.width, name=f"mlp_in_{i}")(m)
      h = h + nn.Dense(self.width, name=f"mlp_out_{i}")(nn.gelu(m))
    h = nn.LayerNorm(name="ln_final")(h)
    weights = keep.astype(h.dtype)[..., None]
    pooled = jnp.sum(h * weights, axis=-2) / jnp.maximum(jnp.sum(weights, axis=-2), 1.0)
    return nn.Dense(self.num_classes, name="head")(pooled)
