"""Fixtures for the tuner tests."""

import pytest

from jaxdp import accounting as acc
from jaxdp.sweep import engine, functions
from jaxdp.train import trainer
from jaxdp.tuning import subsampled


class WorkStarted(AssertionError):
  """A tuner drew K or trained before it had checked all of its arguments."""


@pytest.fixture
def no_work(monkeypatch):
  """Makes drawing K (any distribution) or any training raise `WorkStarted`.

  With it, a ValueError from a tuner proves the argument was rejected before
  K was drawn and before any training, whatever K would have been. Training
  is blocked at every entry point (a training function's call, the batched engine, the lone trainer the
  subsampled search's final run uses, and the compiled programs behind both),
  and so is drawing the subsampled search's subset. Shape checks
  (`jax.eval_shape`) and accounting stay allowed: they are the checks.
  """
  def started(what):
    def fail(*args, **kwargs):
      raise WorkStarted(f"{what} before every argument was checked")
    return fail
  stack = [acc.KDistribution]
  while stack:  # every distribution class, however deep
    cls = stack.pop()
    stack.extend(cls.__subclasses__())
    if "sample" in vars(cls):
      monkeypatch.setattr(cls, "sample", started("K drawn"))
  monkeypatch.setattr(engine, "train_candidates", started("candidates trained"))
  monkeypatch.setattr(engine, "_compiled_chunk", started("a batched program compiled"))
  monkeypatch.setattr(subsampled, "run_planned", started("final model trained"))
  monkeypatch.setattr(trainer, "train_candidate", started("a candidate trained"))
  monkeypatch.setattr(trainer, "compiled", started("a candidate program compiled"))
  monkeypatch.setattr(subsampled, "poisson_mask", started("subset drawn"))
  monkeypatch.setattr(functions, "call", started("a training function called"))


# --- A user's own task (issue 12): every tuner must take it like a preset. ---
# Its own Flax module with a `width` read by the model factory (static), its
# own per-example loss and score over dict batches, an optax chain built from
# the hyperparameters (learning_rate and weight_decay are traced), and plain
# NumPy dict data. Session-scoped, so every test shares its compilations
# (the compiled programs are keyed by the task's identity).

USER_N = 200  # training examples


def user_mlp(width):
  import flax.linen as nn  # pylint: disable=g-import-not-at-top

  class MLP(nn.Module):
    width: int

    @nn.compact
    def __call__(self, x):
      hidden = nn.tanh(nn.Dense(self.width, name="hidden")(x))
      return nn.Dense(1, name="out")(hidden)

  return MLP(width=width)


def user_loss(outputs, batch):
  import optax  # pylint: disable=g-import-not-at-top
  return optax.sigmoid_binary_cross_entropy(outputs[:, 0], batch["y"])


def user_correct(outputs, batch):
  """Per example: 1.0 where the sign of the logit is the label."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  return ((outputs[:, 0] > 0) == (batch["y"] > 0.5)).astype(jnp.float32)


def user_accuracy(outputs, batch):
  return user_correct(outputs, batch).mean()


def user_optimizer(hp):
  import optax  # pylint: disable=g-import-not-at-top
  return optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(hp["learning_rate"], weight_decay=hp["weight_decay"]))


def make_user_task(**changes):
  """The user task; `changes` override Task fields (score, name, ...)."""
  from jaxdp.train import Task, keep_hparams  # pylint: disable=g-import-not-at-top
  fields = dict(model=lambda hp: user_mlp(hp["width"]), loss=user_loss, score=user_accuracy,
                optimizer=user_optimizer, extrapolate=keep_hparams, name="user-mlp")
  fields.update(changes)
  return Task(**fields)


def user_split(rng, n, w):
  import numpy as np  # pylint: disable=g-import-not-at-top
  x = rng.normal(size=(n, w.shape[0])).astype(np.float32)
  y = (x @ w + 0.3 * rng.normal(size=n) > 0).astype(np.float32)
  return {"x": x, "y": y}


@pytest.fixture(scope="session")
def user_data():
  """Synthetic linearly separable-ish dict data: 200 train, 100 public test, 100 private validation."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jaxdp.data import Dataset  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  w = rng.normal(size=6)
  return Dataset(train=user_split(rng, USER_N, w), test=user_split(rng, 100, w),
                 private_validation=user_split(rng, 100, w), num_examples=USER_N, name="synthetic")


@pytest.fixture(scope="session")
def user_task():
  return make_user_task()


@pytest.fixture(scope="session")
def user_config(user_task):
  """Expected batch 20 of N = 200 (q = 0.1), one epoch (10 steps), DP-AdamW."""
  from jaxdp.train import TrainConfig  # pylint: disable=g-import-not-at-top
  return TrainConfig(task=user_task, l2_clip_norm=1.0, noise_multiplier=1.0, batch_size=20, epochs=1,
                     hparams=dict(learning_rate=0.05, weight_decay=1e-4, width=8))
