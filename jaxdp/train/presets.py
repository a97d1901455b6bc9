"""Ready-made tasks: the papers' classifiers as ordinary tasks (`Task`).

`classifier(num_classes)` is a `Task` like any user's: softmax cross-entropy
on `DataSplit(inputs, labels)` batches, test accuracy as the (public) score,
and a model and optimizer built from the hyperparameters::

  model: one of `jaxdp.models.MODELS` or any Flax module (static; default 'logreg'),
  activation: for models with hidden layers (static; default 'tanh'),
  optimizer: 'sgd' or 'adam' (static; default 'sgd'),
  learning_rate: > 0 (traced),
  weight_decay: >= 0, coupled for SGD, decoupled (AdamW) for Adam (traced; default 0),
  momentum: in [0, 1), SGD only (static; default 0).
"""

from __future__ import annotations

from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from jaxdp import _validate
from jaxdp.models import CONV_IMPLS, MODELS, get_activation, get_model
from jaxdp.train.task import Task

OPTIMIZERS = ("sgd", "adam")


def _concrete(value) -> bool:
  return not isinstance(value, jax.core.Tracer)


def classifier_optimizer(hp: Mapping[str, Any]) -> optax.GradientTransformation:
  """SGD (coupled weight decay, optional momentum) or AdamW from `hp`."""
  name = hp.get("optimizer", "sgd")
  learning_rate = hp["learning_rate"]
  weight_decay = hp.get("weight_decay", 0.0)
  momentum = hp.get("momentum", 0.0)
  if name not in OPTIMIZERS:
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")
  if _concrete(learning_rate):
    _validate.real("learning_rate", learning_rate, low=0.0, low_open=True)
  if _concrete(weight_decay):
    _validate.real("weight_decay", weight_decay, low=0.0)
  _validate.real("momentum", momentum, low=0.0, high=1.0, high_open=True)
  if name == "sgd":
    return optax.chain(optax.add_decayed_weights(weight_decay),
                       optax.sgd(learning_rate, momentum=momentum or None))
  if momentum:
    raise ValueError(f"momentum applies to optimizer='sgd' only, got optimizer={name!r} with "
                     f"momentum={momentum!r}")
  return optax.adamw(learning_rate, weight_decay=weight_decay)


def _extrapolate(hp: Mapping[str, Any], m: int, n: int) -> dict:
  # KK Sec. 4: DP-SGD keeps the per-step noise-to-signal ratio with lr x n/m;
  # Adam is scale invariant, so its learning rate is kept.
  out = dict(hp)
  if hp.get("optimizer", "sgd") == "sgd":
    out["learning_rate"] = hp["learning_rate"] * n / m
  return out


def _accuracy(logits, batch) -> jax.Array:
  return jnp.mean(jnp.argmax(logits, -1) == batch.labels)


def _cross_entropy(logits, batch) -> jax.Array:
  return optax.softmax_cross_entropy_with_integer_labels(logits, batch.labels)


def classifier(num_classes: int, *, conv_impl: str = "im2col", name: str = "classifier") -> Task:
  """A softmax classifier task over `DataSplit` batches, scored by public test accuracy.

  Args:
    num_classes: number of logits, >= 2.
    conv_impl: convolution lowering of the built-in CNNs, 'im2col' (fast
      per-example gradients) or 'native'.
    name: the task's label.

  Returns:
    The `Task`; see the module docstring for the hyperparameters it reads.
  """
  num_classes = _validate.integer("num_classes", num_classes, low=2)
  if conv_impl not in CONV_IMPLS:
    raise ValueError(f"conv_impl must be one of {CONV_IMPLS}, got {conv_impl!r}")

  def model(hp):
    chosen = hp.get("model", "logreg")
    activation = hp.get("activation", "tanh")
    get_activation(activation)
    if isinstance(chosen, nn.Module):
      return chosen
    if chosen not in MODELS:
      raise ValueError(f"model must be one of {MODELS} or a flax.linen.Module, got {chosen!r}")
    return get_model(chosen, num_classes=num_classes, activation=activation, conv_impl=conv_impl)

  return Task(model=model, loss=_cross_entropy, score=_accuracy, optimizer=classifier_optimizer,
              static=("momentum",), extrapolate=_extrapolate,
              name=name)
