"""The adversarial tests' small task: an MLP on dict data with a `NoisyMean` DP score, built
afresh on every call, so an identical rerun shares no object with the first run."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdp.data import Dataset
from jaxdp.train import NoisyMean, Task, TrainConfig

N, VALIDATION = 200, 100



class MLP(nn.Module):
  width: int = 8
  activation: str = "tanh"

  @nn.compact
  def __call__(self, x):
    hidden = nn.Dense(self.width, name="hidden")(x)
    hidden = jnp.tanh(hidden) if self.activation == "tanh" else nn.relu(hidden)
    return nn.Dense(1, name="out")(hidden)[:, 0]


def make_loss(kind="bce", weights=(1.0, 1.0, 1.0)):
  """A per-example loss, always named `loss`; `weights` are closed over as a NumPy array."""
  weights = np.asarray(weights, np.float32)

  def loss(logit, batch):
    if kind == "bce":
      per_example = optax.sigmoid_binary_cross_entropy(logit, batch["y"])
    else:
      per_example = (jax.nn.sigmoid(logit) - batch["y"]) ** 2
    return per_example * jnp.sum(weights) / 3.0
  return loss


def correct(logit, batch):
  return ((logit > 0) == (batch["y"] > 0.5)).astype(jnp.float32)


def sgd(hp):
  return optax.sgd(hp["learning_rate"])


def adam(hp):
  return optax.adam(hp["learning_rate"])


def make_task(sigma=1.0, clipping="auto", trainable=None, loss=None, optimizer=sgd, activation="tanh"):
  return Task(model=MLP(activation=activation), loss=loss or make_loss(),
              score=NoisyMean(correct, 0.0, 1.0, sigma, num_examples=VALIDATION),
              optimizer=optimizer, clipping=clipping, trainable=trainable, name="resume-mlp")


def sgd_momentum(hp):
  return optax.sgd(hp["learning_rate"], momentum=hp["momentum"])


def make_config(config_changes=None, **task_changes):
  fields = dict(l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=0.1, steps=4,
                hparams={"learning_rate": 0.1})
  return TrainConfig(task=make_task(**task_changes), **{**fields, **(config_changes or {})})


def split(rng, n, w):
  x = rng.normal(size=(n, 6)).astype(np.float32)
  return {"x": x, "y": (x @ w > 0).astype(np.float32)}


def make_data() -> Dataset:
  """N private training rows, a public test split and a private validation split."""
  rng = np.random.default_rng(0)
  w = rng.normal(size=6)
  return Dataset(train=split(rng, N, w), test=split(rng, 50, w),
                 private_validation=split(rng, VALIDATION, w), num_examples=N)
