"""Search spaces and candidates: what a sweep trains.

A search space is a finite grid of values around a base `TrainConfig`
(random search in the papers draws uniformly from such a grid). A grid may
vary any config field (C, sigma, q or expected batch size, steps or epochs)
and any hyperparameter the task reads (learning rate, any optimizer
argument, model width, ...).
A candidate is one grid point plus its randomness; its identity is a hash of
both, so a pool on disk can tell which candidates are already trained.

A private search draws each candidate's PRNG key from its own key
(`Candidate.drawn`): the candidate's noise carries all of the search key's
entropy. A simulation pool enumerates public replicate seeds instead, and a
candidate's key is derived from its grid point *and* its seed
(`candidate_key`), never from the seed alone: with `key(seed)` every grid
point trained with seed 0 drew the same noise and the same batches, so the
runs a simulated search selects among were coupled, not the independent
trials the selection theorems assume.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import numbers
from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import numpy as np

from jaxdp import _validate
from jaxdp.train import CONFIG_FIELDS, TrainConfig


def _json_value(value):
  """A JSON-safe stand-in for one config value (numbers, strings, None pass; objects by repr)."""
  if isinstance(value, bool) or value is None or isinstance(value, str):
    return value
  if isinstance(value, np.generic):
    value = value.item()
  if isinstance(value, int):
    return value
  if isinstance(value, float):
    return value if math.isfinite(value) else repr(value)
  return repr(value)


def config_record(config) -> dict:
  """A JSON-safe description of a `TrainConfig`, for manifests and pool fingerprints.

  The task (functions, a Flax module) is not serialisable: it is recorded by
  its name, followed by every config field, the hyperparameters and the
  execution settings but `checkpoint_every`. Deterministic across processes (no object
  addresses).
  """
  record = {"task": config.task.name}
  record.update({name: _json_value(getattr(config, name)) for name in CONFIG_FIELDS})
  record["hparams"] = {k: _json_value(v) for k, v in sorted(config.hparams.items())}
  # How often a candidate checkpoints changes nothing it computes: a resume may change it.
  record["execution"] = {k: _json_value(v) for k, v in dataclasses.asdict(config.execution).items()
                         if k != "checkpoint_every"}
  return record


#: The parts of a pool's mechanism record (`jaxdp.sweep.SearchPlan.mechanism`), by name.
MECHANISM_PARTS = ("configs", "dp_events", "programs")


def point_key(point: Mapping[str, Any]) -> str:
  """A grid point as the canonical JSON string that keys it in manifests."""
  return _canonical_point(point).decode()


def _plain(value):
  if isinstance(value, (np.integer,)):
    return int(value)
  if isinstance(value, (np.floating,)):
    return float(value)
  return value


def checked_grid(grid: Any, argument: str = "grid") -> dict:
  """`grid` as a dict name -> tuple of plain values (NumPy scalars as Python numbers).

  Raises:
    ValueError: naming `argument`, unless `grid` is a non-empty mapping of string names to
      non-empty sequences (not strings).
  """
  if not isinstance(grid, Mapping) or not grid:
    raise ValueError(f"{argument} must be a non-empty mapping name -> values, got {grid!r:.200}")
  out = {}
  for name, values in grid.items():
    if not isinstance(name, str):
      raise ValueError(f"{argument} names must be strings, got {name!r}")
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
      raise ValueError(f"{argument}[{name!r}] must be a non-empty sequence of values, got {values!r:.200}")
    values = tuple(_plain(v) for v in values)
    if not values:
      raise ValueError(f"{argument}[{name!r}] must be a non-empty sequence of values: it must not be empty")
    out[name] = values
  return out


@dataclasses.dataclass(frozen=True)
class SearchSpace:
  """A finite grid: every combination of the listed values, applied to `base`.

  Args:
    base: the configuration every candidate starts from.
    grid: name -> non-empty sequence of values. A name is a
      `TrainConfig` field (`jaxdp.train.CONFIG_FIELDS`) or a hyperparameter
      the task reads; values are checked by building every `TrainConfig`
      (which builds the task's model and optimizer for them).
    derive: optional `TrainConfig -> TrainConfig` applied to every grid point,
      for settings that depend on others (e.g. sigma calibrated per sampling
      rate and epochs, Koskela & Kulkarni Sec. 4.1).
  """

  base: TrainConfig
  grid: Mapping[str, Sequence[Any]]
  derive: Optional[Callable[[TrainConfig], TrainConfig]] = None

  def __post_init__(self):
    if not isinstance(self.base, TrainConfig):
      raise ValueError(f"base must be a TrainConfig, got {type(self.base).__name__}")
    grid = checked_grid(self.grid)
    if "steps" in grid and "epochs" in grid:
      raise ValueError("grid may vary steps or epochs, not both")
    if "sampling_prob" in grid and "batch_size" in grid:
      raise ValueError("grid may vary sampling_prob or batch_size, not both")
    if self.derive is not None and not callable(self.derive):
      raise ValueError(f"derive must be a callable TrainConfig -> TrainConfig, got {self.derive!r}")
    object.__setattr__(self, "grid", grid)
    object.__setattr__(self, "_configs", tuple(self._build(p) for p in self._points()))

  def _points(self):
    names = list(self.grid)
    for combo in itertools.product(*(self.grid[n] for n in names)):
      yield dict(zip(names, combo))

  def _build(self, point: dict) -> TrainConfig:
    try:
      config = self.base.replace(**point)
    except ValueError as err:
      raise ValueError(f"grid point {point}: {err}") from err
    if self.derive is None:
      return config
    derived = self.derive(config)
    if not isinstance(derived, TrainConfig):
      raise ValueError(f"derive must return a TrainConfig, got {type(derived).__name__}")
    return derived

  @property
  def points(self) -> tuple:
    """The grid points, as dicts name -> value, in a fixed order."""
    return tuple(self._points())

  @property
  def configs(self) -> tuple:
    """One `TrainConfig` per grid point, same order as `points`."""
    return self._configs  # pylint: disable=no-member

  def __len__(self) -> int:
    return len(self.configs)

  def events(self, num_examples: Optional[int] = None) -> list:
    """The distinct DpEvents of the grid's configurations (N needed with `batch_size`)."""
    seen = []
    for c in self.configs:
      ev = c.dp_event(num_examples)
      if ev not in seen:
        seen.append(ev)
    return seen


#: How candidates get their PRNG keys. Durable pools record it, so a pool trained with another
#: derivation is refused instead of mixed.
KEY_DERIVATION = ("drawn: split(search key) per candidate, the key's every bit; replicate seed: "
                  "fold_in(fold_in(key(seed), sha256(point)[0:4]), sha256(point)[4:8])")


def _canonical_point(point: Mapping[str, Any]) -> bytes:
  return json.dumps({str(k): _plain(v) for k, v in point.items()}, sort_keys=True,
                    separators=(",", ":"), default=str).encode()


def point_hash(point: Mapping[str, Any]) -> tuple:
  """Two uint32 words from sha256 of the point's canonical JSON.

  Deterministic across processes and machines (Python's `hash` is salted per
  process); 64 bits, so two distinct points of a grid of 10**6 collide with
  probability ~3e-8 (and `grid_candidates` checks its own grid).
  """
  digest = hashlib.sha256(_canonical_point(point)).digest()
  return int.from_bytes(digest[0:4], "big"), int.from_bytes(digest[4:8], "big")


def key_digest(key: jax.Array) -> str:
  """sha256 of a PRNG key's implementation and raw bits: what a run directory records of a
  search's key, so that a resume with another key is refused, with neither the key on disk nor
  its bits in a message."""
  words = np.asarray(jax.random.key_data(key), np.uint32)
  return hashlib.sha256(str(jax.random.key_impl(key)).encode() + words.astype(">u4").tobytes()
                        ).hexdigest()


def candidate_key(point: Mapping[str, Any], seed: int) -> jax.Array:
  """The PRNG key of grid point `point` trained with the public replicate `seed` (a
  `grid_candidates` pool; a private search draws its candidates' keys from its own key).

  Guarantees:
    Same (point, seed) -> same key, in any process. Different points with the
    same seed get unrelated keys (threefry's `fold_in` is a pseudorandom
    function of the key and the folded word), so their noise and batches are
    independent; so do different seeds at one point.
  """
  seed = _validate.integer("seed", seed, low=0, high=2**32 - 1)
  high, low = point_hash(point)
  return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), high), low)


def candidate_keys(candidates: Sequence["Candidate"]) -> jax.Array:
  """`[c.key() for c in candidates]` stacked, derived at once (the same keys: `fold_in` is
  defined key by key, so its vmap gives each candidate the key it gets alone)."""
  impls = {c.key_impl for c in candidates}
  if len(impls) > 1:
    raise ValueError(f"candidates trained together must share one PRNG implementation, got {sorted(impls)}")
  drawn = [c for c in candidates if c.seed is None]
  if not drawn:
    words = np.array([(c.seed, *point_hash(c.point)) for c in candidates], np.uint32).reshape(-1, 3)
    return _derive_keys(words)
  if len(drawn) == len(candidates):
    return jax.random.wrap_key_data(np.array([c.key_data for c in candidates], np.uint32),
                                    impl=impls.pop())
  return jax.numpy.stack([c.key() for c in candidates])


@jax.jit
def _derive_keys(words):
  derive = lambda w: jax.random.fold_in(jax.random.fold_in(jax.random.key(w[0]), w[1]), w[2])
  return jax.vmap(derive)(words)


@dataclasses.dataclass(frozen=True)
class Candidate:
  """One grid point and the randomness it trains with.

  A private search's candidates are drawn (`Candidate.drawn`): each holds a
  key split from the search's key, every bit of it (`key_data`), so nothing
  narrower than the search key stands between that key and a run's noise,
  batches and initialisation. A simulation pool's candidates
  (`grid_candidates`) hold a public replicate `seed` instead, and their key is
  `candidate_key(point, seed)`.

  A candidate's key, its `key_data`, its `seed` and its `id` (a hash of its
  point and its randomness) are as secret as the search key: they regenerate
  its noise. The tuners never release them, print them or log them.

  Args:
    point: the grid point.
    config: its configuration (a `TrainConfig`, or a training function's run).
    seed: a replicate seed in [0, 2**32) (a simulation pool), or None with `key_data`.
    key_data: the raw data of a drawn key (a tuple of uint32 words), or None with `seed`.
    key_impl: the PRNG implementation of `key_data` (e.g. "threefry2x32").
  """

  point: Mapping[str, Any]
  config: Any
  seed: Optional[int] = None
  key_data: Optional[tuple] = dataclasses.field(default=None, repr=False)
  key_impl: str = dataclasses.field(default="", repr=False)

  def __post_init__(self):
    if (self.seed is None) == (self.key_data is None):
      raise ValueError("a Candidate takes either a replicate seed or the key_data of a drawn key, "
                       f"not both nor neither (seed={self.seed!r})")
    if self.seed is not None:
      _validate.integer("seed", self.seed, low=0, high=2**32 - 1)
      if not self.key_impl:
        object.__setattr__(self, "key_impl", str(jax.random.key_impl(jax.random.key(0))))
    else:
      words = tuple(int(w) for w in np.asarray(self.key_data, np.uint32).reshape(-1))
      object.__setattr__(self, "key_data", words)
      if not self.key_impl:
        raise ValueError("a drawn Candidate needs its key_impl (e.g. 'threefry2x32')")

  @classmethod
  def drawn(cls, point: Mapping[str, Any], config: Any, key: jax.Array) -> "Candidate":
    """The candidate at `point` that trains with `key` (a typed PRNG key drawn from a search's)."""
    return cls(point, config, key_data=tuple(np.asarray(jax.random.key_data(key)).reshape(-1)),
               key_impl=str(jax.random.key_impl(key)))

  @property
  def id(self) -> str:
    """Stable identity: a hash of the grid point and the candidate's randomness (secret)."""
    if self.seed is not None:
      return candidate_id(self.point, self.seed)
    text = json.dumps({"point": {k: _plain(v) for k, v in self.point.items()},
                       "key": [self.key_impl, list(self.key_data)]}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]

  def key(self) -> jax.Array:
    """The candidate's PRNG key."""
    if self.seed is not None:
      return candidate_key(self.point, self.seed)
    return jax.random.wrap_key_data(np.array(self.key_data, np.uint32), impl=self.key_impl)


def candidate_id(point: Mapping[str, Any], seed: int) -> str:
  """The id of the replicate-`seed` candidate at `point` (`grid_candidates`)."""
  text = json.dumps({"point": {k: _plain(v) for k, v in point.items()}, "seed": int(seed)},
                    sort_keys=True, default=str)
  return hashlib.sha1(text.encode()).hexdigest()[:16]


def grid_candidates(space: SearchSpace, seeds: Sequence[int]) -> list:
  """Every grid point with every seed: what a pool for the trial simulator trains.

  Seed s at one grid point and seed s at another are independent runs: each
  candidate's key comes from (point, seed), see `candidate_key`.
  """
  if isinstance(seeds, numbers.Integral):
    raise ValueError(f"seeds must be a sequence of integers, got {seeds!r}")
  seeds = [_validate.integer("seed", s, low=0) for s in seeds]
  if not seeds:
    raise ValueError("seeds must not be empty")
  points = space.points
  hashes = {}
  for p in points:
    # Cheap insurance that no two distinct points share a key stream.
    other = hashes.setdefault(point_hash(p), p)
    if other != p:
      raise ValueError(f"grid points {other!r} and {p!r} hash to the same key words; "
                       "rename or perturb one of them")
  return [Candidate(p, c, s) for p, c in zip(points, space.configs) for s in seeds]
