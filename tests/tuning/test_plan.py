"""One `SearchPlan` per call: everything checked and derived once, read by everything below.

Counted on the user MLP (tests/conftest.py): a grid of 2 widths x 2
learning rates is 4 configurations of 2 programs.
"""

import inspect
import os
import pickle

import cloudpickle
import jax
import numpy as np
import pytest

from jaxdp import accounting as acc
from jaxdp.sweep import (Candidate, CandidateStore, SearchMismatchError, TaskPlan, SearchSpace,
                         engine, grid_candidates, run_sweep)
from jaxdp.train import CandidateResult, NoisyMean, checks, program
from jaxdp.train import loop_spec
from jaxdp.tuning import (dry_run, LocalTrainer, random_search, RunConfig, subsampled_search,
                          SubsetTuning, threshold_search)
from tests.conftest import USER_N, make_user_task, user_correct

GRID = {"width": [4, 8], "learning_rate": [0.03, 0.1]}
REPS = acc.Poisson(mean=3)


@pytest.fixture
def counted(monkeypatch):
  """Counts the checks of data and initial parameters, the programs' shape checks and the
  specs derived, in this process."""
  counts = {"check_data": 0, "check_program": 0, "check_initial_params": 0, "from_config": 0}

  def counting(name, fn):
    def wrapped(*args, **kwargs):
      counts[name] += 1
      return fn(*args, **kwargs)
    return wrapped
  for name in ("check_data", "check_program", "check_initial_params"):
    monkeypatch.setattr(checks, name, counting(name, getattr(checks, name)))
  from_config = loop_spec.LoopSpec.from_config.__func__
  monkeypatch.setattr(loop_spec.LoopSpec, "from_config",
                      classmethod(counting("from_config", from_config)))
  return counts


def _public_start(user_config, user_data, width):
  config = user_config.replace(width=width)
  spec = loop_spec.LoopSpec.from_config(config, user_data)
  shapes = program.param_shapes(spec, user_data.train)
  bias = shapes["params"]["out"]["bias"]  # the same in every width: it fits every model
  return {"params": {"out": {"bias": np.full(bias.shape, 0.01, bias.dtype)}}}


@pytest.mark.slow  # suite budget (tests/benchmarks counts the checks of a durable search too)
def test_a_durable_search_checks_its_data_and_initial_params_once(user_config, user_data, counted,
                                                                   tmp_path, two_devices):
  start = _public_start(user_config, user_data, 4)
  counted.update(dict.fromkeys(counted, 0))
  result = random_search(user_config, GRID, user_data, distribution=REPS, key=jax.random.key(3),
                         run_config=RunConfig(run_dir=str(tmp_path),
                                              trainer=LocalTrainer(devices=two_devices)),
                                              initial_params=start)
  assert result.unreleased.num_candidates >= 1
  # Data once (one task), each of the 2 programs once, the public start once per model,
  # one spec per configuration: nothing below the plan derives or checks again.
  assert counted == {"check_data": 1, "check_program": 2, "check_initial_params": 2,
                     "from_config": 4}


@pytest.mark.slow  # 4 candidates compiled and trained: about 10 s
def test_a_plan_is_read_by_the_engine_without_checking_again(user_config, user_data, counted,
                                                             two_devices):
  space = SearchSpace(user_config, GRID)
  plan = TaskPlan.build(space, user_data)
  assert counted == {"check_data": 1, "check_program": 2, "check_initial_params": 0,
                     "from_config": 4}
  cands = grid_candidates(space, [0])
  results = engine.train_candidates(cands, plan, devices=two_devices)
  assert len(results) == 4 and counted["check_data"] == 1 and counted["from_config"] == 4
  # Each result is accounted from its run's plan.
  assert [r.epsilon for r in results] == [plan.run_of(c.config).epsilon for c in cands]
  with pytest.raises(ValueError, match="not one of this TaskPlan's"):
    engine.train_candidates(grid_candidates(SearchSpace(user_config.replace(l2_clip_norm=2.0), GRID),
                                            [0]), plan)
  with pytest.raises(ValueError, match="initial_params is part of the TaskPlan"):
    engine.train_candidates(cands, plan, initial_params={"params": {}})


def test_a_plan_survives_pickling_to_a_worker(user_config, user_data):
  # The Ray backend ships (candidates, plan) in one object: the plan's index of configurations
  # must be rebuilt in the worker, where the objects have other ids.
  space = SearchSpace(user_config, GRID)
  plan = TaskPlan.build(space, user_data)
  plan.run_of(space.configs[0])  # builds the index here
  cands, shipped = pickle.loads(cloudpickle.dumps((grid_candidates(space, [0]), plan)))
  for c, run, here in zip(cands, shipped.runs, plan.runs):
    assert shipped.run_of(c.config) is run and run.config is c.config
    assert run.spec.static_hparams == here.spec.static_hparams
  assert "_by_config" not in cloudpickle.loads(cloudpickle.dumps(plan)).__dict__


def test_dry_run_takes_every_argument_random_search_takes(user_config, user_data, tmp_path,
                                                          no_work):
  search = inspect.signature(random_search).parameters
  dry = inspect.signature(dry_run).parameters
  assert set(search) <= set(dry)
  # ... and checks them the same way, before any work.
  with pytest.raises(ValueError, match="initial_params leaf 'params/out/kernel' has shape"):
    dry_run(user_config, GRID, user_data, distribution=REPS,
            initial_params={"params": {"out": {"kernel": np.zeros((3, 1), np.float32)}}})
  with pytest.raises(ValueError, match="trainer must be None, a jaxdp.sweep.LocalTrainer or RayTrainer"):
    dry_run(user_config, GRID, user_data, distribution=REPS, run_config=RunConfig(trainer=3))
  with pytest.raises(ValueError, match="max_candidates_per_device must be an integer"):
    dry_run(user_config, GRID, user_data, distribution=REPS,
            run_config=RunConfig(trainer=LocalTrainer(max_candidates_per_device=0)))
  with pytest.raises(ValueError, match="key must be a typed PRNG key"):
    dry_run(user_config, GRID, user_data, distribution=REPS, key=0)
  # The exact call of a durable search, with its public start: nothing is written.
  run_dir = tmp_path / "search"
  report = dry_run(user_config, GRID, user_data, distribution=REPS, key=jax.random.key(3),
                   run_config=RunConfig(run_dir=str(run_dir), trainer=LocalTrainer(progress=True)),
                   initial_params=_public_start(user_config, user_data, 8),
                   )
  assert not run_dir.exists()
  assert len(report.groups) == 2 and report.epsilon == pytest.approx(
      acc.epsilon(acc.RepeatAndSelect(user_config.dp_event(user_data.num_examples), REPS), 1e-5))
  assert "clipping params/hidden/kernel: ghost" in report.format(verbose=True)
  # The public start holds the output bias only: named by module, in every group's summary.
  assert str(report).count("    initial_params: 1 of 4 leaves: some of out; none of hidden\n") == 2


@pytest.mark.slow  # three searches trained: about 13 s
def test_every_tuner_reports_what_a_resume_did(user_config, user_data, tmp_path, two_devices,
                                               capsys):
  calls = []

  def counting(todo, plan, **kw):
    calls.append(len(todo))
    return LocalTrainer(progress=True)(todo, plan, **kw)
  kwargs = dict(distribution=acc.Fixed(4), key=jax.random.key(5),
                run_config=RunConfig(run_dir=str(tmp_path / "rs"), trainer=counting))
  first = random_search(user_config, GRID, user_data, **kwargs)
  distinct = calls[0]
  assert first.unreleased.resumed == 0 and distinct >= 2
  again = random_search(user_config, GRID, user_data, **kwargs)
  assert calls == [distinct] and again.unreleased.resumed == distinct
  assert again.hyperparameters == first.hyperparameters and again.score == first.score
  # The line says that it resumed, not how many: the count of candidates is K (issue 42).
  err = capsys.readouterr().err
  assert "this search ran here before: what it stored was read back" in err
  assert str(distinct) not in err.replace(str(tmp_path), "")
  fresh = random_search(user_config, GRID, user_data, distribution=acc.Fixed(4), key=jax.random.key(5),
                        run_config=RunConfig(trainer=LocalTrainer(devices=two_devices)))
  assert fresh.unreleased.resumed == 0 and fresh.score == first.score
  # Liu-Talwar trains one candidate per call of the store; a rerun reads each back.
  calls.clear()
  threshold = dict(threshold=2.0, distribution=acc.Geometric(gamma=0.3), key=jax.random.key(1),
                   run_config=RunConfig(run_dir=str(tmp_path / "ts"), trainer=counting),
                   )
  one = threshold_search(user_config, GRID, user_data, **threshold)
  trained = len(calls)  # distinct candidates (a repeated draw is read back, not trained)
  two = threshold_search(user_config, GRID, user_data, **threshold)
  assert len(calls) == trained >= 1 and one.unreleased.resumed == 0 and two.unreleased.resumed == trained
  assert two.unreleased.num_candidates == one.unreleased.num_candidates >= trained


# --- What an adversarial review of the plan found (each failed before its fix) -------------------

def _fake_trainer(log: list):
  """Trains nothing: stores a made-up result per candidate with zero parameters of its run's
  shapes (the refusals below do not depend on how results were made)."""
  def trainer(candidates, plan, *, on_chunk=None, keep_params=False, **kwargs):
    results = []
    for c in candidates:
      run = plan.run_of(c.config)
      log.append(c.id)
      results.append(CandidateResult(
          score=0.5, test_score=0.5, test_loss=1.0, steps=run.spec.num_steps,
          planned_steps=run.spec.num_steps, epsilon=run.epsilon, delta=1e-5, diverged=False,
          wall_time_s=0.0,
          params=jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), run.params) if keep_params else None))
    if on_chunk is not None:
      on_chunk(list(zip(candidates, results)))
    return results
  return trainer


def _sgd_config(user_config, **changes):
  return user_config.replace(batch_size=None, sampling_prob=0.1, **changes)


def test_a_dp_score_swapped_in_by_derive_is_refused_by_the_subsampled_search(user_config, user_data,
                                                                             no_work):
  # KK's amplification covers the training set only: a NoisyMean reads the validation split,
  # which is never subsampled. Every configuration's task is checked, not only the base's.
  noisy = make_user_task(score=NoisyMean(user_correct, 0.0, 1.0, noise_multiplier=5.0,
                                         num_examples=100), name="noisy")
  space = SearchSpace(_sgd_config(user_config), {"learning_rate": [0.03, 0.1]},
                      derive=lambda c: c.replace(task=noisy))
  with pytest.raises(ValueError, match="does not support DP scores on private validation data"):
    subsampled_search(space, None, user_data, subset=SubsetTuning(0.5, 1), distribution=REPS,
                      key=jax.random.key(0))


def test_a_calibrated_sigma_that_a_derive_overrides_is_refused(user_config, user_data, no_work):
  space = SearchSpace(user_config, {"learning_rate": [0.03, 0.1]},
                      derive=lambda c: c.replace(noise_multiplier=3.0 if c.value("learning_rate") > 0.05
                                                 else 0.6))
  with pytest.raises(ValueError, match=r"target_epsilon calibrated noise_multiplier=.* run with \[0.6, 3.0\]"):
    random_search(space, None, user_data, distribution=REPS, key=jax.random.key(0), target_epsilon=50.0)


def test_a_plan_moved_to_another_noise_never_keeps_a_stale_event(user_config, user_data):
  # A plan holds no accounted event or epsilon (the tuner accounts its runs' events); a plan
  # moved to a calibrated sigma carries the events of what will run.
  space = SearchSpace(user_config, {"learning_rate": [0.03, 0.1]})
  plan = TaskPlan.build(space, user_data)
  assert not hasattr(plan, "event") and not hasattr(plan, "epsilon")
  moved = plan.with_noise(0.5)
  assert [r.config.noise_multiplier for r in moved.runs] == [0.5, 0.5]
  assert [r.dp_event for r in moved.runs] == [user_config.replace(noise_multiplier=0.5).dp_event(USER_N)] * 2
  assert [r.dp_event for r in plan.runs] == [user_config.dp_event(USER_N)] * 2  # the original kept
  with pytest.raises(ValueError,
                     match="a calibrated noise_multiplier needs a plan of a grid that does not vary"):
    TaskPlan.build(SearchSpace(user_config, {"noise_multiplier": [0.5, 1.0]}), user_data).with_noise(0.7)
  # batch_size b: q = b / N, so other rows declared with another N would change the DpEvent.
  subset = user_data.with_train_rows(np.arange(USER_N) < 50, num_examples=50, name="subset")
  with pytest.raises(ValueError, match="on_rows would change a run's DpEvent"):
    plan.on_rows(subset)


def test_a_store_always_fingerprints_its_data(user_config, user_data, tmp_path):
  # Without a caller's fingerprint, the plan's data digest still guards the run directory.
  space = SearchSpace(_sgd_config(user_config), {"learning_rate": [0.03, 0.1]})
  cands = grid_candidates(space, [0])
  log = []
  with CandidateStore(TaskPlan.build(space, user_data), run_dir=str(tmp_path),
                      trainer=_fake_trainer(log)) as store:
    store.train(cands)
  other = user_data.with_train_rows(np.arange(USER_N) >= 1, num_examples=USER_N, name="other")  # a row deleted
  with pytest.raises(SearchMismatchError, match="jaxdp_data"):
    CandidateStore(TaskPlan.build(space, other), run_dir=str(tmp_path), trainer=_fake_trainer(log))
  assert len(log) == 2


@pytest.mark.slow  # two stored searches: about 3 s
def test_the_prng_implementation_is_part_of_the_fingerprint(user_config, user_data, tmp_path):
  kwargs = dict(distribution=acc.Fixed(2), run_config=RunConfig(run_dir=str(tmp_path),
                                                                trainer=_fake_trainer([])))
  random_search(user_config, GRID, user_data, key=jax.random.key(0, impl="rbg"), **kwargs)
  # The same raw bits, another draw: the key's digest covers its implementation, and the message
  # shows neither (a seed's digest is found by trying seeds).
  with pytest.raises(SearchMismatchError, match=r"key: another PRNG key \(its digest is not shown\)"):
    random_search(user_config, GRID, user_data, key=jax.random.key(0, impl="unsafe_rbg"), **kwargs)


def test_points_and_configurations_stay_paired(user_config, user_data, tmp_path):
  # A derive returning one object for several points is one configuration at each of them.
  shared = _sgd_config(user_config, learning_rate=0.05)
  space = SearchSpace(user_config, {"weight_decay": [1e-4, 1e-3]}, derive=lambda c: shared)
  cands = grid_candidates(space, [0, 1])
  log = []
  pool = run_sweep(cands, user_data, str(tmp_path / "a"), {"sweep": 1},
                   trainer=_fake_trainer(log))
  assert len(pool.records) == 4 and len(log) == 4
  # Two different configurations at one grid point: one mechanism per point is recorded.
  other = [Candidate(c.point, shared.replace(noise_multiplier=5.0), 2) for c in cands[:1]]
  with pytest.raises(ValueError, match="carry two different configurations"):
    TaskPlan.for_candidates(cands + other, user_data)
  # A candidate labelled with one point but carrying another point's configuration.
  space = SearchSpace(user_config, GRID)
  plan = TaskPlan.build(space, user_data)
  with pytest.raises(ValueError, match="carries another point's configuration"):
    plan.check_candidates([Candidate(space.points[0], space.configs[1], 0)])


def test_an_extrapolation_the_public_start_does_not_fit_fails_before_any_work(user_config, user_data,
                                                                               no_work):
  # The final run is planned for every grid point before anything is drawn: a task whose
  # extrapolation changes the model's width cannot start from the checked public start.
  task = make_user_task(extrapolate=lambda hp, m, n: dict(hp, width=16), name="widen")
  config = _sgd_config(user_config).replace(task=task)
  spec = loop_spec.LoopSpec.from_config(config, user_data)
  start = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), program.param_shapes(spec, user_data.train))
  with pytest.raises(ValueError, match="initial_params leaf 'params/hidden/bias' has shape"):
    subsampled_search(config, {"learning_rate": [0.03, 0.1]}, user_data, subset=SubsetTuning(0.5, 1),
                      distribution=REPS, key=jax.random.key(0), initial_params=start)


def test_resumed_never_counts_what_was_trained_again(user_config, user_data, tmp_path):
  space = SearchSpace(_sgd_config(user_config), {"learning_rate": [0.03, 0.1]})
  cands = grid_candidates(space, [0])
  log = []
  plan = TaskPlan.build(space, user_data)
  with CandidateStore(plan, run_dir=str(tmp_path), trainer=_fake_trainer(log)) as store:
    store.train(cands)
  for name in os.listdir(tmp_path / "params"):  # every parameter file damaged
    (tmp_path / "params" / name).write_bytes(b"damaged")
  with pytest.warns(UserWarning, match="trained again"):
    with CandidateStore(plan, run_dir=str(tmp_path), trainer=_fake_trainer(log)) as store:
      store.train(cands)
      assert store.resumed == 0 and len(log) == 4


@pytest.mark.slow  # a search stored and three dry runs, each tracing the programs: about 5 s
def test_dry_run_refuses_the_run_dir_the_search_would_refuse(user_config, user_data, tmp_path):
  kwargs = dict(distribution=acc.Fixed(2), run_config=RunConfig(run_dir=str(tmp_path / "s"),
                                                                trainer=_fake_trainer([])))
  random_search(user_config, GRID, user_data, key=jax.random.key(0), **kwargs)
  before = sorted(os.listdir(tmp_path / "s"))
  dry_run(user_config, GRID, user_data, key=jax.random.key(0), **kwargs)  # the same search: fine
  with pytest.raises(SearchMismatchError, match="differs in: key"):
    dry_run(user_config, GRID, user_data, key=jax.random.key(1), **kwargs)
  assert sorted(os.listdir(tmp_path / "s")) == before
  (tmp_path / "file").write_text("")
  with pytest.raises(ValueError, match="is not a directory"):
    dry_run(user_config, GRID, user_data, distribution=REPS,
            run_config=RunConfig(run_dir=str(tmp_path / "file")))


def test_a_layout_or_run_dir_the_search_cannot_use_fails_before_any_draw(user_config, user_data,
                                                                         tmp_path, two_devices,
                                                                         no_work):
  # Whether the call fails must not depend on K or on the subset drawn.
  three = user_config.replace(execution=user_config.execution.__class__(data_parallel=3))
  with pytest.raises(ValueError, match=r"data_parallel must be an integer in \[1, 2\]"):
    random_search(three, GRID, user_data, distribution=REPS, key=jax.random.key(0),
                  run_config=RunConfig(trainer=LocalTrainer(devices=two_devices)))
  sgd = _sgd_config(user_config)
  kwargs = dict(subset=SubsetTuning(0.5, 1), distribution=acc.Fixed(1),
                run_config=RunConfig(run_dir=str(tmp_path)))
  (tmp_path / "manifest.json").write_text('{"jaxdp_pool": {"format": 4}, "tuner": "other"}')
  with pytest.raises(SearchMismatchError, match="holds a different sweep"):
    subsampled_search(sgd, {"learning_rate": [0.03]}, user_data, key=jax.random.key(0), **kwargs)


@pytest.mark.slow  # suite budget
def test_a_new_search_may_start_in_an_existing_empty_run_dir(user_config, user_data, tmp_path,
                                                             two_devices):
  # What a dry run and the subsampled search check before drawing: only a pool is compared.
  assert os.path.isdir(tmp_path) and not os.listdir(tmp_path)
  dry_run(user_config, GRID, user_data, distribution=REPS, run_config=RunConfig(run_dir=str(tmp_path)))
  res = subsampled_search(_sgd_config(user_config), {"learning_rate": [0.03]}, user_data,
                          subset=SubsetTuning(0.5, 1),
                          distribution=acc.Fixed(1), key=jax.random.key(0),
                          run_config=RunConfig(run_dir=str(tmp_path), trainer=_fake_trainer([])))
  assert res.unreleased.resumed == 0 and os.path.exists(tmp_path / "manifest.json")
