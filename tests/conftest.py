"""Test-session set-up shared by all tests."""

import os

import pytest

# Two host CPU devices, so the sweep engine's sharded path runs on CPU too. XLA
# reads the flag when JAX initialises, which happens after this file is imported.
_FLAG = "--xla_force_host_platform_device_count=2"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()


@pytest.fixture(scope="session")
def digits():
  """scikit-learn's 8x8 digits (offline): 1,437 train / 360 test."""
  from jaxdp.data import load_dataset  # pylint: disable=g-import-not-at-top
  return load_dataset("digits")


@pytest.fixture(scope="session")
def base_config():
  """A DP logistic regression that trains in about a second."""
  from jaxdp.train import TrainConfig  # pylint: disable=g-import-not-at-top
  return TrainConfig(l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=0.05, steps=30,
                     learning_rate=1.0, model="logreg")


@pytest.fixture(scope="session")
def two_devices():
  import jax  # pylint: disable=g-import-not-at-top
  devices = jax.devices()
  assert len(devices) >= 2, "tests/conftest.py should expose two host devices"
  return devices[:2]
