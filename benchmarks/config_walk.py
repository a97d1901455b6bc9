"""Where a search's configuration travels: the walk of `config` through jaxdp's modules.

Runs one durable `random_search(config, grid, data, ...,
run_config=RunConfig(run_dir=...))` (the MLP of docs/guides/tune_your_own_model.md on scikit-learn's
breast-cancer data) under `sys.setprofile` and
records every call of a jaxdp function that receives the configuration: a
`TrainConfig`, or an object holding one (a `SearchSpace`, a candidate, a plan,
a sequence of them) as an argument other than `self` (a method answering about
its own object is not the configuration travelling). Consecutive calls in one
file are one *stay*. A *climb*
is a step from a module to one in a higher import layer (train -> sweep ->
tuning); a *return* is a step into a file the walk already left. Also counts
what the call checks and derives: `check_data`, `check_initial_params` and
`LoopSpec.from_config` calls.

Prints JSON. Runs on any jaxdp revision with this public API:
`PYTHONPATH=<checkout> python benchmarks/config_walk.py`.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import jax
import numpy as np
import optax
import flax.linen as nn
from sklearn.datasets import load_breast_cancer

import jaxdp
from jaxdp import accounting as acc
from jaxdp.data import Dataset
from jaxdp.train import Task, TrainConfig
from jaxdp.tuning import RunConfig, random_search

#: Import layers, lowest first (a dependency points to a lower layer).
LAYERS = {"_validate": 0, "_cache": 0, "data": 0, "accounting": 1, "models": 1, "train": 2,
          "sweep": 3, "tuning": 4, "audit": 5, "experiments": 6}
ROOT = os.path.dirname(jaxdp.__file__)


class MLP(nn.Module):
  width: int

  @nn.compact
  def __call__(self, x):
    return nn.Dense(1)(nn.relu(nn.Dense(self.width)(x)))[:, 0]


def _holds_config(value, depth: int = 0) -> bool:
  if isinstance(value, TrainConfig):
    return True
  if depth > 1:
    return False
  if isinstance(value, (list, tuple)) and value:
    return _holds_config(value[0], depth + 1)
  return any(isinstance(getattr(value, name, None), (TrainConfig, tuple, list)) and
             _holds_config(getattr(value, name), depth + 1)
             for name in ("config", "configs", "base", "runs") if hasattr(type(value), name)
             or name in getattr(value, "__dict__", {}))


def _module(path: str) -> str:
  return os.path.relpath(path, os.path.dirname(ROOT)).replace(os.sep, "/")


def _layer(module: str) -> int:
  parts = module.split("/")
  name = parts[1] if len(parts) > 2 else parts[1].removesuffix(".py")
  return LAYERS.get(name, 0)


def main() -> None:
  x, y = load_breast_cancer(return_X_y=True)
  order = np.random.default_rng(0).permutation(len(y))
  train, test = order[:400], order[400:]
  x = ((x - x[test].mean(0)) / x[test].std(0)).astype(np.float32)
  y = y.astype(np.float32)
  data = Dataset(train={"x": x[train], "y": y[train]}, test={"x": x[test], "y": y[test]},
                 num_examples=400)
  task = Task(model=lambda hp: MLP(width=hp["width"]),
              loss=lambda logit, b: optax.sigmoid_binary_cross_entropy(logit, b["y"]),
              score=lambda logit, b: jax.numpy.mean((logit > 0) == (b["y"] > 0.5)),
              optimizer=lambda hp: optax.adam(hp["learning_rate"]))
  config = TrainConfig(task=task, l2_clip_norm=1.0, noise_multiplier=1.0, batch_size=64, epochs=1,
                       hparams={"learning_rate": 1e-2, "width": 16})
  grid = {"learning_rate": [3e-3, 1e-2], "width": [8, 32]}
  walk, counts = [], {"check_data": 0, "check_initial_params": 0, "LoopSpec.from_config": 0}

  def profile(frame, event, arg):
    if event != "call":
      return
    code = frame.f_code
    if not code.co_filename.startswith(ROOT):
      return
    name = code.co_name
    if name in ("check_data", "check_initial_params"):
      counts[name] += 1
    # `LoopSpec` lived in train/program.py before it moved to train/loop_spec.py.
    if name == "from_config" and os.path.basename(code.co_filename) in ("program.py", "loop_spec.py"):
      counts["LoopSpec.from_config"] += 1
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    # A method of an object answering about itself (config.num_steps_for, candidate.id) is not
    # the configuration travelling: only arguments other than `self` count.
    args = [frame.f_locals.get(n) for n in names if n not in ("self", "cls")]
    if any(_holds_config(v) for v in args):
      walk.append(_module(code.co_filename))

  with tempfile.TemporaryDirectory() as run_dir:
    sys.setprofile(profile)
    try:
      random_search(config, grid, data, distribution=acc.Poisson(mean=2), key=jax.random.key(1),
                    run_config=RunConfig(run_dir=run_dir), initial_params=None)
    finally:
      sys.setprofile(None)
  stays = [m for i, m in enumerate(walk) if i == 0 or walk[i - 1] != m]
  climbs = sum(_layer(b) > _layer(a) for a, b in zip(stays, stays[1:]))
  returns = sum(m in stays[:i - 1] for i, m in enumerate(stays) if i > 0)
  # The way down: from the call to the first entry into the engine (the compiled step).
  down = stays[:next((i for i, m in enumerate(stays) if m.endswith("sweep/engine.py")), len(stays))]
  down_returns = sum(m in down[:i - 1] for i, m in enumerate(down) if i > 0)
  print(json.dumps({"jaxdp": jaxdp.__file__, "calls": len(walk), "stays": len(stays),
                    "files": len(set(stays)), "climbs": climbs, "returns": returns,
                    "down": {"stays": len(down), "files": len(set(down)), "returns": down_returns},
                    "per_call_checks": counts, "walk": stays}, indent=1))


if __name__ == "__main__":
  main()
