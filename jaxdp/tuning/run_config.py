"""How a search runs, apart from what it is: where it keeps its candidates and what trains them."""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

from jaxdp.sweep.trainers import LocalTrainer, Trainer, default_trainer


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """How a search runs (as Ray Tune's `RunConfig`): the tuners' `run_config=`.

  Nothing here changes what a search releases: a search run with another trainer, or resumed
  from its `run_dir`, releases what an uninterrupted local run releases.

  Args:
    run_dir: None, or a directory that keeps every finished candidate
      (`jaxdp.sweep.CandidateStore`): rerun the same call after a crash and it trains only what
      is missing. It holds unreleased candidates: trust it like code and keep it as secret as
      the data (docs/guides/privacy.md).
    trainer: what trains the candidates: `jaxdp.sweep.LocalTrainer(devices=..., progress=...)`
      (the default, `LocalTrainer()`) or `jaxdp.sweep.RayTrainer(chunk_size=...)` for a Ray
      cluster.

  Raises:
    ValueError: `run_dir` is not a path, or `trainer` is not a trainer.
  """
  run_dir: Optional[str] = None
  trainer: Trainer = LocalTrainer()

  def __post_init__(self):
    if self.run_dir is not None:
      if not isinstance(self.run_dir, (str, os.PathLike)) or not os.fspath(self.run_dir):
        raise ValueError(f"run_dir must be None or a directory path (str or os.PathLike), got "
                         f"{self.run_dir!r}")
      object.__setattr__(self, "run_dir", os.fspath(self.run_dir))
    object.__setattr__(self, "trainer", default_trainer(self.trainer))


def run_config(value: Optional[RunConfig]) -> RunConfig:
  """A tuner's `run_config` argument, checked (None: `RunConfig()`)."""
  if value is None:
    return RunConfig()
  if not isinstance(value, RunConfig):
    raise ValueError(f"run_config must be None or a jaxdp.tuning.RunConfig, got {value!r:.200}")
  return value
