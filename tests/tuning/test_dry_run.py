"""The dry run's report (issues 44 item 1, 45 item 3): its summary first, the trainable and frozen
parameter counts, what `initial_params` holds, the clipping paths counted by kind, and the time:
stated only when `probe=True` measured it, from K's public law.

On the user task of tests/conftest.py: an MLP on 6 features, `hidden` Dense(width) then `out`
Dense(1); at width 8 it has 6*8 + 8 = 56 scalars in `hidden` and 8 + 1 = 9 in `out`.
"""

import re

import jax
import numpy as np
import pytest

from jaxdp import accounting as acc
from jaxdp.data import Dataset
from jaxdp.train import program
from jaxdp.tuning import dry_run, TrainFunction
from jaxdp.tuning import probe as probe_lib
from jaxdp.tuning.probe import GroupTiming

from examples import dp_logistic_regression as ex
from tests.conftest import make_user_task

REPS = acc.Poisson(mean=3)
LR = {"learning_rate": [0.02, 0.1]}
HIDDEN, OUT = 6 * 8 + 8, 8 + 1


def _head_only(user_config):
  return user_config.replace(task=make_user_task(trainable=lambda path: path.startswith("params/out/"),
                                                 name="user-mlp-head-only"))


def _hidden_start(user_data):
  """A public start of the `hidden` module only (the model at width 8)."""
  rng = np.random.default_rng(1)
  return {"params": {"hidden": {"kernel": rng.normal(size=(6, 8)).astype(np.float32),
                                "bias": np.zeros(8, np.float32)}}}


def test_the_summary_comes_first_and_lists_each_parameter_only_on_request(no_work, user_config,
                                                                           user_data):
  report = dry_run(user_config, {"width": [4, 8], **LR}, user_data, distribution=REPS)
  lines = str(report).splitlines()
  heads = ["private random search:", "K ~ ", "score: ", "compute: ", "time: ", "2 compiled group(s):",
           "  compiled separately: ", "  group 1: ", "    parameters: ", "    initial_params: ",
           "    clipping: ", "  group 2: ", "    parameters: ", "    initial_params: ", "    clipping: "]
  assert len(lines) == len(heads) and all(l.startswith(h) for l, h in zip(lines, heads)), lines
  verbose = report.format(verbose=True)
  assert verbose.startswith(str(report) + "\n")  # the summary first, whole
  rest = verbose[len(str(report)) + 1:].splitlines()
  assert rest == [
      "clipping path of each parameter (group 1):",
      *[f"    clipping params/{m}/{leaf}: ghost (Dense '{m}')" for m in ("hidden", "out")
        for leaf in ("bias", "kernel")],
      "clipping path of each parameter (group 2):",
      *[f"    clipping params/{m}/{leaf}: ghost (Dense '{m}')" for m in ("hidden", "out")
        for leaf in ("bias", "kernel")]]


def test_parameter_counts_and_clipping_paths_by_kind(no_work, user_config, user_data):
  full = dry_run(user_config, LR, user_data, distribution=REPS)
  (g,) = full.groups
  assert tuple(g.parameters) == (HIDDEN + OUT, 4, 0, 0)
  text = str(full) + "\n"
  assert f"    parameters: {HIDDEN + OUT} trainable in 4 leaves, 0 frozen in 0 leaves\n" in text
  assert "    clipping: ghost norms: 4 leaves\n" in text
  assert "group 1" not in text  # one group: not numbered
  head = dry_run(_head_only(user_config), LR, user_data, distribution=REPS,
                 initial_params=_hidden_start(user_data))
  (g,) = head.groups
  assert tuple(g.parameters) == (OUT, 2, HIDDEN, 2)
  text = str(head) + "\n"
  assert f"    parameters: {OUT} trainable in 2 leaves, {HIDDEN} frozen in 2 leaves\n" in text
  assert "    clipping: per-example gradients: 2 leaves; frozen: 2 leaves\n" in text  # auto: cheaper
  vmap = user_config.replace(task=make_user_task(clipping="vmap", name="user-mlp-vmap"))
  assert "    clipping: per-example gradients: 4 leaves" in str(
      dry_run(vmap, LR, user_data, distribution=REPS))


def test_what_initial_params_holds_none_part_all(no_work, user_config, user_data):
  def coverage(config, initial):
    report = dry_run(config, LR, user_data, distribution=REPS, initial_params=initial)
    (line,) = [l for l in str(report).splitlines() if l.startswith("    initial_params: ")]
    return report.groups[0].initial, line[len("    initial_params: "):]

  c, line = coverage(user_config, None)
  assert (c.given, c.total, c.whole, c.some, c.none) == (0, 4, (), (), ("hidden", "out"))
  assert line == "none (every parameter initialised from the key)"
  c, line = coverage(user_config, _hidden_start(user_data))
  assert (c.given, c.whole, c.some, c.none) == (2, ("hidden",), (), ("out",))
  assert line == "2 of 4 leaves: all of hidden; none of out"
  partly = {"params": {"out": {"bias": np.zeros(1, np.float32)}}}
  assert coverage(user_config, partly)[1] == "1 of 4 leaves: some of out; none of hidden"
  whole = {"params": {**_hidden_start(user_data)["params"],
                      "out": {"kernel": np.zeros((8, 1), np.float32), "bias": np.zeros(1, np.float32)}}}
  assert coverage(user_config, whole)[1] == "all 4 leaves"
  # A frozen module with no public start stays at its random initialisation: said.
  c, line = coverage(_head_only(user_config), None)
  assert c.frozen_from_key == 2
  assert line.endswith("; 2 frozen leaves are not in it: they stay at their random initialisation")
  assert coverage(_head_only(user_config), _hidden_start(user_data))[0].frozen_from_key == 0


def test_without_a_probe_nothing_compiles_and_no_time_is_made_up(no_work, user_config, user_data,
                                                                 monkeypatch):
  def compiled(*args, **kwargs):
    raise AssertionError("a dry run without probe=True compiled a program")
  monkeypatch.setattr(program, "compile_cached", compiled)
  report = dry_run(user_config, LR, user_data, distribution=REPS)
  assert report.timings == () and report.expected_seconds is None
  (line,) = [l for l in str(report).splitlines() if l.startswith("time: ")]
  assert line == ("time: not measured: dry_run(..., probe=True) compiles each group and times a "
                  "few DP steps")


def test_the_probe_times_the_group_and_estimates_from_ks_law(user_config, user_data):
  # One group (one compilation; the weighting of several is checked below, without compiling).
  config = user_config.replace(task=make_user_task(name="user-mlp-probed"))  # compiled afresh
  report = dry_run(config, {"learning_rate": [0.02, 0.1, 0.5]}, user_data, distribution=REPS,
                   probe=True)
  (g,), (t,) = report.groups, report.timings
  assert t.compile_s > 0 and t.step_s > 0 and t.steps_timed >= probe_lib.MIN_TIMED_STEPS
  compile_s, steps_s = report.expected_seconds
  # Compiled unless K = 0; E[K] = 3 candidates of g.steps steps each.
  assert compile_s == pytest.approx((1 - np.exp(-3)) * t.compile_s)
  assert steps_s == pytest.approx(3 * g.steps * t.step_s)
  text = str(report)
  assert re.search(r"\ntime: about [0-9.]+ (ms|s|min) expected = compilation [0-9.]+ (ms|s|min) \+ "
                   r"DP steps [0-9.]+ (ms|s|min) \(probed; E\[K\]=3 from K's law", text)
  assert re.search(r"\n    probe: compiled in [0-9.]+ (ms|s|min), [0-9.]+ (ms|s) per DP step "
                   r"\(\d+ timed\)$", text)


def test_the_expected_time_depends_on_ks_law_only():
  class G:  # a group's weight and steps are all the estimate reads of it
    def __init__(self, grid_points, steps):
      self.grid_points, self.steps = grid_points, steps
  groups = [G(1, 10), G(3, 20)]
  timings = [GroupTiming(compile_s=2.0, step_s=0.1, steps_timed=3),
             GroupTiming(compile_s=4.0, step_s=0.5, steps_timed=3)]
  compile_s, steps_s = probe_lib.expected_seconds(groups, timings, acc.Fixed(2))
  assert compile_s == pytest.approx((1 - 0.75 ** 2) * 2.0 + (1 - 0.25 ** 2) * 4.0)
  assert steps_s == pytest.approx(2 * (0.25 * 10 * 0.1 + 0.75 * 20 * 0.5))
  untimed = [timings[0], GroupTiming(compile_s=4.0, step_s=None, steps_timed=0)]
  assert probe_lib.expected_seconds(groups, untimed, acc.Fixed(2)) is None


def test_the_probe_reads_no_private_row(user_data):
  """Its stand-in depends on the declared N and the public test split only."""
  rng = np.random.default_rng(5)
  other = Dataset(train={k: rng.permutation(v)[:150] for k, v in user_data.train.items()},
                  test=user_data.test, private_validation={k: v[:7] for k, v in
                                                           user_data.private_validation.items()},
                  num_examples=user_data.num_examples)
  for a, b in zip(probe_lib.stand_in(user_data), probe_lib.stand_in(other)):
    assert jax.tree.all(jax.tree.map(np.array_equal, a, b))
  train, test, validation = probe_lib.stand_in(other)
  assert all(len(v) == user_data.num_examples for v in train.values())  # N rows, not 150
  np.testing.assert_array_equal(train["x"][:100], user_data.test["x"])  # the public rows
  np.testing.assert_array_equal(train["x"][100:], user_data.test["x"])
  assert test is user_data.test
  assert all(v.shape[0] == 1 and not v.any() for v in validation.values())  # not 7 rows, not 100
  assert probe_lib.stand_in(Dataset(train=other.train, num_examples=200))[1:] == (None, None)


def test_a_bad_probe_is_refused(no_work, user_config, user_data):
  with pytest.raises(ValueError, match=r"probe must be a bool \(True or False\), got 'yes'"):
    dry_run(user_config, LR, user_data, distribution=REPS, probe="yes")
  with pytest.raises(ValueError, match="probe=True times a task's compiled groups"):
    dry_run(TrainFunction(ex.train_fn, ex.dp_event), dict(ex.GRID, noise_multiplier=[4.0]),
            distribution=REPS, probe=True)
