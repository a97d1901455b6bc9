"""Argument checks shared by the private tuners.

Every tuner checks all of its arguments here *before* it draws K, samples a
subset or trains anything. The reason is privacy as much as convenience: a
mistake that only surfaces on some draws of K (e.g. bad data when K = 0)
would make whether the call fails depend on the randomness, and a bad
argument that silently disables release (a NaN threshold) looks exactly like
a private "nothing passed" outcome.
"""

from __future__ import annotations

import math
import numbers
import os
import warnings
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from jaxdp import _validate
from jaxdp import accounting as acc
from jaxdp.sweep import engine
from jaxdp.sweep.space import SearchSpace
from jaxdp.train import TrainConfig

#: Keyword arguments a tuner forwards to `jaxdp.sweep.train_candidates`
#: (`keep_params` is the tuner's own: it needs the selected model).
ENGINE_KWARGS = ("devices", "max_candidates_per_device", "progress", "on_chunk")
#: Those a search over a training function forwards (`jaxdp.sweep.functions.train_functions`).
FUNCTION_KWARGS = ("progress", "on_chunk")


def is_function(config: Any) -> bool:
  """True when a tuner's first argument is a training function, not a `TrainConfig` or
  `SearchSpace`."""
  return callable(config) and not isinstance(config, (TrainConfig, SearchSpace))


def function_search(data: Any, initial_params: Any, engine_kwargs: Mapping[str, Any]) -> None:
  """Raises ValueError for an argument a search over a training function does not take."""
  if data is not None:
    raise ValueError(f"data must be None when tuning a training function (it reads its own data), "
                     f"got {type(data).__name__}")
  if initial_params is not None:
    raise ValueError("initial_params must be None when tuning a training function (it starts "
                     "from whatever it loads itself)")
  unknown = sorted(set(engine_kwargs) - set(FUNCTION_KWARGS))
  if unknown:
    raise ValueError(f"{unknown} are options of jaxdp's training engine; a search over a training "
                     f"function takes only {', '.join(FUNCTION_KWARGS)} (the function picks its "
                     "own devices)")


def noise_parameter(value: Any, target_epsilon: Optional[float]) -> Optional[str]:
  """The hyperparameter `target_epsilon` calibrates in a training function's search."""
  if value is None:
    if target_epsilon is not None:
      raise ValueError("target_epsilon needs noise_parameter: the name of the hyperparameter "
                       "(e.g. 'noise_multiplier') that train_fn and dp_event read as the noise to "
                       "calibrate")
    return None
  if not isinstance(value, str) or not value:
    raise ValueError(f"noise_parameter must be None or a hyperparameter name (str), got {value!r}")
  if target_epsilon is None:
    raise ValueError(f"noise_parameter={value!r} is only used with target_epsilon, which is None")
  return value


def space(config: Union[TrainConfig, SearchSpace], search_space: Optional[Mapping[str, Sequence]]) -> SearchSpace:
  """The `SearchSpace` of a (base config, grid) pair or a ready space (the grid's values are
  checked by `SearchSpace`, in the tuners' words)."""
  if isinstance(config, SearchSpace):
    if search_space is not None:
      raise ValueError(f"search_space must be None when config is a SearchSpace, got {search_space!r}")
    return config
  if not isinstance(config, TrainConfig):
    raise ValueError(f"config must be a TrainConfig or SearchSpace, got {type(config).__name__}")
  if not isinstance(search_space, Mapping) or not search_space:
    raise ValueError(f"search_space must be a non-empty mapping name -> values, got {search_space!r}")
  try:
    return SearchSpace(config, search_space)
  except ValueError as err:
    if str(err).startswith("grid["):  # SearchSpace names its argument `grid`
      raise ValueError("search_space" + str(err)[len("grid"):]) from None
    raise


def repetitions(value: Any) -> acc.KDistribution:
  if not isinstance(value, acc.KDistribution):
    raise ValueError(f"repetitions must be a jaxdp.accounting K distribution (Poisson, Geometric, "
                     f"TruncatedNegativeBinomial, ...), got {value!r}")
  return value


def delta(value: Any) -> float:
  return _validate.probability("delta", value)


def flag(name: str, value: Any) -> bool:
  if not isinstance(value, (bool, np.bool_)):
    raise ValueError(f"{name} must be a bool (True or False), got {value!r}")
  return bool(value)


def threshold(value: Any) -> float:
  # NaN would compare False with every score: the search would train and
  # then release nothing, indistinguishable from an honest failure.
  if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.floating, np.integer)) \
      or not math.isfinite(float(value)):
    raise ValueError(f"threshold must be a finite real number in (-inf, inf) (compared with the "
                     f"task's score, e.g. an accuracy in [0, 1]), got {value!r}")
  return float(value)


def target_epsilon(value: Any) -> Optional[float]:
  if value is None:
    return None
  return _validate.real("target_epsilon", value, low=0.0, low_open=True)


def run_dir(value: Any) -> Optional[str]:
  if value is None:
    return None
  if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
    raise ValueError(f"run_dir must be None or a directory path (str or os.PathLike), got {value!r}")
  return os.fspath(value)


def trainer(value: Any):
  if value is not None and not callable(value):
    raise ValueError(f"trainer must be None or a callable with the signature of "
                     f"jaxdp.sweep.train_candidates (e.g. jaxdp.sweep.ray_backend."
                     f"train_candidates_ray), got {value!r}")
  return value


def engine_kwargs(kwargs: Mapping[str, Any]) -> dict:
  """Checks the keyword arguments forwarded to the trainer (`jaxdp.sweep.engine.check_options`)."""
  unknown = sorted(set(kwargs) - set(ENGINE_KWARGS))
  if unknown:
    raise ValueError(f"unknown keyword argument(s) {unknown}; the tuners forward only "
                     f"{', '.join(ENGINE_KWARGS)} to jaxdp.sweep.train_candidates")
  engine.check_options(**kwargs)
  if kwargs.get("on_chunk") is not None:
    # As `release_all_scores`: what the callback sees is the whole search, not its release.
    warnings.warn("on_chunk receives every trained candidate and its result (its score, its key "
                  "or seed, and so how many there are): none of it is covered by the reported "
                  "epsilon; keep what it sees as secret as the data", stacklevel=4)
  return dict(kwargs)
