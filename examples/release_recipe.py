"""The released model: tune, save the release, load it in another process and apply it.

  python -m examples.release_recipe tune RELEASE_DIR     # runs a private search, saves its release
  python -m examples.release_recipe apply RELEASE_DIR    # a new process: loads it, predicts

The search is a DP logistic regression on scikit-learn's 8x8 digits (shipped
with scikit-learn, no download), small enough to run in seconds. The page
docs/guides/release.md includes this file; tests/tuning/test_release_recipe.py
runs both commands, the second in a new process.
"""

# [tune]
import jax
from jaxdp import accounting as acc
from jaxdp.data import load_dataset
from jaxdp.train import TrainConfig, presets
from jaxdp.tuning import random_search

# The task is code: the tuning process and the applying one both build it the same way.
TASK = presets.classifier(10)


def tune_and_save(path: str):
  data = load_dataset("digits")
  base = TrainConfig(task=TASK, l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=0.05,
                     steps=30, hparams=dict(learning_rate=1.0, model="logreg"))
  result = random_search(base, {"learning_rate": [0.3, 1.0, 3.0]}, data,
                         distribution=acc.Poisson(mean=3), key=jax.random.key(0))
  result.save(path)  # release.json + arrays.npz: the release only, never result.unreleased
  return result
# [/tune]


# [apply]
import numpy as np
from jaxdp.accounting import format_delta, format_epsilon
from jaxdp.tuning import load_release


def load_and_apply(path: str, inputs) -> np.ndarray:
  release = load_release(path)             # hyperparameters, params, score, epsilon, delta, event
  print(f"epsilon = {format_epsilon(release.epsilon)} at delta = {format_delta(release.delta)}, "
        f"hyperparameters = {release.hyperparameters}")
  logits = release.apply(TASK, inputs)     # = release.model(TASK).apply(release.params, inputs)
  return np.asarray(logits).argmax(-1)
# [/apply]


def main(argv=None) -> int:
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("step", choices=("tune", "apply"))
  parser.add_argument("path", help="the release directory (new and empty for 'tune')")
  args = parser.parse_args(argv)
  if args.step == "tune":
    tune_and_save(args.path)
    print(f"release saved to {args.path}")
  else:
    test = load_dataset("digits").test  # public: the task's score reads it
    predicted = load_and_apply(args.path, test.inputs)
    print(f"public test accuracy of the released model: {np.mean(predicted == test.labels):.4f}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
