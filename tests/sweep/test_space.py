"""Search spaces and candidates: validation and identity."""

import hashlib

import jax
import numpy as np
import pytest

from jaxdp.sweep import Candidate, SearchSpace, candidate_id, candidate_key, grid_candidates
from jaxdp.sweep.space import candidate_keys, point_hash


def test_grid_is_the_cartesian_product(base_config):
  space = SearchSpace(base_config, {"learning_rate": np.array([0.1, 1.0]), "epochs": [1, 2, 3]})
  assert len(space) == 6
  assert {c.hparams["learning_rate"] for c in space.configs} == {0.1, 1.0}
  assert {c.num_steps for c in space.configs} == {20, 40, 60}  # epochs / q with q = 0.05
  assert len(space.events()) == 3


def test_candidate_ids_are_stable_and_distinct(base_config):
  cands = grid_candidates(SearchSpace(base_config, {"learning_rate": [0.1, 1.0]}), seeds=[0, 1])
  assert len({c.id for c in cands}) == 4
  assert cands[0].id == candidate_id({"learning_rate": 0.1}, 0)


@pytest.mark.parametrize("grid,match", [
    ({}, "non-empty mapping"), ({"learning_rate": []}, "must not be empty"),
    ({"lr": [0.1]}, r"\['lr'\] are not read by task"), ({"learning_rate": 0.1}, "sequence of values"),
    ({"learning_rate": [-1.0]}, "learning_rate"), ({"noise_multiplier": ["x"]}, "noise_multiplier"),
    ({"steps": [1], "epochs": [1]}, "not both"), ({"model": ["resnet"]}, "model must be one of"),
])
def test_bad_grids(base_config, grid, match):
  with pytest.raises(ValueError, match=match):
    SearchSpace(base_config, grid)


def test_bad_candidates(base_config):
  with pytest.raises(ValueError, match="seed"):
    Candidate({}, base_config, -1)
  with pytest.raises(ValueError, match="seeds must be a sequence"):
    grid_candidates(SearchSpace(base_config, {"learning_rate": [1.0]}), seeds=3)
  with pytest.raises(ValueError, match="base must be a TrainConfig"):
    SearchSpace({"learning_rate": 1.0}, {"learning_rate": [1.0]})


def test_derive_couples_settings_to_the_grid(base_config):
  sigma = {0.05: 1.5, 0.1: 2.5}
  space = SearchSpace(base_config, {"sampling_prob": [0.05, 0.1]},
                      derive=lambda c: c.replace(noise_multiplier=sigma[c.sampling_prob]))
  assert [c.noise_multiplier for c in space.configs] == [1.5, 2.5]
  with pytest.raises(ValueError, match="derive must return a TrainConfig"):
    SearchSpace(base_config, {"sampling_prob": [0.05]}, derive=lambda c: None)
  with pytest.raises(ValueError, match="derive must be a callable"):
    SearchSpace(base_config, {"sampling_prob": [0.05]}, derive=3)


def test_candidate_key_depends_on_point_and_seed_and_reproduces():
  a = candidate_key({"learning_rate": 1e-3}, 0)
  # Same (point, seed) -> the same key, also through a Candidate and in any key order.
  np.testing.assert_array_equal(jax.random.key_data(a),
                                jax.random.key_data(candidate_key({"learning_rate": 1e-3}, 0)))
  both = {"learning_rate": 1e-3, "l2_clip_norm": 1.0}
  np.testing.assert_array_equal(
      jax.random.key_data(candidate_key(both, 3)),
      jax.random.key_data(candidate_key(dict(reversed(list(both.items()))), 3)))
  others = [candidate_key({"learning_rate": 2e-3}, 0), candidate_key({"learning_rate": 1e-3}, 1),
            jax.random.key(0)]
  for other in others:
    assert not np.array_equal(jax.random.key_data(a), jax.random.key_data(other))


def test_grid_points_with_the_same_seed_draw_independent_noise(base_config):
  # Before keys depended on the point, lr=1e-3 and lr=2e-3 with seed 0 drew
  # identical noise (correlation 1.000000). 10**6 draws: the correlation of
  # independent normals has standard deviation 1e-3, so 0.01 is 10 sigma.
  space = SearchSpace(base_config, {"learning_rate": [1e-3, 2e-3]})
  cands = grid_candidates(space, seeds=[0, 1])
  by = {(c.point["learning_rate"], c.seed): c for c in cands}
  noise = {k: np.asarray(jax.random.normal(c.key(), (10**6,))) for k, c in by.items()}
  corr = np.corrcoef(noise[(1e-3, 0)], noise[(2e-3, 0)])[0, 1]
  assert abs(corr) < 0.01
  assert abs(np.corrcoef(noise[(1e-3, 0)], noise[(1e-3, 1)])[0, 1]) < 0.01
  again = grid_candidates(space, seeds=[0, 1])
  for c, d in zip(cands, again):
    np.testing.assert_array_equal(jax.random.key_data(c.key()), jax.random.key_data(d.key()))
  keys = {tuple(np.asarray(jax.random.key_data(c.key()))) for c in cands}
  assert len(keys) == len(cands)


def test_point_hash_is_sha256_of_canonical_json():
  # sha256(b'{"learning_rate":0.001}'), first 8 bytes as two big-endian words.
  digest = hashlib.sha256(b'{"learning_rate":0.001}').digest()
  assert point_hash({"learning_rate": np.float64(1e-3)}) == (
      int.from_bytes(digest[:4], "big"), int.from_bytes(digest[4:8], "big"))


def test_candidate_keys_are_each_candidates_key(base_config):
  space = SearchSpace(base_config, {"learning_rate": [0.1, 0.5, 1.0]})
  cands = [Candidate(space.points[i % 3], space.configs[i % 3], s)
           for i, s in enumerate([0, 1, 7, 2**31, 2**32 - 1, 123456789])]
  got = jax.random.key_data(candidate_keys(cands))
  want = jax.random.key_data(jax.numpy.stack([c.key() for c in cands]))
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
