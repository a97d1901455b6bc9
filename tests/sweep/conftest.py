import jax
import pytest

from jaxdp.data import load_dataset
from jaxdp.train import TrainConfig


@pytest.fixture(scope="session")
def digits():
  return load_dataset("digits")


@pytest.fixture(scope="session")
def base_config():
  return TrainConfig(l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=0.05, steps=30,
                     learning_rate=1.0, model="logreg")


@pytest.fixture(scope="session")
def two_devices():
  devices = jax.devices()
  assert len(devices) >= 2, "tests/conftest.py should expose two host devices"
  return devices[:2]
