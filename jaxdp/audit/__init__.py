"""Empirical privacy audits of the whole private tuning procedure.

  estimate  Clopper-Pearson lower bounds on epsilon from a distinguishing game.
  game      `audit_search`: the complete private search run many times on D and D'.
  attacks   ready-made neighbouring data sets and statistics (worst case, realistic).
  exact     the selection gadget's exact privacy profile: what a lower bound can reach.
"""

from jaxdp.audit import attacks, exact
from jaxdp.audit.estimate import EpsilonLowerBound, clopper_pearson, epsilon_lower_bound, max_certifiable
from jaxdp.audit.game import AuditResult, Release, audit_search, released_score, released_value

__all__ = ["AuditResult", "EpsilonLowerBound", "Release", "attacks", "audit_search", "clopper_pearson", "exact",
           "epsilon_lower_bound", "max_certifiable", "released_score", "released_value"]
