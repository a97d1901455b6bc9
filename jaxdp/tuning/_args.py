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
from typing import Any, Mapping, Optional, Sequence, Union

import jax
import numpy as np

from jaxdp import _validate
from jaxdp import accounting as acc
from jaxdp.data import Dataset
from jaxdp.sweep.space import SearchSpace
from jaxdp.train import LoopSpec, TrainConfig, check_task
from jaxdp.train.checks import check_data

#: Keyword arguments a tuner forwards to `jaxdp.sweep.train_candidates`
#: (`keep_params` is the tuner's own: it needs the selected model).
ENGINE_KWARGS = ("devices", "max_candidates_per_device", "progress", "on_chunk")


def space(config: Union[TrainConfig, SearchSpace], search_space: Optional[Mapping[str, Sequence]]) -> SearchSpace:
  """The `SearchSpace` of a (base config, grid) pair or a ready space."""
  if isinstance(config, SearchSpace):
    if search_space is not None:
      raise ValueError(f"search_space must be None when config is a SearchSpace, got {search_space!r}")
    return config
  if not isinstance(config, TrainConfig):
    raise ValueError(f"config must be a TrainConfig or SearchSpace, got {type(config).__name__}")
  if not isinstance(search_space, Mapping) or not search_space:
    raise ValueError(f"search_space must be a non-empty mapping name -> values, got {search_space!r}")
  for name, values in search_space.items():
    if (isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray))
        or len(values) == 0):
      raise ValueError(f"search_space[{name!r}] must be a non-empty sequence of values, got {values!r}")
  return SearchSpace(config, search_space)


def key(value: Any) -> jax.Array:
  """One typed PRNG key (a batch of keys would silently broadcast)."""
  if not isinstance(value, jax.Array) or not jax.numpy.issubdtype(value.dtype, jax.dtypes.prng_key):
    raise ValueError(f"key must be a typed PRNG key from jax.random.key(seed), got {value!r}")
  if value.shape != ():
    raise ValueError(f"key must be a single PRNG key of shape (), got shape {value.shape}")
  return value


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


def data(value: Any, space_: SearchSpace) -> Dataset:
  """Checks `value` is a Dataset every candidate's task can train and score on.

  The checks run on shapes only (`jax.eval_shape`), once per compiled group,
  so they cost no training.
  """
  check_data(space_.base.task, value)
  for config in space_.configs:
    check_task(LoopSpec.from_config(config, value), value)  # traces once per spec
  return value


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
  """Checks the keyword arguments forwarded to the sweep engine."""
  unknown = sorted(set(kwargs) - set(ENGINE_KWARGS))
  if unknown:
    raise ValueError(f"unknown keyword argument(s) {unknown}; the tuners forward only "
                     f"{', '.join(ENGINE_KWARGS)} to jaxdp.sweep.train_candidates")
  if kwargs.get("max_candidates_per_device") is not None:
    _validate.integer("max_candidates_per_device", kwargs["max_candidates_per_device"], low=1)
  if kwargs.get("devices") is not None:
    devices = kwargs["devices"]
    if (isinstance(devices, (str, bytes)) or not isinstance(devices, (Sequence, tuple, list))
        or not devices or not all(isinstance(d, jax.Device) for d in devices)):
      raise ValueError(f"devices must be a non-empty sequence of jax.Device, got {devices!r}")
  if "progress" in kwargs:
    flag("progress", kwargs["progress"])
  if kwargs.get("on_chunk") is not None and not callable(kwargs["on_chunk"]):
    raise ValueError(f"on_chunk must be a callable or None, got {kwargs['on_chunk']!r}")
  return dict(kwargs)
