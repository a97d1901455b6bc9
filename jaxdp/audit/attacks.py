"""Ready-made audits: neighbouring data sets, a search to run on them, a statistic.

`selection_gadget`: a worst case in the spirit of Papernot & Steinke's
Figure 1 and Liu & Talwar's lower-bound examples. Each candidate is one
full-batch DP-SGD step on a single scalar parameter w; every example's
gradient is zero except the canary's, whose gradient reaches w only in the
candidates of the grid's "sensitive" arm. A candidate's score is w itself, so
it is a Gaussian mechanism whose score moves by exactly the clip norm when the
canary is present, and the search releases the best of K of them. Its exact
privacy profile is known (`jaxdp.audit.exact.GadgetProfile`); given K's law
its statistic is the exact log-likelihood ratio of the release (arm and
score), the most powerful test at every level (Neyman-Pearson).

`outlier_lr_tuning`: a realistic search: DP-SGD logistic regression on
scikit-learn's breast-cancer data whose learning rate is tuned, with or
without an outlier (far from the data, label flipped); the statistic is minus
the released model's loss on the outlier.

Both keep N public: D holds a null example (weight 0: no gradient, ever)
where D' holds the canary.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdp import _validate
from jaxdp import accounting as acc
from jaxdp.audit import exact
from jaxdp.audit.game import Release, Statistic, released_score
from jaxdp.data import Dataset
from jaxdp.train import Model, Task, TrainConfig


@dataclasses.dataclass(frozen=True)
class Attack:
  """A search to audit and the neighbouring data sets to audit it on.

  Attributes:
    name: label.
    config: base configuration.
    grid: the search space's grid.
    without: D (with the null example).
    with_: D' (with the canary).
    statistic: `Release -> float`, large means D'.
  """
  name: str
  config: TrainConfig
  grid: Mapping[str, Any]
  without: Dataset
  with_: Dataset
  statistic: Statistic


def _gadget_model(hp) -> Model:
  arm = float(hp["arm"])

  def init(key, x):
    del key, x
    return {"w": jnp.zeros((), jnp.float32)}

  def apply(params, x):
    w = jnp.broadcast_to(params["w"], x.shape[:1])
    return {"w": w, "sensitive": arm * w}
  return Model(init, apply)


def _gadget_loss(outputs, batch):
  # d/dw of -canary * arm * w is -canary * arm: 1 (the clip norm) for the
  # canary in the sensitive arm, exactly 0 for every other example.
  return -batch["canary"] * outputs["sensitive"]


def _gadget_score(outputs, batch):
  del batch
  return jnp.mean(outputs["w"])


_GADGET_TASK = Task(model=_gadget_model, loss=_gadget_loss, score=_gadget_score,
                    optimizer=lambda hp: optax.sgd(hp["learning_rate"]), name="selection_gadget")


def selection_gadget(noise_multiplier: float, *, num_examples: int = 16, arms: int = 2,
                     distribution: Optional[acc.KDistribution] = None) -> Attack:
  """The worst-case selection audit (see the module docstring).

  Args:
    noise_multiplier: sigma >= 0 of each candidate's one DP step (0: the
      non-private search).
    num_examples: N, public.
    arms: grid size; arm 1..arms-1 are sensitive to the canary, arm 0 is not.
    distribution: K's law of the search to audit, for the likelihood-ratio
      statistic (None: the released score, a weaker test that ignores the
      arm).

  Returns:
    The `Attack`: one DP step with q = 1 and clip norm 1, learning rate N so
    that w = 1[canary, sensitive arm] + sigma * Z exactly; the statistic is
    log f_D'(release) / f_D(release) (`GadgetProfile.log_ratio`) given
    `distribution` and sigma > 0, else the released score.
  """
  n = _validate.integer("num_examples", num_examples, low=2)
  arms = _validate.integer("arms", arms, low=2)
  zeros = np.zeros((n, 1), np.float32)
  flags = np.zeros(n, np.float32)
  with_flags = flags.copy()
  with_flags[-1] = 1.0
  test = {"x": np.zeros((1, 1), np.float32), "canary": np.zeros(1, np.float32)}
  without = Dataset(train={"x": zeros, "canary": flags}, test=test, num_examples=n, name="gadget D")
  with_ = Dataset(train={"x": zeros, "canary": with_flags}, test=test, num_examples=n,
                  name="gadget D'")
  config = TrainConfig(task=_GADGET_TASK, l2_clip_norm=1.0, noise_multiplier=noise_multiplier,
                       sampling_prob=1.0, steps=1, hparams={"learning_rate": float(n), "arm": 0})
  statistic = released_score(default=-1e6)
  if distribution is not None and noise_multiplier > 0:
    statistic = _log_ratio_statistic(exact.GadgetProfile(noise_multiplier, distribution, arms=arms))
  return Attack(name=f"selection gadget (sigma={noise_multiplier:g})", config=config,
                grid={"arm": list(range(arms))}, without=without, with_=with_, statistic=statistic)


def _log_ratio_statistic(profile: "exact.GadgetProfile") -> Statistic:
  def statistic(release: Release) -> float:
    if release.hyperparameters is None:
      return -1e6  # K = 0: the same probability on both sides
    return float(profile.log_ratio(release.hyperparameters["arm"] != 0, release.score))
  return statistic


def _logistic(hp) -> Model:
  del hp

  def init(key, x):
    return {"w": 0.01 * jax.random.normal(key, x.shape[1:]), "b": jnp.zeros(())}

  def apply(params, x):
    return x @ params["w"] + params["b"]
  return Model(init, apply)


def _weighted_bce(logits, batch):
  return batch["weight"] * optax.sigmoid_binary_cross_entropy(logits, batch["y"])


def _accuracy(logits, batch):
  return jnp.mean((logits > 0) == (batch["y"] > 0.5))


_LOGISTIC_TASK = Task(model=_logistic, loss=_weighted_bce, score=_accuracy,
                      optimizer=lambda hp: optax.sgd(hp["learning_rate"]), name="outlier_lr_tuning")


def _canary_statistic(canary_x: np.ndarray, canary_y: float) -> Statistic:
  def statistic(release: Release) -> float:
    if release.params is None:
      return -1e6
    logit = float(np.dot(np.asarray(release.params["w"]), canary_x) + float(release.params["b"]))
    return -float(optax.sigmoid_binary_cross_entropy(jnp.float32(logit), jnp.float32(canary_y)))
  return statistic


def outlier_lr_tuning(noise_multiplier: float, *, epochs: float = 2.0, sampling_prob: float = 0.1,
                      learning_rates=(0.3, 1.0, 3.0, 10.0), outlier_scale: float = 10.0) -> Attack:
  """The realistic audit: a learning rate tuned on breast-cancer data with/without an outlier.

  Args:
    noise_multiplier: sigma of DP-SGD (0: non-private).
    epochs: epochs per candidate.
    sampling_prob: Poisson rate q.
    learning_rates: the grid.
    outlier_scale: norm of the canary's features (the data are standardised).

  Returns:
    The `Attack`; the statistic is minus the released model's loss on the canary.
  """
  from sklearn.datasets import load_breast_cancer  # local: heavy import
  x, y = load_breast_cancer(return_X_y=True)
  x = ((x - x.mean(0)) / x.std(0)).astype(np.float32)
  y = y.astype(np.float32)
  rng = np.random.default_rng(0)
  order = rng.permutation(len(y))
  train, test = order[:400], order[400:]
  direction = rng.normal(size=x.shape[1]).astype(np.float32)
  canary_x = (outlier_scale * direction / np.linalg.norm(direction)).astype(np.float32)
  # Label it against what the data predict along that direction.
  canary_y = float(np.mean(y[train][x[train] @ direction > 0]) < 0.5)

  def split(extra_x, extra_y, weight):
    return {"x": np.concatenate([x[train], extra_x[None]]), "y": np.append(y[train], extra_y),
            "weight": np.append(np.ones(len(train), np.float32), weight).astype(np.float32)}
  public = {"x": x[test], "y": y[test], "weight": np.ones(len(test), np.float32)}
  n = len(train) + 1  # the declared N of both: the null row in D, the canary in D'
  without = Dataset(train=split(np.zeros_like(canary_x), 0.0, 0.0), test=public, num_examples=n,
                    name="breast cancer D")
  with_ = Dataset(train=split(canary_x, canary_y, 1.0), test=public, num_examples=n,
                  name="breast cancer D'")
  config = TrainConfig(task=_LOGISTIC_TASK, l2_clip_norm=1.0, noise_multiplier=noise_multiplier,
                       sampling_prob=sampling_prob, epochs=epochs,
                       hparams={"learning_rate": float(learning_rates[0])})
  return Attack(name=f"outlier, tuned learning rate (sigma={noise_multiplier:g})", config=config,
                grid={"learning_rate": [float(v) for v in learning_rates]}, without=without,
                with_=with_, statistic=_canary_statistic(canary_x, canary_y))


ATTACKS: Mapping[str, Callable[..., Attack]] = {"gadget": selection_gadget, "outlier": outlier_lr_tuning}
