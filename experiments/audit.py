"""Empirical lower bound <= exact <= accounted epsilon of whole private searches (audit.png).

  python experiments/audit.py [--profile quick|full] [--out figures] [--no-progress]

Profiles: `quick` (default) runs 20,000 searches per data set for each
gadget scenario and 200 for the realistic one (about 100 s on a 2-core CPU);
`full` ten times as many (about 10 minutes there). The noise of the
gadget (sigma 0.5) and of the realistic search (sigma 1) is the same in both.

The pipeline (scenarios, `jaxdp.audit.audit_search`, exact epsilon of the
gadget, the check lower <= exact <= accounted, plot) is
`jaxdp.experiments.audit`; `jaxdp audit` runs it on these profiles too.
"""

import sys

from jaxdp.experiments import audit
from jaxdp.experiments.audit import Profile

PROFILES = {
    "quick": Profile(gadget_trials=20000, outlier_trials=200, gadget_sigma=0.5, outlier_sigma=1.0),
    "full": Profile(gadget_trials=200000, outlier_trials=2000, gadget_sigma=0.5, outlier_sigma=1.0),
}

if __name__ == "__main__":
  sys.exit(audit.main(profiles=PROFILES, prog="experiments/audit.py"))
