"""Shared validators: every public parameter error names the parameter, its value
and the valid range, so users can fix a call without reading the source."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np


def _fmt_range(low, high, low_open, high_open) -> str:
  left = "(" if (low_open or low is None) else "["
  right = ")" if (high_open or high is None) else "]"
  lo = "-inf" if low is None else repr(low)
  hi = "inf" if high is None else repr(high)
  return f"{left}{lo}, {hi}{right}"


def real(name: str, value: Any, *, low=None, high=None, low_open=False,
         high_open=False, allow_inf: bool = False) -> float:
  """Returns `value` as a float after checking type, finiteness and range."""
  if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
    raise ValueError(f"{name} must be a real number, got {value!r}")
  v = float(value)
  if math.isnan(v) or (math.isinf(v) and not allow_inf):
    raise ValueError(f"{name} must be finite, got {value!r}")
  rng = _fmt_range(low, high, low_open, high_open)
  if low is not None and (v < low or (low_open and v == low)):
    raise ValueError(f"{name} must be in {rng}, got {value!r}")
  if high is not None and (v > high or (high_open and v == high)):
    raise ValueError(f"{name} must be in {rng}, got {value!r}")
  return v


def integer(name: str, value: Any, *, low=None, high=None) -> int:
  """Returns `value` as an int; floats are accepted only if integral."""
  if isinstance(value, bool):
    raise ValueError(f"{name} must be an integer, got {value!r}")
  if isinstance(value, (numbers.Integral, np.integer)):
    v = int(value)
  elif isinstance(value, (numbers.Real, np.floating)) and math.isfinite(value) and float(value).is_integer():
    v = int(value)
  else:
    raise ValueError(f"{name} must be an integer, got {value!r}")
  rng = _fmt_range(low, high, False, False)
  if (low is not None and v < low) or (high is not None and v > high):
    raise ValueError(f"{name} must be an integer in {rng}, got {value!r}")
  return v


def probability(name: str, value: Any, *, zero_ok: bool = False, one_ok: bool = False) -> float:
  return real(name, value, low=0.0, high=1.0, low_open=not zero_ok, high_open=not one_ok)


def real_array(name: str, values: Any, *, low=None, low_open=False,
               allow_inf: bool = False) -> np.ndarray:
  """Returns a non-empty 1-D float array after checking every entry."""
  try:
    arr = np.asarray(values, dtype=np.float64)
  except (TypeError, ValueError):
    raise ValueError(f"{name} must be a 1-D sequence of real numbers, got {values!r}") from None
  if arr.ndim != 1 or arr.size == 0:
    raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {arr.shape}")
  if np.isnan(arr).any() or (not allow_inf and np.isinf(arr).any()):
    raise ValueError(f"{name} must contain only finite numbers, got {values!r}")
  if low is not None:
    bad = arr[(arr <= low) if low_open else (arr < low)]
    if bad.size:
      rng = _fmt_range(low, None, low_open, True)
      raise ValueError(f"every entry of {name} must be in {rng}, got {bad[0]!r}")
  return arr


def prng_key(name: str, value: Any, *, raw_ok: bool = False) -> Any:
  """`value` after checking it is one JAX PRNG key: a typed key of shape () from
  `jax.random.key(seed)` (with `raw_ok`, also a legacy uint32 key of shape (2,)).

  One key, not a batch: a batch of keys would silently broadcast.
  """
  import jax  # pylint: disable=g-import-not-at-top  (the accounting layer never needs it)
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  typed = isinstance(value, jax.Array) and jnp.issubdtype(value.dtype, jax.dtypes.prng_key)
  raw = (raw_ok and isinstance(value, jax.Array) and value.dtype == jnp.uint32
         and value.shape[-1:] == (2,))
  if not (typed or raw):
    raise ValueError(f"{name} must be a typed PRNG key from jax.random.key(seed), got {value!r}")
  if typed and value.shape != ():
    raise ValueError(f"{name} must be a single PRNG key of shape (), got shape {value.shape}")
  return value
