"""The top-level experiments/: one launch script per figure, the profiles defined there only, not in the wheel."""

import ast
import glob
import os
import re
import subprocess
import sys

import pytest

from jaxdp.experiments import audit, common, fig7, kk_fig7

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "experiments", "*.py")))
# Figures with a --profile option: their profiles live in experiments/<name>.py and nowhere else.
WITH_PROFILES = {"fig7": fig7, "kk_fig7": kk_fig7, "audit": audit}


def test_one_script_per_pipeline_and_a_readme():
  pipelines = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "jaxdp", "experiments", "*.py"))}
  assert {os.path.basename(p)[:-3] for p in SCRIPTS} == pipelines - {"__init__", "common"}
  readme = open(os.path.join(ROOT, "experiments", "README.md")).read()
  for path in SCRIPTS:
    assert f"`{os.path.basename(path)}`" in readme, path


@pytest.mark.slow  # a fresh interpreter per script: about 2 s each
@pytest.mark.parametrize("path", SCRIPTS, ids=os.path.basename)
def test_every_script_answers_help(path):
  # As make runs them: a fresh interpreter, from the repository root, the jaxdp of this checkout.
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
  name = os.path.basename(path)
  proc = subprocess.run([sys.executable, os.path.join("experiments", name), "--help"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.startswith(f"usage: experiments/{name}"), proc.stdout
  if name[:-3] in WITH_PROFILES:
    profiles = common.figure_profiles(name[:-3])
    assert re.search(r"--profile \{" + ",".join(sorted(profiles)) + r"\}", proc.stdout), proc.stdout


def test_scripts_hold_data_and_an_entry_point_only():
  # No code in two places: every function and class of a figure stays in jaxdp.experiments.
  for path in SCRIPTS:
    tree = ast.parse(open(path).read(), path)
    assert ast.get_docstring(tree), path
    defs = [n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    assert not defs, (path, defs)
    main = tree.body[-1]
    assert isinstance(main, ast.If) and ast.unparse(main.test) == "__name__ == '__main__'", path


@pytest.mark.parametrize("name", sorted(WITH_PROFILES))
def test_profiles_are_defined_in_experiments_only(name):
  module = WITH_PROFILES[name]
  assert "PROFILES" not in vars(module)  # not defined in the pipeline...
  script = common.figure_script(name)
  assert os.path.realpath(script.__file__) == os.path.join(os.path.realpath(ROOT), "experiments", f"{name}.py")
  assert module.PROFILES is script.PROFILES  # ...which reads them from the script
  assert "quick" in script.PROFILES
  for key, profile in script.PROFILES.items():
    assert isinstance(profile, module.Profile), key
    assert getattr(profile, "name", key) == key  # manifests and pool names record the profile's key
  with pytest.raises(AttributeError):
    module.NO_SUCH_NAME  # pylint: disable=pointless-statement


def test_the_wheel_does_not_ship_experiments():
  try:
    import tomllib  # pylint: disable=g-import-not-at-top
  except ImportError:  # Python 3.10: tomli is a dev dependency there (pyproject), never skipped
    import tomli as tomllib  # pylint: disable=g-import-not-at-top
  import setuptools  # pylint: disable=g-import-not-at-top
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    find = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]
  assert find == {"include": ["jaxdp*"]}
  # pyproject's packages.find looks for namespace packages too: experiments/ has no __init__.py.
  packages = setuptools.find_namespace_packages(where=ROOT, include=find["include"])
  assert "jaxdp.experiments" in packages
  assert all(p == "jaxdp" or p.startswith("jaxdp.") for p in packages), packages


def test_make_targets_launch_the_scripts():
  makefile = open(os.path.join(ROOT, "Makefile")).read()
  launched = re.findall(r"^\t\$\(PY\) (experiments/\w+\.py) ", makefile, flags=re.M)
  assert sorted(launched) == ["experiments/analytic_figures.py", "experiments/fig1.py", "experiments/fig7.py",
                              "experiments/kk_fig1.py", "experiments/kk_fig7.py", "experiments/profile_figures.py"]
  assert "jaxdp.experiments" not in makefile


def test_without_a_clone_the_profiles_are_a_usage_error(tmp_path, monkeypatch, capsys):
  # An installed wheel: jaxdp sits in site-packages, with no pyproject.toml and experiments/ beside it.
  site = tmp_path / "site-packages"
  (site / "experiments").mkdir(parents=True)  # someone else's `experiments` package is not ours
  monkeypatch.setattr(common, "__file__", str(site / "jaxdp" / "experiments" / "common.py"))
  monkeypatch.delenv(common.EXPERIMENTS_ENV, raising=False)
  assert common.experiments_dir() is None
  assert fig7.main(["--help"]) == 2
  err = capsys.readouterr().err
  assert "experiments/fig7.py" in err and common.EXPERIMENTS_ENV in err
  assert kk_fig7.main(["--dry-run"]) == 2 and audit.main([]) == 2
  with pytest.raises(common.UsageError, match="does not include"):
    fig7.PROFILES  # pylint: disable=pointless-statement


def test_jaxdp_experiments_names_another_directory(tmp_path, monkeypatch, capsys):
  (tmp_path / "fig7.py").write_text(
      "from jaxdp.experiments.fig7 import Profile\n"
      "PROFILES = {'mine': Profile(name='mine', dataset='digits', model='logreg', activation='tanh',\n"
      "                            batch_size=64, epochs=1, noise_multiplier=1.0, l2_clip_norm=1.0,\n"
      "                            learning_rates=(0.1,), seeds=(0,), expected_ks=(2,))}\n")
  clone = common.figure_script("fig7").__file__
  monkeypatch.setenv(common.EXPERIMENTS_ENV, str(tmp_path))
  assert list(fig7.PROFILES) == ["mine"]
  with pytest.raises(SystemExit) as exc:
    fig7.main(["--help"])
  assert exc.value.code == 0 and "--profile {mine}" in capsys.readouterr().out
  monkeypatch.setenv(common.EXPERIMENTS_ENV, str(tmp_path / "missing"))
  with pytest.raises(common.UsageError, match="does not exist"):
    common.figure_profiles("fig7")
  monkeypatch.delenv(common.EXPERIMENTS_ENV)
  assert common.figure_script("fig7").__file__ == clone and fig7.PROFILES["quick"].name == "quick"
