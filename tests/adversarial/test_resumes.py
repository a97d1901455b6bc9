"""Adversarial resumes (issue 31): the same mechanism or nothing. A finished durable search or
sweep is rerun on its `run_dir` with one thing changed that decides what a candidate computes or
what is accounted (the DP score's sigma, the clipping path, the trainable set, the loss or what
it closes over, the optimizer, the model, C, a hyperparameter, the data, the public start): each
must be refused with `SearchMismatchError` naming the part, before anything trains; an identical
rerun resumes. The shared pools are filled by a backend that stores made-up results (no
compilation); one slow test trains for real.
"""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import ray

import jaxdp
from jaxdp import accounting as acc
from jaxdp.sweep import (CandidateStore, SearchMismatchError, TaskPlan, SearchSpace,
                         grid_candidates, run_sweep)
from jaxdp.train import CandidateResult, NoisyMean, Task, program
from jaxdp.train import loop_spec
from jaxdp.tuning import LocalTrainer, RunConfig, random_search
from tests.adversarial import mlp_task
from tests.adversarial.mlp_task import (N, VALIDATION, adam, correct, make_config, make_loss, sgd,
                                        sgd_momentum, MLP)


RESUME_GRID = {"learning_rate": [0.05, 0.2]}
K = acc.Fixed(2)
KEY = 7


def refusing(candidates, plan, **kwargs):
  raise AssertionError(f"trained {len(candidates)} candidate(s): the rerun should have been refused")


def _files(run_dir):
  """Every file of the pool and its bytes (the writer lock's holder pid aside)."""
  out = {}
  for root, _, names in os.walk(run_dir):
    for name in names:
      if name != ".writer.lock":
        path = os.path.join(root, name)
        with open(path, "rb") as f:
          out[os.path.relpath(path, run_dir)] = f.read()
  return out


def _resume_search(config, data, run_dir, trainer=None, devices=None):
  trainer = LocalTrainer(devices=devices) if trainer is None else trainer
  return random_search(config, RESUME_GRID, data, distribution=K, key=jax.random.key(KEY),
                       run_config=RunConfig(run_dir=run_dir, trainer=trainer))


def fake_trainer(trained: list):
  """A backend that trains nothing: it stores a made-up result per candidate, with parameters of
  the model's shapes (zeros). Refusals do not depend on how the stored results were made, and
  this keeps the tests here free of compilations; `test_a_real_search_...` trains for real."""
  def trainer(candidates, plan, *, on_chunk=None, keep_params=False, **kwargs):
    trained.extend(c.id for c in candidates)
    results = []
    for c in candidates:
      shapes = plan.run_of(c.config).params
      results.append(CandidateResult(
          score=0.5, test_score=0.5, test_loss=1.0, steps=4, planned_steps=4, epsilon=1.0,
          delta=1e-5, diverged=False, wall_time_s=0.0,
          params=jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes) if keep_params else None))
    if on_chunk is not None:
      on_chunk(list(zip(candidates, results)))
    return results
  return trainer


@pytest.fixture(scope="module")
def finished(data, tmp_path_factory):
  """One durable search run to completion: (run_dir, its result)."""
  run_dir = str(tmp_path_factory.mktemp("search"))
  trained = []
  result = _resume_search(make_config(), data, run_dir, trainer=fake_trainer(trained))
  assert result.unreleased.num_candidates == len(trained) == 2
  return run_dir, result


# --- The tuners ----------------------------------------------------------------------------------

CHANGES = {
    # The issue's example: a stored score computed with sigma = 1 released as if sigma were 100.
    "score-noise": (dict(sigma=100.0), "dp_events, programs"),
    "clipping": (dict(clipping="vmap"), "programs"),
    "trainable": (dict(trainable=lambda path: path.startswith("params/out/")), "programs"),
    "loss": (dict(loss=make_loss("squared")), "programs"),
    "loss-closure": (dict(loss=make_loss(weights=(1.0, 1.0, 2.0))), "programs"),
    "optimizer": (dict(optimizer=adam), "programs"),
    "model": (dict(activation="relu"), "programs"),
}


# Values a program reads only as traced inputs (C, a hyperparameter outside the grid): the
# configuration record, not the digest, tells them apart.
CONFIG_CHANGES = {
    "clip-norm": (dict(l2_clip_norm=10.0), {}),
    "fixed-hyperparameter": (dict(hparams={"learning_rate": 0.1, "momentum": 0.1}),
                             dict(optimizer=sgd_momentum)),
}


def _with_momentum(name):
  """The first run of a CONFIG_CHANGES case: its task, momentum 0.9 where it reads one."""
  _, task_changes = CONFIG_CHANGES[name]
  hparams = {"learning_rate": 0.1, "momentum": 0.9} if task_changes else {"learning_rate": 0.1}
  return make_config(dict(hparams=hparams), **task_changes)


@pytest.mark.parametrize("name", [pytest.param("clip-norm", marks=pytest.mark.slow),  # 3.5 s
                                  "fixed-hyperparameter"])
def test_a_changed_traced_value_is_refused(name, data, tmp_path):
  config_changes, task_changes = CONFIG_CHANGES[name]
  _resume_search(_with_momentum(name), data, str(tmp_path), trainer=fake_trainer([]))
  with pytest.raises(SearchMismatchError, match=r"differs in: configs\):\n  - hparams\.momentum: stored 0\.9, now 0\.1 \(at every grid point\)|differs in: configs\):\n  - l2_clip_norm: stored 1\.0, now 10\.0 \(at every grid point\)"):
    _resume_search(make_config(config_changes, **task_changes), data, str(tmp_path), trainer=refusing)
  sweep_dir = str(tmp_path / "sweep")
  first = grid_candidates(SearchSpace(_with_momentum(name), RESUME_GRID), seeds=[0])
  run_sweep(first, data, sweep_dir, SWEEP_FP, trainer=fake_trainer([]))
  with pytest.raises(SearchMismatchError, match=r"differs in: configs\)"):
    run_sweep(grid_candidates(SearchSpace(make_config(config_changes, **task_changes), RESUME_GRID), seeds=[0]),
              data, sweep_dir, SWEEP_FP, trainer=refusing)


def _host_correct(logit, batch):
  """A score read on the host (`jax.pure_callback`): what it computes is outside the trace."""
  values = correct(logit, batch)
  return jax.pure_callback(lambda v: np.asarray(v, np.float32), jax.ShapeDtypeStruct(values.shape, values.dtype),
                           values, vmap_method="sequential")


def test_a_program_calling_host_code_cannot_be_durable(data, tmp_path):
  # The digest cannot read a callback's behaviour: a durable run of it is refused up front.
  task = Task(model=MLP(), loss=make_loss(), optimizer=sgd, name="resume-mlp",
              score=NoisyMean(_host_correct, 0.0, 1.0, 1.0, num_examples=VALIDATION))
  config = make_config().replace(task=task)
  with pytest.raises(ValueError, match=r"calls host or foreign code \(pure_callback\)"):
    _resume_search(config, data, str(tmp_path), trainer=refusing)
  with pytest.raises(ValueError, match=r"calls host or foreign code \(pure_callback\)"):
    run_sweep(grid_candidates(SearchSpace(config, RESUME_GRID), seeds=[0]), data, str(tmp_path / "s"),
              SWEEP_FP, trainer=refusing)


@pytest.mark.parametrize("name", list(CHANGES))
def test_a_changed_mechanism_is_refused_before_anything_trains(name, finished, data):
  run_dir, _ = finished
  change, parts = CHANGES[name]
  before = _files(run_dir)
  with pytest.raises(SearchMismatchError,
                     match=rf"(?s)differs in: {parts}\):\n.*second search on the same data") as err:
    _resume_search(make_config(**change), data, run_dir, trainer=refusing)
  assert "(at every grid point)" in str(err.value)  # where it differs
  assert _files(run_dir) == before  # nothing trained, nothing written


def test_the_refusal_quotes_the_old_and_the_new_event(finished, data):
  run_dir, _ = finished
  with pytest.raises(SearchMismatchError) as err:
    _resume_search(make_config(sigma=100.0), data, run_dir, trainer=refusing)
  assert "GaussianDpEvent(noise_multiplier=1.0)" in str(err.value)
  assert "GaussianDpEvent(noise_multiplier=100.0)" in str(err.value)


def test_the_refusal_is_a_short_diff_of_public_values_only(finished, data):
  # Issue 45's example: `noise_multiplier: stored 1.0, now 2.5`, the event's change beside it,
  # under 800 characters, with the way out; no key digest, candidate id or program digest.
  run_dir, _ = finished
  with pytest.raises(SearchMismatchError) as err:
    _resume_search(make_config(dict(noise_multiplier=2.5)), data, run_dir, trainer=refusing)
  message = str(err.value)
  assert len(message) < 800, len(message)
  assert "\n  - noise_multiplier: stored 1.0, now 2.5 (at every grid point)\n" in message
  assert ("\n  - dp_event: stored ...GaussianDpEvent(noise_multiplier=1.0)..., now "
          "...GaussianDpEvent(noise_multiplier=2.5)... (at every grid point)\n") in message
  assert "new run_dir, or delete this one" in message
  manifest = json.loads(open(os.path.join(run_dir, "manifest.json")).read())
  ids = [json.loads(line)["id"] for line in open(os.path.join(run_dir, "results.jsonl"))]
  secrets = [manifest["key"], *manifest["jaxdp_mechanism"]["programs"].values(),
             manifest["jaxdp_data"]["sha256"], *ids]
  assert not [s for s in secrets if s[:12] in message]


def _assert_same_release(a, b):
  assert a.hyperparameters == b.hyperparameters and a.score == b.score
  assert a.epsilon == b.epsilon and a.event == b.event
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_an_identical_rerun_resumes_without_training(finished, data):
  run_dir, first = finished
  before = _files(run_dir)
  _assert_same_release(_resume_search(make_config(), data, run_dir, trainer=refusing), first)
  assert _files(run_dir) == before


@pytest.mark.slow  # a real search (compiled and trained): about 10 s on 2 cores
def test_a_real_search_resumes_bit_for_bit_and_refuses_the_issues_example(data, two_devices, tmp_path):
  first = _resume_search(make_config(), data, str(tmp_path), devices=two_devices)
  before = _files(tmp_path)
  again = _resume_search(make_config(), data, str(tmp_path), devices=two_devices, trainer=refusing)
  _assert_same_release(again, first)
  # NoisyMean(noise_multiplier=100) would release the score computed with sigma = 1 and
  # report the epsilon of sigma = 100.
  with pytest.raises(SearchMismatchError, match=r"differs in: dp_events, programs\)"):
    _resume_search(make_config(sigma=100.0), data, str(tmp_path), devices=two_devices, trainer=refusing)
  assert _files(tmp_path) == before


def _rewrite_records(run_dir, change):
  """Rewrites results.jsonl with `change(record)` applied, each line's checksum made valid again."""
  from jaxdp.sweep.pool import _lines  # pylint: disable=g-import-not-at-top
  path = os.path.join(run_dir, "results.jsonl")
  records = []
  with open(path, "rb") as f:
    for line in f.read().splitlines():
      record = json.loads(line)
      del record["sha256"]
      records.append(change(record))
  with open(path, "wb") as f:
    f.write(_lines(records))


def test_a_stored_record_of_another_event_is_refused_naming_it(finished, data, tmp_path):
  # Defence in depth: the manifest agrees, a record does not (written by something else).
  import shutil  # pylint: disable=g-import-not-at-top
  run_dir = str(tmp_path / "copy")
  shutil.copytree(finished[0], run_dir)
  victim = []

  def forge(record):
    if not victim:
      victim.append(record["id"])
      record["dp_event"] = record["dp_event"].replace("noise_multiplier=1.0)", "noise_multiplier=9.0)")
    return record
  _rewrite_records(run_dir, forge)
  # Named by its grid point, not its id (a hash of its key): ids stay out of messages (issue 42).
  with pytest.raises(SearchMismatchError, match=r"dp_event of a stored candidate; its grid point") as err:
    _resume_search(make_config(), data, run_dir, trainer=refusing)
  assert victim[0] not in str(err.value)


def test_a_stored_final_run_of_another_configuration_is_refused(data, tmp_path):
  # `train_lone` (the subsampled search's final model) checks its stored run too.
  config = make_config()
  plan = TaskPlan.build(SearchSpace(config, {"learning_rate": [0.1]}), data)
  (run,) = plan.runs
  zeros = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), run.params)
  ran = []

  def train():
    ran.append(1)
    return CandidateResult(score=0.5, test_score=0.5, test_loss=1.0, steps=4, planned_steps=4,
                           epsilon=1.0, delta=1e-5, diverged=False, wall_time_s=0.0, params=zeros)
  fingerprint = {"search": "final"}
  def planned(config):
    return run.derive(config, data)
  with CandidateStore(plan, run_dir=str(tmp_path), fingerprint=fingerprint) as store:
    store.train_lone("final", planned(config), train)
  with CandidateStore(plan, run_dir=str(tmp_path), fingerprint=fingerprint) as store:
    store.train_lone("final", planned(make_config()), train)  # identical: read back
    assert ran == [1] and store.resumed == 1
    with pytest.raises(SearchMismatchError, match="'final' run with another dp_event"):
      store.train_lone("final", planned(make_config(sigma=100.0)), train)
    with pytest.raises(SearchMismatchError, match=r"'final' run with another config "
                                                  r"\(config\.hparams\.learning_rate: stored 0\.1, now 0\.3\)"):
      store.train_lone("final", planned(config.replace(learning_rate=0.3)), train)
  assert ran == [1]


# --- The program digest --------------------------------------------------------------------------

def test_the_digest_reads_closed_over_values_not_only_the_jaxprs_text():
  from jaxdp.train.digest import jaxpr_digest  # pylint: disable=g-import-not-at-top
  def traced(weights):  # the constant sits in a jit inside a cond inside a while loop
    w = np.asarray(weights, np.float32)
    scaled = jax.jit(lambda x: x * jnp.sum(w))
    step = lambda x: jax.lax.cond(x > 0, scaled, lambda y: y, x)
    return jax.make_jaxpr(lambda x: jax.lax.while_loop(lambda c: c < 3, step, x))(jnp.float32(1.0))
  a, b = traced([1.0, 2.0]), traced([1.0, 3.0])
  assert str(a) == str(b)  # the text alone cannot tell them apart
  assert jaxpr_digest(a) != jaxpr_digest(b)
  assert jaxpr_digest(a) == jaxpr_digest(traced([1.0, 2.0]))


def test_the_digest_ignores_the_devices_microbatch_choice(data):
  from jaxdp.train.digest import program_digest  # pylint: disable=g-import-not-at-top
  config = make_config()
  spec = loop_spec.LoopSpec.from_config(config, data)
  other = dataclasses.replace(spec, padded_batch_size=spec.padded_batch_size * 3, microbatch_size=3)
  assert program_digest(other, data) == program_digest(spec, data)
  # A traced hyperparameter's value is the configuration's, not the program's.
  assert program_digest(loop_spec.LoopSpec.from_config(config.replace(learning_rate=3.0), data),
                        data) == program_digest(spec, data)


_DIGEST_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from tests.adversarial import mlp_task, test_resumes as t
    from jaxdp.sweep import SearchSpace, TaskPlan
    data = mlp_task.make_data()
    space = SearchSpace(mlp_task.make_config(), t.RESUME_GRID)
    print(json.dumps(TaskPlan.build(space, data).mechanism(), sort_keys=True))
""")


@pytest.mark.slow  # a second Python process: about 4 s
def test_the_mechanism_record_is_the_same_in_another_process(data, tmp_path):
  # Another process, with another string hash seed: no address, hash or dict order may enter.
  script = tmp_path / "digest.py"
  script.write_text(_DIGEST_SCRIPT)
  root = os.path.dirname(os.path.dirname(jaxdp.__file__))
  seed = "1" if os.environ.get("PYTHONHASHSEED") != "1" else "2"
  done = subprocess.run([sys.executable, str(script), root], capture_output=True, timeout=300,
                        env=dict(os.environ, PYTHONHASHSEED=seed))
  assert done.returncode == 0, done.stderr.decode()[-2000:]
  space = SearchSpace(make_config(), RESUME_GRID)
  here = json.loads(json.dumps(TaskPlan.build(space, data).mechanism()))
  assert json.loads(done.stdout) == here
  assert len(set(here["programs"].values())) == 1  # learning rates are traced: one program


# --- run_sweep (and the Ray backend, which only trains what run_sweep lets through) ---------------

def _candidates(grid=RESUME_GRID, seeds=(0,), **task_changes):
  return grid_candidates(SearchSpace(make_config(**task_changes), grid), seeds=list(seeds))


SWEEP_FP = {"sweep": "adversarial"}


@pytest.fixture(scope="module")
def swept(data, tmp_path_factory):
  """A finished `run_sweep` pool of two candidates: its run_dir."""
  run_dir = str(tmp_path_factory.mktemp("sweep"))
  trained = []
  run_sweep(_candidates(), data, run_dir, SWEEP_FP, trainer=fake_trainer(trained))
  assert len(trained) == 2
  return run_dir


@pytest.mark.parametrize("name", list(CHANGES))
def test_run_sweep_refuses_a_changed_mechanism(name, swept, data):
  before = _files(swept)
  change, parts = CHANGES[name]
  with pytest.raises(SearchMismatchError, match=rf"differs in: {parts}\)"):
    run_sweep(_candidates(**change), data, swept, SWEEP_FP, trainer=refusing)
  assert _files(swept) == before


def test_run_sweep_refuses_other_data_and_another_public_start(swept, data):
  before = _files(swept)
  rng = np.random.default_rng(1)
  w = rng.normal(size=6)
  for split in ("train", "private_validation"):
    other = dataclasses.replace(data, **{split: mlp_task.split(rng, N if split == "train" else VALIDATION, w)})
    with pytest.raises(SearchMismatchError, match=r"differs in: jaxdp_data\):\n  - jaxdp_data: other data"):
      run_sweep(_candidates(), other, swept, SWEEP_FP, trainer=refusing)
  spec = loop_spec.LoopSpec.from_config(make_config(), data)
  start = jax.tree.map(lambda s: np.ones(s.shape, s.dtype), program.param_shapes(spec, data.train))
  with pytest.raises(SearchMismatchError, match=r"differs in: jaxdp_initial_params\):\n  - jaxdp_initial_params: another public start"):
    run_sweep(_candidates(), data, swept, SWEEP_FP, trainer=refusing,
              initial_params=start)
  assert _files(swept) == before


def test_run_sweep_resumes_an_identical_sweep_without_training(swept, data):
  before = _files(swept)
  pool = run_sweep(_candidates(), data, swept, SWEEP_FP, trainer=refusing)
  assert pool.done_ids() == {c.id for c in _candidates()} and _files(swept) == before


def test_run_sweep_grows_by_points_and_seeds_of_the_same_mechanism(data, tmp_path, capsys):
  fp = SWEEP_FP
  trained = []
  run_sweep(_candidates(), data, tmp_path, fp, trainer=fake_trainer(trained))
  assert "resumed" not in capsys.readouterr().err  # a new pool: nothing to resume
  more = _candidates({"learning_rate": [0.05, 0.2, 0.8]}, seeds=(0, 1))
  pool = run_sweep(more, data, tmp_path, fp, trainer=fake_trainer(trained))
  assert len(trained) == 6 and pool.done_ids() == {c.id for c in more}
  # Issue 45: a rerun says what it read back of the (public, fixed) grid and what remains.
  assert (f"run_sweep: resumed 2 of 6 candidates from {tmp_path} (stored by an earlier run); "
          "training the other 4") in capsys.readouterr().err
  run_sweep(more, data, tmp_path, fp, trainer=refusing)
  assert "resumed 6 of 6 candidates from" in capsys.readouterr().err
  # The new point is recorded: changing its mechanism now is refused too.
  with pytest.raises(SearchMismatchError,
                     match=r"differs in: programs\):\n  - program: .* \(at grid point \{\"learning_rate\":0.8\}\)"):
    run_sweep(_candidates({"learning_rate": [0.8]}, optimizer=adam), data, tmp_path, fp,
              trainer=refusing)


def test_the_ray_backend_is_refused_on_the_driver_before_dispatching(swept, data):
  from jaxdp.sweep import RayTrainer  # pylint: disable=g-import-not-at-top
  assert not ray.is_initialized()
  with pytest.raises(SearchMismatchError, match="differs in: dp_events, programs"):
    run_sweep(_candidates(sigma=100.0), data, swept, SWEEP_FP, trainer=RayTrainer())
  assert not ray.is_initialized()  # refused before Ray was even started: nothing dispatched
