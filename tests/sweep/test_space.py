"""Search spaces and candidates: validation and identity."""

import dataclasses

import numpy as np
import pytest

from jaxdp.sweep import Candidate, SearchSpace, candidate_id, grid_candidates


def test_grid_is_the_cartesian_product(base_config):
  space = SearchSpace(base_config, {"learning_rate": np.array([0.1, 1.0]), "epochs": [1, 2, 3]})
  assert len(space) == 6
  assert {c.learning_rate for c in space.configs} == {0.1, 1.0}
  assert {c.num_steps for c in space.configs} == {20, 40, 60}  # epochs / q with q = 0.05
  assert len(space.events()) == 3


def test_candidate_ids_are_stable_and_distinct(base_config):
  cands = grid_candidates(SearchSpace(base_config, {"learning_rate": [0.1, 1.0]}), seeds=[0, 1])
  assert len({c.id for c in cands}) == 4
  assert cands[0].id == candidate_id({"learning_rate": 0.1}, 0)


@pytest.mark.parametrize("grid,match", [
    ({}, "non-empty mapping"), ({"learning_rate": []}, "must not be empty"),
    ({"lr": [0.1]}, "unknown hyperparameter 'lr'"), ({"learning_rate": 0.1}, "sequence of values"),
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
                      derive=lambda c: dataclasses.replace(c, noise_multiplier=sigma[c.sampling_prob]))
  assert [c.noise_multiplier for c in space.configs] == [1.5, 2.5]
  with pytest.raises(ValueError, match="derive must return a TrainConfig"):
    SearchSpace(base_config, {"sampling_prob": [0.05]}, derive=lambda c: None)
  with pytest.raises(ValueError, match="derive must be a callable"):
    SearchSpace(base_config, {"sampling_prob": [0.05]}, derive=3)
