"""The Ray trainer (`jaxdp.sweep.trainers.RayTrainer`, `jaxdp.sweep.ray_backend`) fills the same
pool as the local one, against a local Ray instance."""


import pytest

from jaxdp.sweep import (LocalTrainer, RayTrainer, SearchSpace, TaskPlan, engine, grid_candidates,
                         run_sweep)
from jaxdp.tuning import RunConfig, TrainFunction

ray = pytest.importorskip("ray", reason="the Ray backend is optional: pip install 'jaxdp[ray]'")

# Starting Ray costs about 20 s: `make test-slow` (and CI) run this module.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray():
  # Workers train on one host device each; the flag is inherited through the environment.
  ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
           runtime_env={"env_vars": {"XLA_FLAGS": "--xla_force_host_platform_device_count=1"}})
  yield
  ray.shutdown()


def test_ray_backend_matches_local_engine_and_resumes(local_ray, tmp_path, digits, base_config):
  cands = grid_candidates(SearchSpace(base_config, {"learning_rate": [0.5, 1.0, 2.0]}), seeds=[0, 1])
  fp = {"ray": True}
  # First a partial local sweep, then the Ray backend completes the same pool.
  run_sweep(cands[:2], digits, tmp_path, fp)
  pool = run_sweep(cands, digits, tmp_path, fp, trainer=RayTrainer(chunk_size=2))
  assert pool.done_ids() == {c.id for c in cands}
  by_id = {r["id"]: r for r in pool.records}
  local = engine.train_candidates(cands, digits)
  for c, res in zip(cands, local):
    assert by_id[c.id]["test_score"] == pytest.approx(res.test_score, abs=1e-6)
    assert by_id[c.id]["epsilon"] == res.epsilon


def test_bad_options_fail_when_the_trainer_is_built():
  with pytest.raises(ValueError, match="chunk_size"):
    RayTrainer(chunk_size=0)
  with pytest.raises(ValueError, match="local.devices names this process's jax devices"):
    import jax  # pylint: disable=g-import-not-at-top
    RayTrainer(local=LocalTrainer(devices=jax.devices()))


def test_a_worker_compiles_a_search_once(local_ray, digits, base_config):
  # The candidates travel once per call; each worker deserialises them once, so its
  # chunks share the `Task` objects, hence one compiled program per worker (two
  # workers here), not one per chunk.
  cands = grid_candidates(SearchSpace(base_config.replace(steps=7), {"learning_rate": [0.5, 1.0, 2.0]}),
                          seeds=[0, 1])
  results = RayTrainer(chunk_size=1)(cands, TaskPlan.for_candidates(cands, digits))
  compiled = [r for r in results if r.compile_time_s > 0]
  assert 1 <= len(compiled) <= 2, [r.compile_time_s for r in results]



def test_a_training_function_runs_on_ray_with_the_local_release(local_ray, tmp_path):
  """`trainer=` ships a training function to the workers (by value here: the workers need not
  import the example's module) and releases what the local search releases."""
  import cloudpickle  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from examples import dp_logistic_regression as ex  # pylint: disable=g-import-not-at-top
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  from jaxdp.tuning import random_search  # pylint: disable=g-import-not-at-top

  cloudpickle.register_pickle_by_value(ex)
  try:
    args = dict(distribution=acc.Poisson(mean=4), key=jax.random.key(5))
    grid = dict(ex.GRID, noise_multiplier=[4.0])
    function = TrainFunction(ex.train_fn, ex.dp_event)
    local = random_search(function, grid, **args)
    remote = random_search(function, grid, **args, run_config=RunConfig(
        run_dir=str(tmp_path), trainer=RayTrainer(chunk_size=2)))
  finally:
    cloudpickle.unregister_pickle_by_value(ex)
  assert (remote.hyperparameters, remote.unreleased.seed, remote.unreleased.num_candidates, remote.epsilon) == \
      (local.hyperparameters, local.unreleased.seed, local.unreleased.num_candidates, local.epsilon)
  # Another process on this machine: the same NumPy kernels, so the same bits but for round-off
  # a BLAS thread split could change (a tolerance, not exactness, across processes).
  assert remote.score == pytest.approx(local.score, abs=1e-12)
  np.testing.assert_allclose(remote.params["w"], local.params["w"], rtol=1e-10)


_FORK_SCRIPT = """
import subprocess, sys
sys.path.insert(0, sys.argv[1])
import jax, jax.numpy as jnp
jnp.ones(3).block_until_ready()  # JAX's threads run, and its at-fork hook is installed
from examples import dp_logistic_regression as ex
from jaxdp import accounting as acc
from jaxdp.tuning import RayTrainer, RunConfig, TrainFunction, random_search

def train_fn(hparams, seed):
  return 0.5, None

res = random_search(TrainFunction(train_fn, ex.dp_event), dict(ex.GRID, noise_multiplier=[1.0]),
                    distribution=acc.Fixed(2), key=jax.random.key(0),
                    run_config=RunConfig(trainer=RayTrainer(num_cpus=1)))
assert res.hyperparameters is not None
print("CONTROL", file=sys.stderr, flush=True)
subprocess.run(["true"], preexec_fn=lambda: None, check=True)  # the hook fires outside Ray
"""


def test_starting_ray_shows_no_fork_warning(tmp_path):
  # Issue 45: Ray's processes are started by fork + exec (subprocess with a preexec_fn), which
  # fires JAX's "os.fork() ... will likely lead to a deadlock" warning: a false alarm that
  # `ray_backend` filters where it starts Ray. A fresh process: Ray is started there by jaxdp.
  import os  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  script = tmp_path / "fork.py"
  script.write_text(_FORK_SCRIPT)
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  done = subprocess.run([sys.executable, "-W", "always", str(script), root], capture_output=True,
                        text=True, timeout=300, env=dict(os.environ, RAY_ADDRESS=""))
  assert done.returncode == 0, done.stderr[-3000:]
  before, control = done.stderr.split("CONTROL\n")
  assert "os.fork()" not in before, before[-3000:]
  assert "os.fork() was called" in control  # the warning is live: the filter is Ray's only
