"""Papernot & Steinke (ICLR 2022), Figure 1: a tuned hyperparameter reveals outliers.

  python experiments/fig1.py [--out figures] [--datasets 20] [--seed 0]   (make reproduce-fig1)

No profiles: the figure is the paper's setting (a linear SVM on 40 points
with and without 8 outliers, 41 values of alpha), seconds on any CPU;
--datasets sets how many random draws of the points the curves average. The
pipeline, and the paper's constants, are `jaxdp.experiments.fig1`.
"""

import sys

from jaxdp.experiments import fig1

if __name__ == "__main__":
  sys.exit(fig1.main(prog="experiments/fig1.py"))
