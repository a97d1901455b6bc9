"""A training function's identity: what a run directory records of it, so that a resume with
another function is refused (`jaxdp.sweep.functions.FunctionPlan`).

A resumed search is private only if it is the same mechanism as the run that
stored its candidates. A function is recorded by its behaviour, as far as
Python lets it be read: its code and every value its code can reach that the
user wrote or set. Per layer (a `functools.partial`, a wrapper with
`__wrapped__` such as `functools.wraps`, `functools.lru_cache` or `jax.jit`,
the function itself):

  - a function: its module and name, the sha256 of its source and of its
    bytecode (two lambdas on one line differ), its closure cells, defaults,
    own attributes, the globals it reads and the modules it imports as it
    runs (a module of the user's by its source file's sha256);
  - a bound method: its function and its instance;
  - a callable object: its attributes and slots, and its class;
  - a class of the user's (a callable object's, a value's, a global's): every
    method's identity (`__call__` included, so a monkeypatched or
    source-less class, as in a notebook cell or `exec`, is told apart) and
    its other class attributes, through its bases;
  - a partial: its function and its bound arguments;
  - a module of the user's, however it is reached (a global, a default, a
    partial's argument): its whole namespace; a library module by name.

Values are recorded by content: arrays by their bytes, containers by their
items (sets sorted, cycles as references), objects by their class and
attributes (and, with a C base such as `random.Random`, their pickle).
Library code (the standard library, installed packages, builtins, jaxdp) is
recorded by name, and what a library's callable holds by value (a function's
closure cells and defaults: an optax transformation's hyperparameters; a
bound method's instance; an object's attributes). Its version is the
environment's, which the privacy assumptions (docs/guides/privacy.md) leave to the user, with
the files a function loads and the environment variables it reads. Code that
looks names up as it runs (`globals()`, `eval`, `getattr` with a computed
name, `sys.modules`, ...) and a value that cannot be read (a generator, an
object whose attributes raise, code nested deeper than `DEPTH` calls) make
the identity unique to this call (`UNIDENTIFIED`): a run directory then
cannot be resumed, which is safe.
"""

from __future__ import annotations

import ast
import builtins
import collections
import collections.abc
import dis
import functools
import hashlib
import importlib.machinery
import inspect
import io
import json
import logging
import os
import pickle
import socket
import sys
import sysconfig
import textwrap
import threading
import types
import uuid
import weakref
from typing import Any, Callable, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

#: The key of an identity that cannot be resumed (see `function_identity`).
UNIDENTIFIED = "unidentified"
#: How deep `function_identity` follows code reached from code; deeper is `UNIDENTIFIED`.
DEPTH = 8


class _Unreadable(ValueError):
  """A value `function_identity` cannot identify by content."""


def function_identity(fn: Callable) -> dict:
  """What a run directory records of `fn` (see the module docstring).

  Returns:
    A JSON-safe dict, equal in every process for a function of the same code holding equal
    values; or {UNIDENTIFIED: why, "nonce": a random value} when some value it reaches
    cannot be read.
  """
  try:
    return _identity(fn, DEPTH, {})
  except RecursionError:
    why = "it holds values nested too deeply"
  except Exception as err:  # pylint: disable=broad-except  # a value that refuses to be read
    why = f"{type(err).__name__}: {err}"[:200]
  return {UNIDENTIFIED: why, "nonce": uuid.uuid4().hex}


def function_name(fn: Callable) -> str:
  """`fn`'s module.qualname (of the function a `functools.partial` wraps)."""
  while isinstance(fn, functools.partial):
    fn = fn.func
  return (f"{getattr(fn, '__module__', None) or type(fn).__module__}."
          f"{getattr(fn, '__qualname__', None) or type(fn).__qualname__}")


def _name(obj) -> str:
  """`obj`'s module.qualname, or its type's: never its repr (a repr may show private values)."""
  if not hasattr(obj, "__qualname__"):
    obj = type(obj)
  return f"{getattr(obj, '__module__', '?')}.{obj.__qualname__}"


@functools.lru_cache(maxsize=None)
def _library_roots() -> tuple:
  paths = sysconfig.get_paths()
  roots = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib")
           if paths.get(k)}
  return tuple(sorted(roots))


def _library_module(module_name: Optional[str]) -> bool:
  """True for a module of the standard library, an installed package or a builtin module: code
  the environment provides, recorded by name. `__main__` (a script, a notebook) is the user's."""
  if not module_name or module_name == "__main__":
    return False
  top = module_name.split(".")[0]
  if top == "jaxdp":  # jaxdp's own code: its version is in every run directory's fingerprint
    return True
  if top in sys.builtin_module_names or module_name in ("builtins", "__builtin__"):
    return True
  module = sys.modules.get(module_name) or sys.modules.get(top)
  return _library_file(getattr(module, "__file__", None))


def _library_file(path: Optional[str]) -> bool:
  """True for a file under the standard library's or installed packages' directories (not a
  pseudo-file such as `<string>` of `exec`, nor a missing one: a prompt's, a notebook's)."""
  if not path or path.startswith("<"):
    return False
  path = os.path.realpath(path)
  return any(path.startswith(root + os.sep) for root in _library_roots())


def _library_function(function) -> bool:
  """A plain function is a library's when its module is jaxdp or its code lives in a library
  file (read from its code, not its module's name: `exec` may name any module)."""
  module = getattr(function, "__module__", None) or ""
  if module.split(".")[0] == "jaxdp":
    return True
  return _library_file(function.__code__.co_filename)


def _library_callable(value) -> bool:
  """True for a function, builtin or callable object whose code is a library's (see
  `_library_module`); a partial or a wrapper (`__wrapped__`) is followed, never a library's."""
  if isinstance(value, functools.partial) or _wrapped(value) is not None:
    return False
  if inspect.isbuiltin(value) or isinstance(value, (types.MethodWrapperType,
                                                     types.WrapperDescriptorType,
                                                     types.MethodDescriptorType)):
    return True
  if inspect.ismethod(value):
    func = value.__func__  # a Cython method's is no Python function: a library's
    return ((not inspect.isfunction(func) or _library_function(func))
            and _library_class(type(value.__self__)))
  if inspect.isfunction(value):
    return _library_function(value)
  return _library_class(type(value))


def _library_class(cls: type) -> bool:
  """A class is a library's when its module is, and none of its methods' code is the user's
  (a class made by `exec` in a library module's name, or in pytest's `__main__`)."""
  if not _library_module(cls.__module__):
    return False
  return all(_library_function(f) for f in vars(cls).values() if inspect.isfunction(f))


def _wrapped(fn):
  wrapped = getattr(fn, "__wrapped__", None) if not inspect.ismethod(fn) else None
  return None if wrapped is fn else wrapped


def _identity(fn, depth: int, memo: dict) -> dict:
  if depth < 0:
    raise _Unreadable(f"it reaches code more than {DEPTH} calls deep ({_name(fn)})")
  if isinstance(fn, functools.partial):
    return {"partial": _identity(fn.func, depth, memo),
            "held": _canonical([fn.args, fn.keywords], depth, memo)}
  if _library_callable(fn):
    return {"library": function_name(fn), "held": _library_held(fn, depth, memo)}
  target = fn.__func__ if inspect.ismethod(fn) else fn
  function = inspect.isfunction(target)
  kind = target if function else type(fn)
  out = {"name": _name(kind)}
  try:
    out["source_sha256"] = hashlib.sha256(inspect.getsource(kind).encode()).hexdigest()
  except (OSError, TypeError):  # no source file (a prompt, exec, a builtin): the code below tells
    out["source_sha256"] = None
  if function:
    out["code_sha256"] = _code_digest(target.__code__)
    out["held"] = _canonical(_held(target, fn, depth, memo), depth, memo)
  obj = not function and not inspect.ismethod(fn)  # a callable object
  if obj and not _library_class(type(fn)):
    # A user's callable object, a class-based decorator (`__wrapped__`) included: its state
    # (a decorator's noise, say) and its class's code, besides what it wraps.
    out["held"] = _canonical(_state(fn), depth, memo)
    out["class"] = _class(type(fn), depth, memo)
  if inspect.ismethod(fn) and not _library_class(type(fn.__self__)):
    out["class"] = _class(type(fn.__self__), depth, memo)
  wrapped = _wrapped(fn)
  if wrapped is not None:
    out["wraps"] = _identity(wrapped, depth, memo)
  if obj and _library_class(type(fn)):
    # A library's wrapper (`jax.custom_vjp`'s `fwd` and `bwd`, `jax.jit`, `lru_cache`): its
    # public attributes (its private ones are caches and compiled programs), after what it
    # wraps, so that is recorded as it is alone.
    out["held"] = _canonical({k: v for k, v in _state(fn).items() if not k.startswith("_")},
                             depth, memo)
  return out


def _code_digest(code: types.CodeType) -> str:
  """sha256 of a code object's bytecode, names and constants (nested code included)."""
  digest = hashlib.sha256(code.co_code)
  digest.update(repr((code.co_names, code.co_varnames, code.co_freevars, code.co_firstlineno)).encode())
  for const in code.co_consts:
    if isinstance(const, types.CodeType):
      digest.update(_code_digest(const).encode())
    elif isinstance(const, frozenset):  # `x in {...}`: its order follows the hash seed
      digest.update(repr(sorted(map(repr, const))).encode())
    else:
      digest.update(repr(const).encode())
  return digest.hexdigest()


def _imports(code: types.CodeType) -> list:
  """The modules `code` (and the code nested in it) imports as it runs, by their full names."""
  found = [i.argval for i in dis.get_instructions(code) if i.opname == "IMPORT_NAME"]
  for const in code.co_consts:
    if isinstance(const, types.CodeType):
      found += _imports(const)
  return sorted(set(found))


def _imported(name: str) -> list:
  """A module a function imports as it runs: a library's by name, the user's by the sha256 of
  its source file (found without importing it, nor its packages: the same whether the function
  has run yet or not)."""
  module = sys.modules.get(name)
  if module is not None:
    origin = getattr(module, "__file__", None)
  else:
    path, spec = None, None
    for part in name.split("."):
      spec = importlib.machinery.PathFinder.find_spec(part, path)
      if spec is None:
        raise _Unreadable(f"it imports {name!r}, which cannot be found without importing it")
      path = spec.submodule_search_locations
    origin = spec.origin if spec.has_location else None
  if _library_file(origin) or (origin is None and name.split(".")[0] in sys.builtin_module_names):
    return ["module", name]
  if origin is None:
    raise _Unreadable(f"it imports {name!r}, which has no source file to record")
  with open(origin, "rb") as f:
    return ["module-source", name, hashlib.sha256(f.read()).hexdigest()]


def _names(code: types.CodeType) -> set:
  """Every global and attribute name `code` (and the code nested in it) names."""
  names = set(code.co_names)
  for const in code.co_consts:
    if isinstance(const, types.CodeType):
      names |= _names(const)
  return names


#: Names through which code reads what its names do not say: what it reads cannot be recorded.
_DYNAMIC = frozenset({"globals", "locals", "vars", "eval", "exec", "__import__", "import_module",
                      "__dict__", "resolve_name", "getmembers", "attrgetter"})
#: The builtins as jaxdp found them: a name added to `builtins` later is a value, read as a global.
_BUILTINS = frozenset(vars(builtins))


def _dynamic_reads(function, names: set) -> list:
  """The ways `function` reads values its code does not name (see `_DYNAMIC`), a module's
  `sys.modules`, and `getattr` with a computed name (from its source; without source, any
  `getattr`)."""
  found = sorted(names & _DYNAMIC)
  if "modules" in names and any(function.__globals__.get(n) is sys for n in names):
    found.append("sys.modules")
  if "getattr" in names and "getattr" not in function.__globals__:
    try:
      tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
      computed = any(isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                     and node.func.id == "getattr" and len(node.args) >= 2
                     and not isinstance(node.args[1], ast.Constant) for node in ast.walk(tree))
    except (OSError, TypeError, SyntaxError):  # no source (exec, a prompt): assume the worst
      computed = True
    if computed:
      found.append("getattr with a computed name")
  return found


def _cells(function) -> list:
  cells = []
  for cell in function.__closure__ or ():
    try:
      cells.append(cell.cell_contents)
    except ValueError:  # a cell not yet filled
      cells.append(None)
  return cells


def _held(function, fn, depth: int, memo: dict) -> list:
  """What a plain function holds: closure cells, defaults, its own attributes, the globals it
  reads (a module of the user's by the attributes the function names) and, for a bound method,
  its instance."""
  cells = _cells(function)
  names = _names(function.__code__)
  dynamic = _dynamic_reads(function, names)
  if dynamic:
    raise _Unreadable(f"{_name(function)} looks names up as it runs ({', '.join(dynamic)}): what "
                      "it reads cannot be recorded")
  reads = {}
  for name in sorted(names & set(function.__globals__)):
    value = function.__globals__[name]
    if isinstance(value, type) and _library_class(value):  # `Lib.attr`: what it names, now
      reads[name] = ["class", _name(value), {attr: _canonical(vars(value)[attr], depth, memo)
                                              for attr in sorted(names & set(vars(value)))
                                              if not callable(vars(value)[attr])}]
    else:
      reads[name] = value
  for name in sorted(names - set(function.__globals__) - _BUILTINS):
    if hasattr(builtins, name):  # set on `builtins` after jaxdp was imported: a global value
      reads[name] = getattr(builtins, name)
  for name in _imports(function.__code__):  # `import cfg` inside the function
    reads[f"import {name}"] = _imported(name)
  instance = fn.__self__ if inspect.ismethod(fn) else None
  held = [cells, function.__defaults__, function.__kwdefaults__, reads,
          None if instance is None else _state(instance)]
  own = _state(function)  # `train_fn.lr = 0.1`
  return held + [own] if own else held


def _library_held(value, depth: int, memo: dict) -> list:
  """What a library's callable holds besides its code (recorded by name): a function's closure
  cells and defaults (`optax.contrib.dpsgd(noise_multiplier=...)`'s closures), a bound method's
  instance, a callable object's attributes (or, for a C object, its pickle)."""
  if inspect.isfunction(value):
    return _canonical([_cells(value), value.__defaults__, value.__kwdefaults__], depth, memo)
  owner = getattr(value, "__self__", None)
  if inspect.ismethod(value) or inspect.isbuiltin(value):
    if owner is None or isinstance(owner, types.ModuleType):
      return []
    held = _canonical(owner, depth, memo)
    return [held, _library_held(value.__func__, depth, memo)] if inspect.ismethod(value) else [held]
  if isinstance(value, (types.MethodWrapperType, types.WrapperDescriptorType,
                        types.MethodDescriptorType)):
    return []
  return _object_state(value, depth, memo)


def _module(module: types.ModuleType, depth: int, memo: dict) -> list:
  """A module, however it is reached (a global, a local import, a default, a partial's argument,
  a helper's): a library's by name; the user's by its whole namespace, read now. Whole, because
  the code that reads it may be elsewhere (`helper(cfg)` reading `cfg.LR`): safe, at the price
  that changing any of its values refuses a resume."""
  if _library_module(module.__name__):
    return ["module", module.__name__]
  key = ("module", id(module))
  if key in memo and memo[key][1] is module:
    return ["module-ref", memo[key][0]]
  memo[key] = (len(memo), module)
  return ["module", module.__name__, [[name, _canonical(value, depth, memo)] for name, value
                                      in sorted(vars(module).items()) if not name.startswith("__")]]


def _state(obj, skip=()) -> dict:
  """An object's attributes and slots (dunder names and `skip` left out)."""
  state = {}
  for name, value in (vars(obj).items() if hasattr(obj, "__dict__") else ()):
    if not name.startswith("__") and name not in skip:
      state[name] = value
  for cls in type(obj).__mro__:
    slots = cls.__dict__.get("__slots__", ())
    for name in [slots] if isinstance(slots, str) else slots:
      if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
        state[name] = getattr(obj, name)
  return state


#: Class attributes that name or document a class rather than define what it does.
_CLASS_SKIP = frozenset({"__dict__", "__weakref__", "__module__", "__qualname__", "__doc__",
                         "__annotations__", "__firstlineno__", "__static_attributes__",
                         "__dataclass_fields__", "__dataclass_params__", "__match_args__",
                         "__parameters__", "__orig_bases__", "__abstractmethods__", "_abc_impl"})


def _class(cls: type, depth: int, memo: dict):
  """A class as what its instances run: for each of the user's classes in its MRO, every
  method's identity and its other attributes' values; a library's class by name."""
  key = ("class", id(cls))
  if key in memo and memo[key][1] is cls:
    return ["class-ref", memo[key][0]]
  memo[key] = (len(memo), cls)
  out = []
  for base in cls.__mro__:
    if base is object or _library_class(base):
      out.append(["library-class", _name(base)])
      continue
    members = {}
    for name, value in sorted(vars(base).items()):
      if name in _CLASS_SKIP:
        continue
      if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
      if isinstance(value, property):
        value = [value.fget, value.fset, value.fdel]
      members[name] = _canonical(value, depth - 1, memo)
    out.append([_name(base), members])
  return out


def _canonical(value: Any, depth: int, memo: dict):
  """A JSON stand-in for `value`, the same in every process for equal values (see the module
  docstring); a container met twice is a reference to its first place."""
  if value is None or isinstance(value, (bool, int, str)):
    return value
  if isinstance(value, float):
    return repr(value)
  if isinstance(value, types.ModuleType):
    return _module(value, depth, memo)
  if value is sys.modules:
    raise _Unreadable("it reads sys.modules: which modules it finds there cannot be recorded")
  if isinstance(value, type):
    if _library_class(value):
      return ["class", _name(value)]
    return ["class", _name(value), _class(value, depth, memo)]
  seen = memo.get(id(value))
  if seen is not None and seen[1] is value:
    return ["ref", seen[0]]
  memo[id(value)] = (len(memo), value)  # the value too: a freed object's id is reused
  if isinstance(value, (list, tuple, collections.deque, Mapping)):
    items = (value.items() if isinstance(value, Mapping) else None)
    out = [type(value).__name__,
           [_canonical(v, depth, memo) for v in value] if items is None else
           [[_canonical(k, depth, memo), _canonical(v, depth, memo)] for k, v in items]]
    extra = _state(value)  # a subclass's own attributes (a dict subclass's `lr`)
    if isinstance(value, collections.defaultdict):
      extra["default_factory"] = value.default_factory
    return out + [_canonical(extra, depth, memo)] if extra else out
  if isinstance(value, (set, frozenset)):  # iteration order follows the process's hash seed
    return ["set", sorted(json.dumps(_canonical(v, depth, memo), sort_keys=True) for v in value)]
  if isinstance(value, (np.ndarray, np.generic, jax.Array)):
    return _array(value, depth, memo)
  if callable(value):
    # Depth counts the user's code reaching code; what library code holds is data (its cycles
    # end at `memo`).
    return ["function", _identity(value, depth if _library_callable(value) else depth - 1, memo)]
  if hasattr(value, "__array__"):  # a PyTorch tensor, ...: by its values where it gives them
    array = _as_array(value)
    if array is not None and array.dtype.kind != "O":
      return ["array", str(array.dtype), list(array.shape), _bytes_digest(array)]
  if isinstance(value, logging.Logger):  # by name: its manager holds every logger of the process
    return ["logger", value.name]
  if inspect.isgenerator(value) or isinstance(value, collections.abc.Iterator):
    raise _Unreadable(f"it holds a {type(value).__name__}, whose values cannot be read without "
                      "consuming them")
  return _object_state(value, depth, memo)


def _object_state(value, depth: int, memo: dict) -> list:
  """An object by its class (a user's class by its code) and its attributes; one with a C base
  (`random.Random`, `array.array`) also by its pickle, which holds what no attribute shows."""
  kind = type(value)
  state = _state(value)
  if state or hasattr(value, "__dict__"):
    cls = (["class", _name(kind)] if _library_class(kind)
           else ["class", _name(kind), _class(kind, depth, memo)])
    out = ["object", cls, _canonical(state, depth, memo)]
    return out + [_pickled(value)] if _c_base(kind) else out
  # No attributes to read (a C type): its pickle, or its type alone when it has none (a lock, a
  # file: resources, not values).
  return _pickled(value)


def _c_base(cls: type) -> bool:
  """True when a class derives from a type written in C other than `object` (a builtin's, an
  extension module's): its state may live where no attribute shows it."""
  for base in cls.__mro__:
    if base is object:
      continue
    module = sys.modules.get(base.__module__)
    path = getattr(module, "__file__", None) or ""
    if (base.__module__ == "builtins" or path.endswith((".so", ".pyd"))
        or (not path and base.__module__ in sys.builtin_module_names)):
      return True
  return False


#: Resources, not values: recorded by their type (a lock, a file, a socket, a logger's stream, a
#: weak reference: what it refers to is recorded where it is held).
_RESOURCES = (io.IOBase, type(threading.Lock()), type(threading.RLock()), socket.socket,
              weakref.ReferenceType, weakref.ProxyType, weakref.CallableProxyType)


def _pickled(value) -> list:
  name = _name(type(value))
  if isinstance(value, _RESOURCES):
    return ["type", name]
  if isinstance(value, memoryview):
    return ["bytes", _bytes_digest(np.frombuffer(value.tobytes(), np.uint8))]
  try:
    return ["pickle", name, hashlib.sha256(pickle.dumps(value, protocol=4)).hexdigest()]
  except Exception as err:  # pylint: disable=broad-except
    raise _Unreadable(f"it holds a {name} that can be neither read nor pickled "
                      f"({type(err).__name__})") from None


def _as_array(value) -> Optional[np.ndarray]:
  """`value`'s values as a NumPy array (a PyTorch tensor that requires grad detached first), or
  None when it gives none."""
  for view in (lambda v: v, lambda v: v.detach().cpu()):
    try:
      return np.asarray(view(value))
    except Exception:  # pylint: disable=broad-except
      continue
  return None


def _bytes_digest(array: np.ndarray) -> str:
  """sha256 of an array's bytes, read in place (a large memory map is not copied into memory)."""
  array = np.ascontiguousarray(array).reshape(-1)
  digest = hashlib.sha256()
  step = max(1, (1 << 24) // max(array.itemsize, 1))
  for start in range(0, array.size, step):
    digest.update(array[start:start + step].view(np.uint8))
  return digest.hexdigest()


def _array(value, depth: int, memo: dict) -> list:
  if isinstance(value, jax.Array) and jnp.issubdtype(value.dtype, jax.dtypes.prng_key):
    value = jax.random.key_data(value)
  array = np.ascontiguousarray(np.asarray(value))
  if array.dtype.kind == "O":
    return ["objects", list(array.shape), [_canonical(v, depth, memo) for v in array.reshape(-1)]]
  return ["array", str(array.dtype), list(array.shape), _bytes_digest(array)]
