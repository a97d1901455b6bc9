"""The draws of a private search: K, the candidates, their keys, the stop coin, the selection.

Every draw depends only on the search's key and public inputs (K's law, the
grid), never on data; each candidate's PRNG key is split from the search key
(every bit of it). `random_search`, `threshold_search`, `subsampled_search`
and the audit (`jaxdp.audit`) all draw here, so an audit runs exactly the
searches users run.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import accounting as acc
from jaxdp._cache import LruCache
from jaxdp.accounting import kdistribution
from jaxdp.sweep.space import Candidate


def draw_search(space: Any, distribution: acc.KDistribution, key: jax.Array) -> list:
  """The candidates of one Papernot-Steinke search: K ~ `distribution`, then K uniform draws from
  `space` (a plan: its `points`, `configs` and length).

  Depends only on the public K law, the grid and the key, never on data;
  `random_search`, `subsampled_search` and the audit (`jaxdp.audit`) all draw
  through it (`draw_searches`), so an audit runs exactly the searches users run.
  """
  return draw_searches(space, distribution, key[None])[0]


def draw_searches(space: Any, distribution: acc.KDistribution, keys: jax.Array) -> list:
  """`draw_search` for each key of `keys` (typed keys, shape (n,)): the same candidates, drawn at once.

  Every JAX random function is defined key by key, so vmapping over the keys
  (and, for the grid draws, over the searches with the same K) gives each
  search the bits it gets alone; an audit draws 10^5 searches this way in
  seconds.
  """
  impl = jax.random.key_impl(keys)
  pairs = _in_chunks("split", jax.random.split, np.asarray(jax.random.key_data(keys)), impl)
  k_keys = jax.random.wrap_key_data(pairs[:, 0], impl=impl)
  ks = [int(distribution.sample(g)) for g in kdistribution.generators_for_keys(k_keys)]
  out: list = [[] for _ in ks]
  by_k: dict = {}
  for i, k in enumerate(ks):
    if k:
      by_k.setdefault(k, []).append(i)
  for k, rows in by_k.items():
    draw = functools.partial(_indices, n=k, size=len(space))
    picks, keys = _in_chunks(("indices", k, len(space)), draw, pairs[np.asarray(rows), 1], impl)
    for row, i in enumerate(rows):
      out[i] = _candidates(space, picks[row], keys[row], impl)
  return out


_CHUNK = 4096


def _in_chunks(name, fn, key_data: np.ndarray, impl) -> Any:
  """`jax.vmap(fn)` over the keys whose raw data is `key_data`, as NumPy (keys as their data).

  Compiled once per `name` for chunks of `_CHUNK` keys, the padding rows
  copies, computed and dropped; a lone key (one search) runs op by op, as
  compiling would cost it more than it saves. Only threefry's random
  functions are defined key by key under `vmap`; other implementations (rbg)
  run key by key, so every search gets the bits it gets alone.
  """
  n = key_data.shape[0]
  if n == 1 or str(impl) != "threefry2x32":
    outs = [_as_data(fn(jax.random.wrap_key_data(row, impl=impl)), lambda a: np.asarray(a)[None])
            for row in key_data]
    leaves = [np.concatenate(a) for a in zip(*[o if isinstance(o, tuple) else (o,) for o in outs])]
    return leaves[0] if len(leaves) == 1 else tuple(leaves)
  run = _chunk_program(name, fn, impl, _CHUNK)
  parts = []
  for start in range(0, n, _CHUNK):
    chunk = key_data[start:start + _CHUNK]
    padded = np.concatenate([chunk, np.repeat(chunk[:1], _CHUNK - len(chunk), axis=0)])
    parts.append([np.asarray(a)[:len(chunk)] for a in jax.tree.leaves(run(padded))])
  leaves = [np.concatenate(a) for a in zip(*parts)]
  return leaves[0] if len(leaves) == 1 else tuple(leaves)


def _as_data(out, finish=lambda a: a):
  """`out`'s leaves with keys replaced by their raw data, each passed through `finish`;
  one array, or a tuple of them."""
  leaves = [finish(jax.random.key_data(a) if jnp.issubdtype(a.dtype, jax.dtypes.prng_key) else a)
            for a in jax.tree.leaves(out)]
  return leaves[0] if len(leaves) == 1 else tuple(leaves)


_PROGRAMS = LruCache(256)


def _chunk_program(name, fn, impl, size: int):
  memo = (name, str(impl), size)
  run = _PROGRAMS.get(memo)
  if run is None:
    run = jax.jit(lambda data: _as_data(jax.vmap(fn)(jax.random.wrap_key_data(data, impl=impl))))
    _PROGRAMS.put(memo, run)
  return run


def best_index(results: Sequence[Any]) -> Optional[int]:
  """Index of the highest finite score (first on ties), None if none is finite: what a search
  releases. A non-finite score (NaN, +-inf: a diverged run, an overflowing DP score) counts
  as the worst, whatever its sign."""
  scores = np.array([r.score for r in results], dtype=np.float64)
  finite = np.isfinite(scores)
  if not finite.any():
    return None
  return int(np.argmax(np.where(finite, scores, -np.inf)))


def stops(stop_key: jax.Array, stop_prob: float) -> bool:
  """The stop coin of `threshold_search`: True with probability in [stop_prob, stop_prob + 2^-32).

  Never below the accounted rate, since the bounds of `acc.ThresholdSelect`
  (Liu & Talwar's 2 eps1 + 2 exp(-gamma T), Lemma 7 for a capped geometric
  K) decrease in gamma. An exact integer comparison of 32 uniform bits: a
  float32 uniform would round gamma to the 2^-23 grid.
  """
  return int(jax.random.bits(stop_key, dtype=jnp.uint32)) < math.ceil(stop_prob * 2.0 ** 32)


def threshold_keys(key: jax.Array, max_candidates: Optional[int]):
  """(draw key, stop key) of candidate 1, 2, ... of Liu-Talwar's loop (at most `max_candidates`)."""
  j = 0
  while max_candidates is None or j < max_candidates:
    key, draw_key, stop_key = jax.random.split(key, 3)
    yield draw_key, stop_key
    j += 1


def _indices(key, n: int, size: int) -> tuple:
  """(grid indices, keys) of n candidates drawn uniformly with replacement from a grid of `size`:
  each candidate's key is split from `key`, so it carries the search key's every bit."""
  pick_key, keys_key = jax.random.split(key)
  return jax.random.randint(pick_key, (n,), 0, size), jax.random.split(keys_key, n)


def _candidates(space: Any, picks, key_data, impl) -> list:
  return [Candidate(space.points[i], space.configs[i], key_data=tuple(row), key_impl=str(impl))
          for i, row in zip(picks, np.asarray(key_data))]


def draw_candidates(space: Any, n: int, key) -> list:
  """n candidates drawn uniformly with replacement from `space` (any plan: its points and
  configs), each with a key split from `key`."""
  picks, keys = _indices(key, n, len(space))
  return _candidates(space, np.asarray(picks), np.asarray(jax.random.key_data(keys)),
                     jax.random.key_impl(key))
