"""examples/tensorboard_logging.py (issue 45, item 5): what it writes to TensorBoard holds no
candidate's score and no count, unless the user opts in; docs/guides/logging.md says why.

tensorboardX is in the `dev` extra (and `pip install -e '.[tensorboard]'`): the test skips only
where it is not installed.
"""

import json
import math
import os
import re
import struct

import pytest

tensorboardX = pytest.importorskip("tensorboardX", reason="pip install -e '.[tensorboard]'")
from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top,wrong-import-position

from examples import tensorboard_logging as tb  # pylint: disable=wrong-import-position
from jaxdp import accounting as acc  # pylint: disable=wrong-import-position

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RELEASE_KEYS = {"format", "kind", "jaxdp", "hyperparameters", "score", "epsilon", "delta",
                "accounting_method", "score_source", "noise_multiplier", "config", "event",
                "event_description"}


def _read(run_dir: str) -> list:
  """(tag, step, value) of every summary in a TensorBoard run: TFRecords of `Event` protos."""
  out = []
  for name in sorted(os.listdir(run_dir)):
    with open(os.path.join(run_dir, name), "rb") as f:
      data = f.read()
    at = 0
    while at < len(data):
      (length,) = struct.unpack("<Q", data[at:at + 8])
      event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
      at += 12 + length + 4  # length, its CRC, the record, its CRC
      for value in event.summary.value:
        text = value.tensor.string_val[0].decode() if value.tensor.string_val else None
        # tensorboardX files text under "<tag>/text_summary".
        out.append((value.tag.removesuffix("/text_summary"), event.step,
                    value.simple_value if text is None else text))
  return out


@pytest.fixture(scope="module")
def two_searches(tmp_path_factory):
  """The example run twice with different keys (different K), and once opting in."""
  runs = {}
  for seed in (0, 3):
    logdir = str(tmp_path_factory.mktemp(f"tb{seed}"))
    runs[seed] = (tb.run(logdir, mean_candidates=4.0, seed=seed), logdir)
  return runs


def test_what_is_logged_holds_no_candidate_score_and_no_count(two_searches):
  (a, dir_a), (b, dir_b) = two_searches[0], two_searches[3]
  assert a.unreleased.num_candidates != b.unreleased.num_candidates  # K differs
  progress = {}
  for result, logdir in ((a, dir_a), (b, dir_b)):
    logged = _read(os.path.join(logdir, "progress"))
    progress[logdir] = [(tag, step, value) for tag, step, value in logged
                        if tag != "progress/elapsed_seconds"]
    released = _read(os.path.join(logdir, "release"))
    assert {tag for tag, _, _ in logged} == {"privacy/epsilon", "privacy/delta",
                                             "progress/share_done", "progress/elapsed_seconds"}
    assert {tag for tag, _, _ in released} == {"privacy/epsilon", "privacy/delta", "release/score",
                                               "release"}
    text = next(value for tag, _, value in released if tag == "release")
    assert set(json.loads(text)) == RELEASE_KEYS and json.loads(text) == json.loads(
        json.dumps(result.to_json()))
    numbers = [value for _, _, value in logged + released if isinstance(value, float)]
    others = [s for _, s in result.unreleased.all_scores if s != result.score]
    assert others, "the test needs candidates that were not selected"
    for score in others:
      assert all(not math.isclose(score, v, rel_tol=1e-6) for v in numbers), score
      assert repr(score) not in text and f"{score:.4f}" not in text
    assert "num_candidates" not in text and "all_scores" not in text and "seed" not in text
  # Apart from wall times, the progress run is the same for both K: it says nothing of K.
  assert progress[dir_a] == progress[dir_b]
  shares = [(step, value) for tag, step, value in progress[dir_a] if tag == "progress/share_done"]
  assert shares == [(1, 0.25), (2, 0.5), (3, 0.75), (4, 1.0)]
  epsilon = [value for tag, _, value in progress[dir_a] if tag == "privacy/epsilon"]
  assert epsilon == [pytest.approx(a.epsilon, rel=1e-6)]  # fixed in advance: what the search reports


def test_opting_in_logs_every_score_beside_the_epsilon_that_covers_them(tmp_path):
  result = tb.run(str(tmp_path), mean_candidates=3.0, seed=1, log_all_scores=True)
  logged = _read(str(tmp_path / "progress"))
  scores = [value for tag, _, value in logged if tag == "unreleased/candidate_score"]
  assert scores == pytest.approx([s for _, s in result.unreleased.all_scores], rel=1e-6)
  covering = [value for tag, _, value in logged if tag == "privacy/epsilon_covering_all_scores"]
  want = acc.epsilon(acc.SelectionWithCount(result.event), result.delta)
  assert covering == [pytest.approx(want, rel=1e-6)] and want > result.epsilon
  # The publishable run is the same without the opt-in: the scores never go there.
  assert {tag for tag, _, _ in _read(str(tmp_path / "release"))} == {
      "privacy/epsilon", "privacy/delta", "release/score", "release"}


def test_nothing_released_logs_the_same_milestones(tmp_path):
  result = tb.run(str(tmp_path), mean_candidates=1e-9, seed=0)
  assert result.unreleased.num_candidates == 0
  shares = [(s, v) for tag, s, v in _read(str(tmp_path / "progress")) if tag == "progress/share_done"]
  assert shares == [(1, 0.25), (2, 0.5), (3, 0.75), (4, 1.0)]
  assert "release/score" not in {tag for tag, _, _ in _read(str(tmp_path / "release"))}


def test_the_logging_guide_names_the_example_and_the_covering_epsilon():
  page = open(os.path.join(ROOT, "docs", "guides", "logging.md"), encoding="utf-8").read()
  assert len(re.findall(r"^# ", page, flags=re.M)) == 1
  assert "examples/tensorboard_logging.py" in page and "SelectionWithCount" in page
  assert "--log-all-scores" in page
  # The numbers the page quotes are the example's defaults' (both are fixed before training).
  plan = tb.dry_run(tb.TrainFunction(tb.lr.train_fn, tb.lr.dp_event, noise_parameter="noise_multiplier"),
                    tb.lr.GRID, distribution=acc.Poisson(mean=8.0), target_epsilon=2.0, target_delta=1e-5)
  covering = acc.epsilon(acc.SelectionWithCount(plan.event), 1e-5)
  shown, covers = acc.format_epsilon(plan.epsilon), acc.format_epsilon(covering)  # as the example prints
  assert f"covered by epsilon = {covers}, not {shown}" in page and f"epsilon = {shown}; logged to" in page
