"""Koskela & Kulkarni (NeurIPS 2023), Figure 1: epsilon of tuning on a random subset vs its rate q.

  python experiments/kk_fig1.py [--out figures] [--quick]   (make figures-subsampled)

No profiles: pure accounting in the paper's setting (DP-SGD gamma = 0.01,
sigma = 2, 50 epochs; K ~ Poisson(15) and Poisson(45); delta = 1e-5), seconds
on any CPU; --quick computes 6 values of q instead of 51 (for tests). The
pipeline, and the paper's constants, are `jaxdp.experiments.kk_fig1`.
"""

import sys

from jaxdp.experiments import kk_fig1

if __name__ == "__main__":
  sys.exit(kk_fig1.main(prog="experiments/kk_fig1.py"))
