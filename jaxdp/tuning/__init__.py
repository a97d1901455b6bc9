"""Private hyperparameter tuning that releases only what its guarantee covers."""

from jaxdp.sweep.functions import TrainFunction
from jaxdp.sweep.trainers import LocalTrainer, RayTrainer
from jaxdp.tuning.planning import DryRun
from jaxdp.tuning.results import NothingReleasedWarning, Release, SubsampledResult, TunedResult, Unreleased, load_release
from jaxdp.tuning.run_config import RunConfig
from jaxdp.tuning.search import dry_run, random_search, threshold_search
from jaxdp.tuning.subsampled import SubsetTuning, extrapolate, subsampled_search

__all__ = ["DryRun", "LocalTrainer", "NothingReleasedWarning", "RayTrainer", "Release", "RunConfig", "SubsampledResult",
           "SubsetTuning", "TrainFunction", "TunedResult", "Unreleased", "dry_run", "extrapolate",
           "load_release", "random_search", "subsampled_search", "threshold_search"]
