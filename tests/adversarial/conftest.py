"""Fixtures of the adversarial tests."""

import pytest

from tests.adversarial.mlp_task import make_data


@pytest.fixture(scope="module")
def data():
  return make_data()
