"""Private hyperparameter tuning that releases only what its guarantee covers."""

from jaxdp.tuning.planning import DryRun
from jaxdp.tuning.results import Release, Unreleased, load_release
from jaxdp.tuning.search import (TunedFunctionResult, TunedResult, dry_run, random_search,
                                 threshold_search)
from jaxdp.tuning.subsampled import SubsampledResult, extrapolate, subsampled_search

__all__ = ["DryRun", "Release", "SubsampledResult", "TunedFunctionResult", "TunedResult",
           "Unreleased", "dry_run", "extrapolate", "load_release", "random_search",
           "subsampled_search", "threshold_search"]
