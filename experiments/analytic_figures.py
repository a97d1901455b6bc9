"""Papernot & Steinke (ICLR 2022), Figures 2-6: pure accounting of repeated 0.1-zCDP runs.

  python experiments/analytic_figures.py [--out figures] [--quick]   (make figures-analytic)

No profiles: the figures are the paper's setting (a 0.1-zCDP base run
repeated K times, K Poisson, truncated negative binomial or fixed); --quick
computes fewer E[K] values and coarser order grids (for tests). The pipeline,
and the paper's constants, are `jaxdp.experiments.analytic_figures`.
"""

import sys

from jaxdp.experiments import analytic_figures

if __name__ == "__main__":
  sys.exit(analytic_figures.main(prog="experiments/analytic_figures.py"))
