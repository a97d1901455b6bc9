"""Koskela, Redberg & Wang (ICML 2024), Figures 1-4 and 6-8: privacy-profile vs RDP bounds of private selection.

  python experiments/profile_figures.py [--out figures] [--quick] [--only fig1 ...]   (make figures-profiles)

No profiles: pure accounting in the paper's settings; --quick computes a few
points per curve and shorter DP-SGD runs in Figure 8 (for tests). The
pipeline, and the paper's constants, are `jaxdp.experiments.profile_figures`.
"""

import sys

from jaxdp.experiments import profile_figures

if __name__ == "__main__":
  sys.exit(profile_figures.main(prog="experiments/profile_figures.py"))
