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
from typing import Any, Optional

import numpy as np

from jaxdp import _validate
from jaxdp import accounting as acc


def distribution(value: Any) -> acc.KDistribution:
  if not isinstance(value, acc.KDistribution):
    raise ValueError(f"distribution must be a jaxdp.accounting K distribution (Poisson, Geometric, "
                     f"TruncatedNegativeBinomial, ...), got {value!r:.200}")
  if not math.isfinite(value.mean):  # a search that would never end
    raise ValueError(f"distribution must have a finite mean E[K], got a "
                     f"{type(value).__name__} whose mean overflows float64")
  return value


def target_delta(value: Any) -> float:
  return _validate.probability("target_delta", value)


def flag(name: str, value: Any) -> bool:
  if not isinstance(value, (bool, np.bool_)):
    raise ValueError(f"{name} must be a bool (True or False), got {value!r}")
  return bool(value)


def threshold(value: Any) -> float:
  # NaN would compare False with every score: the search would train and
  # then release nothing, indistinguishable from an honest failure.
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) \
      or not math.isfinite(float(value)):
    raise ValueError(f"threshold must be a finite real number in (-inf, inf) (compared with the "
                     f"candidates' score, e.g. an accuracy in [0, 1]), got {value!r}")
  return float(value)


def target_epsilon(value: Any) -> Optional[float]:
  if value is None:
    return None
  return _validate.real("target_epsilon", value, low=0.0, low_open=True)


def stopping(value: Any) -> tuple:
  """(stop probability, cap) of `threshold_search`'s `distribution`: Liu & Talwar stop with
  probability gamma after each failed candidate, so the number of candidates tried when none
  reaches the threshold is `acc.Geometric(gamma=...)`, `acc.CappedGeometric(gamma, T)` with a
  cap, or `acc.Fixed(1)` (gamma = 1: one candidate)."""
  if isinstance(value, acc.CappedGeometric):
    return value.stop_prob, value.max_k
  if isinstance(value, acc.TruncatedNegativeBinomial) and value.eta == 1.0:  # acc.Geometric
    if not value.gamma > 0.0:  # a log_gamma below float64's range: the search would never stop
      raise ValueError(f"distribution's stop probability must be positive, got "
                       f"gamma=exp({value.log_gamma!r}), which is 0.0 in float64")
    return value.gamma, None
  if isinstance(value, acc.Fixed) and value.k == 1:
    return 1.0, None
  raise ValueError(f"distribution must be the law of the number of candidates tried when none "
                   f"reaches the threshold: acc.Geometric(gamma=stop_prob), "
                   f"acc.CappedGeometric(stop_prob, max_candidates) or acc.Fixed(1) (stop_prob "
                   f"1), got {value!r}")
