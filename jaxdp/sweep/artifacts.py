"""How a training function's artifact is stored in a run directory: arrays where it can be,
pickle where it cannot.

`encode(artifact)` gives (a JSON structure, a list of NumPy arrays); the pool
writes the arrays like a candidate's parameters (one `.npz` per chunk, raw
bytes, read back with `allow_pickle=False`, its sha256 in the record) and the
structure in the record. `decode` rebuilds the artifact from both.

Pickle-free: None, bool, int, str, float (as a float64 array: every bit),
NumPy arrays and scalars of a numeric dtype (bfloat16 included), JAX arrays
(read back as JAX arrays on the default device, without weak types or
sharding), and exact `dict` (string keys), `list` and
`tuple` containers of those, nested (an object held twice is read back as
two copies). They are read back equal in type and bits. Anything else (a PyTorch `state_dict`, a scikit-learn model, a dict
subclass, a NumPy object array) is stored whole as one `pickle` (protocol
4) in a uint8 array. Reading a pickle runs code the file names: a run
directory is trusted like code and secret like the data (`jaxdp.sweep.store`),
and so is a saved release that holds a pickled artifact
(`jaxdp.tuning.load_release`). Its checksum detects damage, not tampering.
"""

from __future__ import annotations

import pickle
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

#: The pickle protocol of an artifact that is not arrays (4: Python >= 3.4 reads it).
PICKLE_PROTOCOL = 4


def _plain_dtype(dtype: np.dtype) -> bool:
  """True for a dtype the pool stores as raw bytes and reads back exactly (numbers, bool,
  JAX's bfloat16 and float8s): not objects, strings, records or dates."""
  if dtype.kind in "biufc":
    return True
  try:
    return dtype.kind == "V" and not dtype.fields and jnp.dtype(str(dtype)) == dtype
  except TypeError:
    return False


def _node(value: Any, leaves: list):
  """The structure of `value` (appending its arrays to `leaves`), or None if it is not
  pickle-free."""
  if value is None:
    return ["none"]
  if isinstance(value, bool):  # before int: a bool is an int
    return ["bool", value]
  if type(value) is int:  # pylint: disable=unidiomatic-typecheck
    return ["int", value]  # JSON keeps Python ints exact, any size
  if type(value) is str:  # pylint: disable=unidiomatic-typecheck
    return ["str", value]
  if type(value) is float:  # pylint: disable=unidiomatic-typecheck
    leaves.append(np.float64(value).reshape(()))
    return ["float", len(leaves) - 1]
  if isinstance(value, jax.Array):
    if jnp.issubdtype(value.dtype, jax.dtypes.prng_key):
      return None  # a typed key: pickled whole, its implementation with it
    array = np.asarray(value)
    kind = "jax"
  elif type(value) is np.ndarray or isinstance(value, np.generic):  # pylint: disable=unidiomatic-typecheck
    array = np.asarray(value)
    kind = "numpy" if isinstance(value, np.ndarray) else "numpy-scalar"
  else:
    array = None
  if array is not None:
    if not _plain_dtype(array.dtype):
      return None
    leaves.append(array)
    return [kind, len(leaves) - 1]
  if type(value) in (list, tuple):
    items = [_node(v, leaves) for v in value]
    return None if any(i is None for i in items) else [type(value).__name__, items]
  if type(value) is dict and all(type(k) is str for k in value):  # pylint: disable=unidiomatic-typecheck
    items = [[k, _node(v, leaves)] for k, v in value.items()]
    return None if any(i[1] is None for i in items) else ["dict", items]
  return None


def encode(artifact: Any) -> tuple:
  """(structure, arrays) of `artifact`: pickle-free when it is made of the types the module
  docstring lists, else ["pickle", 0] and one uint8 array.

  Raises:
    ValueError: the artifact can be neither stored as arrays nor pickled.
  """
  leaves: list = []
  try:
    structure = _node(artifact, leaves)
  except RecursionError:  # a container that holds itself: pickle keeps the reference
    structure = None
  if structure is not None:
    return structure, leaves
  try:
    blob = pickle.dumps(artifact, protocol=PICKLE_PROTOCOL)
  except Exception as err:  # pylint: disable=broad-except  # PicklingError, TypeError, RecursionError, ...
    raise ValueError(
        f"train_fn's artifact ({type(artifact).__name__}) can be stored neither as arrays nor by "
        f"pickle ({type(err).__name__}: {err}); return arrays, a state_dict or another picklable "
        "object as the artifact") from err
  return ["pickle", 0], [np.frombuffer(blob, np.uint8)]


def snapshot(artifact: Any) -> tuple:
  """`encode(artifact)` with every array copied: what a call returned, whatever the function
  does to its objects later (a run directory stores it as it is; `decode` reads it back)."""
  structure, leaves = encode(artifact)
  return structure, [np.array(leaf, copy=True) for leaf in leaves]


def decode(structure: Any, leaves: list) -> Any:
  """The artifact that `encode` gave (`structure`, `leaves`) for."""
  kind = structure[0]
  if kind == "none":
    return None
  if kind in ("bool", "int", "str"):
    return structure[1]
  if kind == "float":
    return float(leaves[structure[1]][()])
  if kind == "numpy":
    return leaves[structure[1]]
  if kind == "numpy-scalar":
    return leaves[structure[1]][()]
  if kind == "jax":
    return jnp.asarray(leaves[structure[1]])
  if kind in ("list", "tuple"):
    items = [decode(s, leaves) for s in structure[1]]
    return items if kind == "list" else tuple(items)
  if kind == "dict":
    return {k: decode(s, leaves) for k, s in structure[1]}
  if kind == "pickle":
    return pickle.loads(leaves[structure[1]].tobytes())
  raise ValueError(f"unknown artifact structure {kind!r}: written by another jaxdp?")
