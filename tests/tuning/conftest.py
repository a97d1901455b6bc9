"""Fixtures for the tuner tests."""

import pytest

from jaxdp import accounting as acc
from jaxdp.sweep import engine
from jaxdp.tuning import subsampled


class WorkStarted(AssertionError):
  """A tuner drew K or trained before it had checked all of its arguments."""


@pytest.fixture
def no_work(monkeypatch):
  """Makes drawing K (any distribution) or any training raise `WorkStarted`.

  With it, a ValueError from a tuner proves the argument was rejected before
  K was drawn and before any training, whatever K would have been.
  """
  def started(what):
    def fail(*args, **kwargs):
      raise WorkStarted(f"{what} before every argument was checked")
    return fail
  stack = [acc.KDistribution]
  while stack:  # every distribution class, however deep
    cls = stack.pop()
    stack.extend(cls.__subclasses__())
    if "sample" in vars(cls):
      monkeypatch.setattr(cls, "sample", started("K drawn"))
  monkeypatch.setattr(engine, "train_candidates", started("candidates trained"))
  monkeypatch.setattr(subsampled, "train_candidate", started("final model trained"))
  monkeypatch.setattr(subsampled.jax.random, "bernoulli", started("subset drawn"))
