"""Empirical privacy audits of the whole private tuning procedure."""

from jaxdp.audit.estimate import EpsilonLowerBound, clopper_pearson, epsilon_lower_bound, max_certifiable

__all__ = ["EpsilonLowerBound", "clopper_pearson", "epsilon_lower_bound", "max_certifiable"]
