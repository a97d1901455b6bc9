"""A private search over a training function that is not jaxdp's: DP-SGD logistic regression
in plain NumPy, tuned by `jaxdp.tuning.random_search` with the whole search's epsilon.

  python -m examples.dp_logistic_regression --help

The protocol (docs/guides/tune_any_trainer.md): `train_fn(hparams, seed) -> (score,
artifact)` trains one candidate, taking every random number from `seed`;
`dp_event(hparams)` is the DpEvent of exactly that run. Here the run is T
steps of Poisson-sampled DP-SGD (each example in a step's batch with
probability q, per-example gradients clipped to norm C, Gaussian noise of
standard deviation sigma C added to their sum, divided by the expected batch
size q N), whose event is `acc.dpsgd_event(q, sigma, T)`. The score is the
accuracy on a public test split, so it is not accounted.

Data: scikit-learn's breast-cancer set (569 examples, shipped with
scikit-learn): 400 private training examples, 169 public test examples;
features log-scaled per example and standardised with the PUBLIC split's
statistics only.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time

import jax
import numpy as np
from sklearn.datasets import load_breast_cancer

from jaxdp import accounting as acc
from jaxdp.tuning import LocalTrainer, RunConfig, TrainFunction, random_search

#: The declared (public) size of the private training split.
NUM_EXAMPLES = 400


@functools.lru_cache(maxsize=1)
def load_data() -> dict:
  """{"train": (x, y), "test": (x, y)}: 400 private and 169 public examples."""
  x, y = load_breast_cancer(return_X_y=True)
  train, test = np.split(np.random.default_rng(0).permutation(len(y)), [NUM_EXAMPLES])
  x = np.log1p(x)
  x = (x - x[test].mean(0)) / x[test].std(0)  # PUBLIC statistics only
  return {"train": (x[train], y[train].astype(np.float64)), "test": (x[test], y[test].astype(np.float64))}


def checked(hparams: dict) -> dict:
  """The hyperparameters, or ValueError naming the bad one (dp_event calls this too, so a bad
  grid value fails before the search draws anything)."""
  rules = {"learning_rate": (0.0, np.inf), "l2_clip_norm": (0.0, np.inf),
           "noise_multiplier": (0.0, np.inf), "sampling_prob": (0.0, 1.0)}
  for name, (low, high) in rules.items():
    value = hparams[name]
    if not (isinstance(value, (int, float)) and low < value <= high):
      raise ValueError(f"{name} must be a number in ({low}, {high}], got {value!r}")
  if not isinstance(hparams["steps"], int) or hparams["steps"] < 1:
    raise ValueError(f"steps must be an integer >= 1, got {hparams['steps']!r}")
  return hparams


def dp_event(hparams: dict):
  """The DpEvent of one `train_fn` run: T steps of Poisson-sampled Gaussian DP-SGD."""
  hp = checked(hparams)
  return acc.dpsgd_event(hp["sampling_prob"], hp["noise_multiplier"], hp["steps"])


def train_fn(hparams: dict, seed: int) -> tuple:
  """DP-SGD logistic regression: (public test accuracy, {"w": weights, "b": bias})."""
  hp = checked(hparams)
  (x, y), (x_test, y_test) = load_data()["train"], load_data()["test"]
  rng = np.random.default_rng(seed)  # every random number of the run
  q, clip, sigma, lr = hp["sampling_prob"], hp["l2_clip_norm"], hp["noise_multiplier"], hp["learning_rate"]
  w, b = np.zeros(x.shape[1]), 0.0
  for _ in range(hp["steps"]):
    batch = rng.random(len(y)) < q                        # Poisson sampling, each example alone
    xb, yb = x[batch], y[batch]
    residual = 1.0 / (1.0 + np.exp(-(xb @ w + b))) - yb  # d(loss)/d(logit), per example
    grads = np.concatenate([residual[:, None] * xb, residual[:, None]], axis=1)
    norms = np.linalg.norm(grads, axis=1, keepdims=True)
    clipped = grads * np.minimum(1.0, clip / np.maximum(norms, 1e-12))
    noisy = clipped.sum(0) + rng.normal(0.0, sigma * clip, size=grads.shape[1])
    update = noisy / (q * NUM_EXAMPLES)                   # the declared N, never the batch's size
    w, b = w - lr * update[:-1], b - lr * update[-1]
  accuracy = float(np.mean(((x_test @ w + b) > 0) == (y_test > 0.5)))
  return accuracy, {"w": w, "b": b}


#: The example's grid: every combination is a candidate's hyperparameters (and the noise,
#: calibrated for the whole search's target epsilon).
GRID = {"learning_rate": [0.3, 1.0, 3.0], "l2_clip_norm": [0.5, 2.0], "sampling_prob": [0.1],
        "steps": [200]}


def search_main(train, event, grid, argv, *, description: str, target_epsilon: float,
                mean_candidates: float) -> dict:
  """The examples' command line: a private random search of `train` over `grid`, its noise
  calibrated through `event`; prints the release as JSON and returns it."""
  parser = argparse.ArgumentParser(description=description,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--target-epsilon", type=float, default=target_epsilon,
                      help=f"epsilon of the whole search, at --delta (default {target_epsilon})")
  parser.add_argument("--delta", type=float, default=1e-5, help="delta (default 1e-5)")
  parser.add_argument("--mean-candidates", type=float, default=mean_candidates,
                      help=f"E[K] of the Poisson number of candidates (default {mean_candidates:g})")
  parser.add_argument("--seed", type=int, default=0,
                      help="the search's key (default 0; in real use a secret, random one)")
  parser.add_argument("--run-dir", default=None,
                      help="durable run directory: rerun the same command to resume (default: none)")
  parser.add_argument("--save", default=None, metavar="DIR",
                      help="also save the release (hyperparameters, artifact, score, epsilon) to "
                           "this new directory, for publication (jaxdp.tuning.load_release reads it)")
  args = parser.parse_args(argv)
  began = time.perf_counter()
  try:
    result = random_search(TrainFunction(train, event, noise_parameter="noise_multiplier"), grid,
                           distribution=acc.Poisson(mean=args.mean_candidates),
                           key=jax.random.key(args.seed), target_delta=args.delta,
                           target_epsilon=args.target_epsilon,
                           run_config=RunConfig(run_dir=args.run_dir,
                                                trainer=LocalTrainer(progress=True)))
  except ValueError as err:  # a bad argument: one line naming it, exit code 2
    parser.error(str(err))
  # The release only: K (result.unreleased.num_candidates), the seeds and what was resumed are
  # not covered by epsilon and stay out of what is printed or saved.
  out = {name: value for name, value in result.to_json().items()
         if name in ("hyperparameters", "score", "epsilon", "delta", "noise_multiplier")}
  print(json.dumps(out, indent=1))
  if args.save is not None:
    result.save(args.save)
  print(f"took {time.perf_counter() - began:.1f} s (timing is not covered by epsilon)",
        file=sys.stderr)
  return out


def main(argv=None) -> dict:
  return search_main(train_fn, dp_event, GRID, argv, description=__doc__.split("\n\n")[0],
                     target_epsilon=2.0, mean_candidates=8.0)


if __name__ == "__main__":
  main()
