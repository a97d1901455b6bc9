"""Private hyperparameter tuning that releases only what its guarantee covers."""

from jaxdp.tuning.search import TunedResult, random_search, threshold_search
from jaxdp.tuning.subsampled import SubsampledResult, extrapolate, subsampled_search

__all__ = ["SubsampledResult", "TunedResult", "extrapolate", "random_search", "subsampled_search",
           "threshold_search"]
