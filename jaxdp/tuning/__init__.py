"""Private hyperparameter tuning that releases only what its guarantee covers."""

from jaxdp.tuning.search import TunedResult, random_search, threshold_search

__all__ = ["TunedResult", "random_search", "threshold_search"]
