"""The models used in the DP hyperparameter-tuning papers, as Flax modules.

Every model maps a batch with a leading example axis to logits of shape
(batch, num_classes).  Images are NHWC float arrays; the MLP and logistic
regression flatten whatever follows the batch axis, so they also take feature
vectors (e.g. hashed bag-of-words for IMDB).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxdp.models.activations import get_activation
from jaxdp.models.layers import Conv2D, max_pool

Activation = Any  # str or jaxdp.models.TemperedSigmoid


class PapernotSteinkeCNN(nn.Module):
  """All-convolutional MNIST network of Papernot & Steinke (ICLR 2022).

  The paper specifies only "feature maps 32, 32, 64, 64, 64 with 3x3 kernels".
  Our reading, in the all-convolutional style of Springenberg et al. (2015)
  where strided convolutions replace pooling:

    conv3x3(32, stride 1) -> conv3x3(32, stride 2) -> conv3x3(64, stride 1)
    -> conv3x3(64, stride 2) -> conv3x3(64, stride 1) -> global average pool
    -> dense(num_classes),

  all with SAME padding, so a 28x28 input goes 28 -> 14 -> 7 spatially.  It
  accepts any spatial size because of the global average pool.

  Attributes:
    num_classes: number of output logits.
    activation: 'relu', 'tanh', 'tempered_sigmoid' or a `TemperedSigmoid`.
    conv_impl: 'im2col' or 'native' (see `jaxdp.models.layers.Conv2D`).
  """
  num_classes: int = 10
  activation: Activation = "tanh"
  conv_impl: str = "im2col"

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    act = get_activation(self.activation)
    for features, stride in ((32, 1), (32, 2), (64, 1), (64, 2), (64, 1)):
      x = act(Conv2D(features, (3, 3), (stride, stride), "SAME", self.conv_impl)(x))
    x = jnp.mean(x, axis=(-3, -2))
    return nn.Dense(self.num_classes)(x)


class OpacusMnistCNN(nn.Module):
  """The CNN of Opacus' MNIST example (also Papernot et al. 2020's MNIST net).

  conv8x8(16, stride 2, pad 3) -> maxpool2x2(stride 1) -> conv4x4(32, stride 2)
  -> maxpool2x2(stride 1) -> dense(32) -> dense(num_classes).  Needs 28x28 input.

  Attributes:
    num_classes: number of output logits.
    activation: 'relu', 'tanh', 'tempered_sigmoid' or a `TemperedSigmoid`.
    conv_impl: 'im2col' or 'native'.
  """
  num_classes: int = 10
  activation: Activation = "tanh"
  conv_impl: str = "im2col"

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    act = get_activation(self.activation)
    x = act(Conv2D(16, (8, 8), (2, 2), ((3, 3), (3, 3)), self.conv_impl)(x))
    x = max_pool(x, (2, 2), (1, 1))
    x = act(Conv2D(32, (4, 4), (2, 2), "VALID", self.conv_impl)(x))
    x = max_pool(x, (2, 2), (1, 1))
    x = x.reshape(x.shape[0], -1)
    x = act(nn.Dense(32)(x))
    return nn.Dense(self.num_classes)(x)


class MLP(nn.Module):
  """Three dense layers (two hidden of `width`), as used for FashionMNIST.

  Attributes:
    num_classes: number of output logits.
    width: hidden width (120 in the papers).
    activation: 'relu', 'tanh', 'tempered_sigmoid' or a `TemperedSigmoid`.
  """
  num_classes: int = 10
  width: int = 120
  activation: Activation = "tanh"

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    act = get_activation(self.activation)
    x = x.reshape(x.shape[0], -1)
    x = act(nn.Dense(self.width)(x))
    x = act(nn.Dense(self.width)(x))
    return nn.Dense(self.num_classes)(x)


class LogisticRegression(nn.Module):
  """Multinomial logistic regression on the flattened input.

  Attributes:
    num_classes: number of output logits.
  """
  num_classes: int = 10

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    return nn.Dense(self.num_classes)(x.reshape(x.shape[0], -1))


MODELS = ("papernot_steinke_cnn", "opacus_cnn", "mlp", "logreg")


def get_model(name: str, *, num_classes: int, activation: Activation = "tanh",
              conv_impl: str = "im2col") -> nn.Module:
  """Builds a model by name.

  Args:
    name: one of `MODELS`.
    num_classes: number of output logits, >= 2.
    activation: activation for models that have hidden layers.
    conv_impl: convolution lowering for the CNNs, 'im2col' or 'native'.

  Returns:
    The Flax module.

  Raises:
    ValueError: for an unknown name, activation, conv_impl or num_classes < 2.
  """
  from jaxdp import _validate  # local: keeps the module import light
  _validate.integer("num_classes", num_classes, low=2)
  get_activation(activation)
  if conv_impl not in ("im2col", "native"):
    raise ValueError(f"conv_impl must be one of ('im2col', 'native'), got {conv_impl!r}")
  if name == "papernot_steinke_cnn":
    return PapernotSteinkeCNN(num_classes=num_classes, activation=activation, conv_impl=conv_impl)
  if name == "opacus_cnn":
    return OpacusMnistCNN(num_classes=num_classes, activation=activation, conv_impl=conv_impl)
  if name == "mlp":
    return MLP(num_classes=num_classes, activation=activation)
  if name == "logreg":
    return LogisticRegression(num_classes=num_classes)
  raise ValueError(f"model must be one of {MODELS}, got {name!r}")
