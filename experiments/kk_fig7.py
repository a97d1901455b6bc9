"""Koskela & Kulkarni (NeurIPS 2023), Figure 7: tuning learning rate, epochs and gamma on a random subset.

  python experiments/kk_fig7.py [--profile quick|paper|paper-fashion] [--out figures] [--dry-run]
  (make reproduce-fig7 runs it after experiments/fig7.py)

Profiles: `quick` (default) runs offline on a 2-core CPU in a few minutes
(scikit-learn digits, logistic regression). `paper` is KK's MNIST setting
(TFDS MNIST, the Opacus CNN, C = 1, B in {128, 256}, learning rates
10^-i for i in {4, 3.5, ..., 0}, epochs {10, 20, 30, 40}, q = 0.1, R = 10);
`paper-fashion` the same grid on FashionMNIST with the MLP. Both paper
profiles are meant for accelerators.

The pipeline (sigma calibrated per (gamma, epochs), baseline and both
subsampled variants per repetition, plot) is `jaxdp.experiments.kk_fig7`.
"""

import sys

import numpy as np

from jaxdp.experiments import kk_fig7
from jaxdp.experiments.kk_fig7 import Profile

_PAPER_LRS = tuple(float(10.0 ** -i) for i in np.arange(4.0, -0.25, -0.5))
PROFILES = {
    "quick": Profile(
        name="quick", dataset="digits", model="logreg", activation="tanh", l2_clip_norm=1.0,
        batch_sizes=(32, 64), epochs=(4, 8), learning_rates=(0.1, 0.3, 1.0, 3.0),
        target_epsilons=(0.5, 1.0, 2.0), mu=6, q=0.25, repetitions=4, candidates_per_device=1),
    "paper": Profile(
        name="paper", dataset="mnist", model="opacus_cnn", activation="tanh", l2_clip_norm=1.0,
        batch_sizes=(128, 256), epochs=(10, 20, 30, 40), learning_rates=_PAPER_LRS,
        target_epsilons=(0.5, 1.0, 2.0, 4.0), mu=15, q=0.1, repetitions=10, num_train=60000),
    "paper-fashion": Profile(
        name="paper-fashion", dataset="fashion_mnist", model="mlp", activation="tanh", l2_clip_norm=1.0,
        batch_sizes=(128, 256), epochs=(10, 20, 30, 40), learning_rates=_PAPER_LRS,
        target_epsilons=(0.5, 1.0, 2.0, 4.0), mu=15, q=0.1, repetitions=10, num_train=60000),
}

if __name__ == "__main__":
  sys.exit(kk_fig7.main(profiles=PROFILES, prog="experiments/kk_fig7.py"))
