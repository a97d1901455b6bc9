"""The released model's recipe (issue 45, item 2): save, load in a new process, apply; the
recipe docs/guides/release.md shows is examples/release_recipe.py, and it runs."""

import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from examples import dp_logistic_regression as lr_example
from examples import release_recipe
from jaxdp import accounting as acc
from jaxdp.train import presets
from jaxdp.tuning import load_release, random_search, TrainFunction

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.path.join(ROOT, "docs", "guides", "release.md")


def test_loaded_release_predicts_what_the_result_in_memory_predicts(tiny_random_search, digits,
                                                                     base_config, tmp_path):
  result, _ = tiny_random_search
  assert result.hyperparameters is not None  # the fixture's search released a model
  inputs = digits.test.inputs
  in_memory = np.asarray(result.apply(base_config.task, inputs))
  loaded = load_release(result.save(str(tmp_path / "release")))
  # A fresh task object of the same preset: the task is code, rebuilt where the model is used.
  task = presets.classifier(10)
  from_disk = np.asarray(loaded.apply(task, inputs))
  assert from_disk.shape == (len(digits.test.labels), 10)
  np.testing.assert_array_equal(from_disk, in_memory)
  # The released score is the task's public test accuracy of exactly this model.
  accuracy = float(np.mean(from_disk.argmax(-1) == digits.test.labels))
  assert accuracy == pytest.approx(result.score, abs=1e-6)
  # The model factory got the configuration's hyperparameters (model="logreg" was not in the grid).
  assert "model" not in result.hyperparameters
  np.testing.assert_array_equal(loaded.model(task).apply(loaded.params, inputs[:5]), from_disk[:5])


def test_a_release_refuses_to_build_a_model_it_cannot(tiny_random_search, base_config, tmp_path):
  result, _ = tiny_random_search
  loaded = load_release(result.save(str(tmp_path / "r")))
  with pytest.raises(ValueError, match=r"task='other' is not the task the search trained \('classifier'\)"):
    loaded.model(presets.classifier(10, name="other"))
  with pytest.raises(ValueError, match="task must be the jaxdp.train.Task"):
    loaded.model("classifier")
  nothing = random_search(TrainFunction(lr_example.train_fn, lr_example.dp_event),
                          {"learning_rate": [1.0], "l2_clip_norm": [1.0], "sampling_prob": [0.1],
                           "steps": [5], "noise_multiplier": [4.0]},
                          distribution=acc.Poisson(mean=1e-9), key=jax.random.key(0))
  with pytest.raises(ValueError, match="released nothing"):
    load_release(nothing.save(str(tmp_path / "none"))).model(base_config.task)
  function = random_search(TrainFunction(lr_example.train_fn, lr_example.dp_event),
                           {"learning_rate": [1.0], "l2_clip_norm": [1.0], "sampling_prob": [0.1],
                            "steps": [5], "noise_multiplier": [4.0]},
                           distribution=acc.Fixed(1), key=jax.random.key(0))
  with pytest.raises(ValueError, match="training function's release has no model"):
    function.model(base_config.task)


def test_the_page_shows_the_recipe_that_runs(tmp_path):
  page = open(PAGE, encoding="utf-8").read()
  source = open(release_recipe.__file__, encoding="utf-8").read()
  included = re.findall(r"```\{literalinclude\} ../../examples/release_recipe.py\n"
                        r':start-after: "# \[(\w+)\]"\n:end-before: "# \[/\1\]"', page)
  assert included == ["tune", "apply"]
  for part in included:
    assert f"# [{part}]\n" in source and f"# [/{part}]\n" in source
  assert len(re.findall(r"^# ", page, flags=re.M)) == 1  # one top-level title
  path = str(tmp_path / "release")
  result = release_recipe.tune_and_save(path)
  # Loaded and applied in a new process: nothing but the release directory crosses over.
  done = subprocess.run([sys.executable, "-m", "examples.release_recipe", "apply", path],
                        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
  accuracy = float(re.search(r"public test accuracy of the released model: ([0-9.]+)",
                             done.stdout).group(1))
  assert accuracy == pytest.approx(result.score, abs=1e-4)
  assert f"epsilon = {acc.format_epsilon(result.epsilon)} at delta = 1e-05" in done.stdout
  assert json.load(open(os.path.join(path, "release.json")))["hyperparameters"] == result.hyperparameters
