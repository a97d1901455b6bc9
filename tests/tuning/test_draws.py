"""The draws of a private search (`jaxdp.tuning.draws`): K, the candidates and their keys, the
same one search at a time as many at once."""

import jax
import numpy as np
import pytest

from jaxdp import accounting as acc
from jaxdp.sweep import SearchSpace
from jaxdp.tuning import draws


def _draw_search_one_key(space, repetitions, key):
  """`draw_search` as written before draws were vectorised: one key, one search (the reference)."""
  k_key, draw_key = jax.random.split(key)
  k = int(repetitions.sample(k_key))
  if not k:
    return []
  pick_key, keys_key = jax.random.split(draw_key)
  picks = np.asarray(jax.random.randint(pick_key, (k,), 0, len(space)))
  keys = np.asarray(jax.random.key_data(jax.random.split(keys_key, k)))
  return [(space.points[int(i)], tuple(int(w) for w in row)) for i, row in zip(picks, keys)]


# Each distinct K compiles its draw (about half a second): the geometric law's many go to the slow set.
@pytest.mark.parametrize("repetitions", [acc.Poisson(mean=1.5), acc.Fixed(2), pytest.param(
    acc.Geometric(mean=3), marks=pytest.mark.slow)], ids=repr)
def test_vectorised_draws_are_each_searchs_own(repetitions, base_config, monkeypatch):
  monkeypatch.setattr(draws, "_CHUNK", 16)  # several chunks, the last one padded
  space = SearchSpace(base_config, {"learning_rate": [0.1, 0.5, 1.0], "epochs": [1, 2]})
  key = jax.random.key(3)
  keys = jax.vmap(lambda t: jax.random.fold_in(key, t))(np.arange(40))
  got = [[(c.point, c.key_data) for c in cands] for cands in draws.draw_searches(space, repetitions,
                                                                                 keys)]
  want = [_draw_search_one_key(space, repetitions, jax.random.fold_in(key, t)) for t in range(40)]
  assert got == want and sum(map(len, got)) > 40
  assert [(c.point, c.key_data) for c in draws.draw_search(space, repetitions, keys[7])] == want[7]
