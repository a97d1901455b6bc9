"""The search-plan contract (`jaxdp.sweep.plan.SearchPlan`), run over both plans: a task's
(`TaskPlan`) and a training function's (`FunctionPlan`).

As dp_accounting's `PrivacyAccountantTest` runs one test class over every
accountant, `PlanContract` holds what every plan promises to the code that
reads plans without asking their kind: the draws, the store, the trainers,
the tuners and the dry run.
"""

import json
import cloudpickle

import jax
import numpy as np
import pytest

from examples import dp_logistic_regression as ex
from jaxdp import accounting as acc
from jaxdp.sweep import (Candidate, CandidateStore, FunctionPlan, SearchPlan, TaskPlan,
                         TrainFunction, build_plan)
from jaxdp.sweep.plan import candidate_event, one_of
from jaxdp.sweep.space import MECHANISM_PARTS, point_key
from jaxdp.tuning import draws

FUNCTION_GRID = {"learning_rate": [0.3, 1.0], "l2_clip_norm": [0.5], "sampling_prob": [0.1],
                 "steps": [20], "noise_multiplier": [4.0, 8.0]}
TASK_GRID = {"learning_rate": [0.3, 1.0], "noise_multiplier": [1.0, 2.0]}


@pytest.fixture(scope="module", params=["task", "function"])
def kind(request):
  return request.param


@pytest.fixture(scope="module")
def plan(kind, digits, base_config):
  if kind == "task":
    return build_plan(base_config, TASK_GRID, digits)
  return build_plan(TrainFunction(ex.train_fn, ex.dp_event), FUNCTION_GRID, None)


@pytest.fixture(scope="module")
def trained(plan):
  """Two candidates drawn from the plan and trained on this host, in memory."""
  cands = draws.draw_candidates(plan, 2, jax.random.key(3))
  with CandidateStore(plan) as store:
    return cands, store.train(cands)


class TestPlanContract:
  """What every `SearchPlan` promises."""

  def test_is_a_search_plan_and_complete_when_built(self, plan, kind):
    assert isinstance(plan, SearchPlan)
    assert isinstance(plan, TaskPlan if kind == "task" else FunctionPlan)
    # Complete: every run has its event; nothing is filled in later.
    assert all(run.dp_event is not None for run in plan.runs)
    assert not hasattr(plan, "accounted") and not hasattr(plan, "epsilon")

  def test_the_grid_as_the_draws_read_it(self, plan):
    assert len(plan) == len(plan.points) == len(plan.configs) == len(plan.runs) == 4
    assert len({point_key(p) for p in plan.points}) == 4
    for config, run in zip(plan.configs, plan.runs):
      assert plan.run_of(config) is run
    cands = draws.draw_search(plan, acc.Fixed(6), jax.random.key(0))
    plan.check_candidates(cands)
    assert all(c.config is plan.configs[plan.points.index(c.point)] for c in cands)

  def test_foreign_candidates_are_refused(self, plan):
    with pytest.raises(ValueError, match="Candidate objects"):
      plan.check_candidates(["not a candidate"])
    crossed = Candidate(plan.points[0], plan.configs[1], seed=0)
    with pytest.raises(ValueError, match="another point's"):
      plan.check_candidates([crossed])
    with pytest.raises(ValueError, match="is not one of this"):
      plan.run_of(object())

  def test_one_candidates_event_is_the_worst_over_the_runs(self, plan):
    events = [run.dp_event for run in plan.runs]
    assert candidate_event(plan) == one_of(events)
    assert isinstance(candidate_event(plan), acc.UniformCandidates)  # sigma varies in both grids
    # The worst run's epsilon, up to the optimiser's tolerance in dp_accounting's RDP conversion
    # (1e-10 relative here), and never below it.
    worst = max(acc.epsilon(e, 1e-5) for e in events)
    assert worst <= acc.epsilon(candidate_event(plan), 1e-5) <= worst * (1 + 1e-9)

  def test_release_and_unreleased_of_a_selected_candidate_and_of_nothing(self, plan, trained):
    cands, results = trained
    release = plan.release(cands[0], results[0])
    assert set(release) == {"hyperparameters", "config", "params", "score_source"}
    assert release["hyperparameters"] is not None and release["params"] is not None
    assert set(release["hyperparameters"]) >= set(cands[0].point)
    nothing = plan.release(None, None)
    assert nothing["hyperparameters"] is None and nothing["params"] is None
    assert nothing["score_source"] == plan.score_source
    assert set(plan.unreleased(cands[0], results[0])) <= {"seed", "auto_static"}

  def test_a_record_stands_for_its_result(self, plan, trained):
    cands, results = trained
    record, arrays = plan.record(cands[0], results[0])
    assert record["id"] == cands[0].id and json.loads(json.dumps(record)) == record
    back = plan.result(cands[0], record, jax.tree.leaves(arrays))  # the leaves, as the pool reads them
    assert back.score == results[0].score
    left, right = jax.tree.leaves(plan.release(cands[0], back)["params"]), \
        jax.tree.leaves(plan.release(cands[0], results[0])["params"])
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(left, right))
    assert plan.result(cands[0], record, None).score == results[0].score  # without its arrays

  def test_the_mechanism_per_point_and_the_fingerprint(self, plan):
    mechanism = plan.mechanism()
    assert set(mechanism) == set(MECHANISM_PARTS)
    assert all(set(part) == {point_key(p) for p in plan.points} for part in mechanism.values())
    one = plan.mechanism([plan.points[1]])
    assert all(set(part) == {point_key(plan.points[1])} for part in one.values())
    fields = plan.search_fields("a_tuner", jax.random.key(7), threshold=0.5)
    assert fields["tuner"] == "a_tuner" and "threshold" in fields["accounted"]
    assert fields != plan.search_fields("a_tuner", jax.random.key(8), threshold=0.5)
    assert json.loads(json.dumps(plan.fingerprint(**fields))) == plan.fingerprint(**fields)
    key_words = np.asarray(jax.random.key_data(jax.random.key(7))).tolist()
    assert str(key_words) not in json.dumps(fields) and len(fields["key"]) == 64  # a digest

  def test_the_summary_a_dry_run_reads(self, plan, kind):
    summary = plan.summary()
    assert set(summary) == {"groups", "steps", "gradients", "function", "auto_static"}
    if kind == "task":
      assert summary["groups"] and summary["steps"] > 0 and summary["function"] is None
    else:
      assert summary["groups"] == () and summary["steps"] is None
      assert summary["function"] == "examples.dp_logistic_regression.train_fn"

  def test_it_travels_to_another_process(self, plan):
    back = cloudpickle.loads(cloudpickle.dumps(plan))  # a Ray worker gets it whole
    assert back.points == plan.points and len(back) == len(plan)
    cands = draws.draw_candidates(plan, 1, jax.random.key(1))
    moved = [Candidate(c.point, back.configs[plan.points.index(c.point)], key_data=c.key_data,
                       key_impl=c.key_impl) for c in cands]
    back.check_candidates(moved)
