"""The examples of "Tune any trainer" run: the NumPy one in the default suite, the Opacus one
(slow) where PyTorch and Opacus are installed (`pip install -e '.[opacus]'`)."""

import importlib
import json
import sys

import jax
import numpy as np
import pytest

from examples import dp_logistic_regression
from jaxdp import accounting as acc
from jaxdp.tuning import random_search, RunConfig, TrainFunction


def test_numpy_example_main_prints_the_release_as_json(capsys):
  out = dp_logistic_regression.main(["--mean-candidates", "3", "--target-epsilon", "2.0"])
  printed = json.loads(capsys.readouterr().out)
  assert printed["epsilon"] == out["epsilon"] <= 2.0
  assert printed["hyperparameters"]["noise_multiplier"] == printed["noise_multiplier"]
  assert 0.5 < printed["score"] <= 1.0  # 169 public test examples, better than a coin


@pytest.mark.parametrize("module", ["dp_logistic_regression", "opacus_search"])
def test_examples_have_help(module, capsys):
  mod = importlib.import_module(f"examples.{module}")  # imports without PyTorch: never skipped
  with pytest.raises(SystemExit) as done:
    mod.main(["--help"])
  assert done.value.code == 0 and "--target-epsilon" in capsys.readouterr().out


@pytest.mark.parametrize("missing", ["torch", "opacus"])
def test_opacus_search_without_pytorch_names_the_cpu_wheel(missing, monkeypatch):
  # Issue 45: `pip install -e '.[opacus]'` pulls the CUDA build of PyTorch unless the CPU wheel
  # is installed first; the example says so when either package is missing.
  from examples import opacus_search  # pylint: disable=g-import-not-at-top
  monkeypatch.setitem(sys.modules, missing, None)  # `import <missing>` raises ImportError
  steps = (r"\n  pip install torch --index-url https://download\.pytorch\.org/whl/cpu\n"
           r"  pip install -e '\.\[opacus\]'\n\(the import failed: ")
  with pytest.raises(ImportError, match=r"needs PyTorch and Opacus .*CPU wheel first.*:" + steps):
    opacus_search.main(["--target-epsilon", "3"])  # before any search starts
  hparams = {k: v[0] for k, v in dict(opacus_search.GRID, noise_multiplier=[2.0]).items()}
  with pytest.raises(ImportError, match=steps):
    opacus_search.train_fn(hparams, 0)


@pytest.mark.slow  # PyTorch's import and six Opacus runs: about 15 s
def test_opacus_search_resumes_and_accounts_what_opacus_ran(tmp_path):
  pytest.importorskip("opacus", reason="the Opacus example needs: pip install -e '.[opacus]'")
  from examples import opacus_search  # pylint: disable=g-import-not-at-top
  hparams = dict(opacus_search.GRID, noise_multiplier=[2.0])
  hparams = {k: v[0] for k, v in hparams.items()}
  # The same seed, the same run: what a resume relies on (train_fn also checks Opacus's history).
  a, b = opacus_search.train_fn(hparams, 7), opacus_search.train_fn(hparams, 7)
  assert a[0] == b[0] and all(np.array_equal(a[1][k], b[1][k]) for k in a[1])
  calls = []

  def counted(hp, seed):
    calls.append(seed)
    return opacus_search.train_fn(hp, seed)
  function = TrainFunction(counted, opacus_search.dp_event, noise_parameter="noise_multiplier")
  args = dict(distribution=acc.Poisson(mean=3), key=jax.random.key(0), target_epsilon=3.0,
              run_config=RunConfig(run_dir=str(tmp_path)))
  first = random_search(function, opacus_search.GRID, **args)
  assert len(calls) == first.unreleased.num_candidates >= 1 and first.epsilon <= 3.0
  assert first.epsilon == acc.epsilon(acc.RepeatAndSelect(acc.UniformCandidates(
      [acc.dpsgd_event(1 / 8, first.noise_multiplier, 40), acc.dpsgd_event(1 / 4, first.noise_multiplier, 20)]),
      acc.Poisson(mean=3)), 1e-5)
  del calls[:]
  second = random_search(function, opacus_search.GRID, **args)
  assert calls == [] and second.score == first.score
  assert all(np.array_equal(second.params[k], first.params[k]) for k in first.params)


def test_guide_tune_any_trainer_snippet_runs_and_prints_what_the_guide_quotes():
  """The guide's snippet (docs/guides/tune_any_trainer.md), run here, and the numbers it quotes
  for the example's command.

  Tolerances: sigma is the root of a calibration to 0.1% (`acc.noise_for`'s rtol), over epsilons
  that differ between machines in their last bits, so it may land elsewhere within that 0.1%:
  sigma and epsilon to 2e-3 relative; the score (accuracy on 169 examples) to one example."""
  import os  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  guide = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "guides", "tune_any_trainer.md")
  section = open(guide, encoding="utf-8").read()
  assert section.startswith("# Tune any trainer\n")
  code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
  quoted = json.loads(re.search(r"```text\n(.*?)```", section, re.S).group(1))
  scope = {}
  exec(compile(code, guide, "exec"), scope)  # pylint: disable=exec-used
  result = scope["result"]
  assert result.hyperparameters == pytest.approx(quoted["hyperparameters"], rel=2e-3)
  assert result.epsilon == pytest.approx(quoted["epsilon"], rel=2e-3) and result.epsilon <= 2.0
  # K is not in the printed release: the guide names it in the text ("K (8 here)").
  assert f"K ({result.unreleased.num_candidates} here)" in " ".join(section.split())
  assert "num_candidates" not in quoted and "seed" not in quoted
  assert abs(result.score - quoted["score"]) <= 1 / 169 + 1e-4
  single = acc.epsilon(acc.dpsgd_event(0.1, result.noise_multiplier, 200), 1e-5)
  assert f"({single:.2f}, 1e-5)-DP" in section


def test_a_bad_argument_is_one_line_and_exit_code_2(capsys):
  with pytest.raises(SystemExit) as done:
    dp_logistic_regression.main(["--delta", "2"])
  assert done.value.code == 2 and "delta must be in (0.0, 1.0), got 2.0" in capsys.readouterr().err
