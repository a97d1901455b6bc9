"""The notebook sources (notebooks/<name>.py, Jupytext percent format) and notebooks/_build.py.

Every notebook has one source and every source one notebook; each .ipynb is
exactly what `python notebooks/_build.py` writes from its source; the sources
are valid Python with no undefined names, so a linter and an editor reach the
notebooks' code.
"""

import ast
import glob
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

NOTEBOOK_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                            "notebooks")
BUILD = os.path.join(NOTEBOOK_DIR, "_build.py")
SOURCES = sorted(p for p in glob.glob(os.path.join(NOTEBOOK_DIR, "*.py")) if not os.path.basename(p).startswith("_"))


def _stems(pattern):
  return {os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(NOTEBOOK_DIR, pattern))}


@pytest.fixture(scope="module")
def build():
  """notebooks/_build.py as a module (it needs jupytext, from the dev extra)."""
  pytest.importorskip("jupytext")
  spec = importlib.util.spec_from_file_location("notebooks_build", BUILD)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_every_notebook_has_a_source_and_every_source_a_notebook():
  sources = {s for s in _stems("*.py") if not s.startswith("_")}
  assert len(sources) >= 5
  assert sources == _stems("*.ipynb")


@pytest.mark.parametrize("source", SOURCES, ids=os.path.basename)
def test_notebook_is_what_its_source_builds(source, build):
  """Edit notebooks/<name>.py, then run `python notebooks/_build.py`."""
  with open(os.path.splitext(source)[0] + ".ipynb", encoding="utf-8") as f:
    stored = f.read()
  assert stored == build.render(source), f"{os.path.basename(source)}: run python notebooks/_build.py"


def test_build_check_fails_on_a_stale_or_unpaired_notebook(build, tmp_path):
  work = tmp_path / "notebooks"
  shutil.copytree(NOTEBOOK_DIR, work)
  check = [sys.executable, str(work / "_build.py"), "--check"]
  assert subprocess.run(check, capture_output=True, check=False).returncode == 0
  source = work / os.path.basename(SOURCES[0])
  source.write_text(source.read_text(encoding="utf-8") + "\n# %%\nprint('a new cell')\n", encoding="utf-8")
  stale = subprocess.run(check, capture_output=True, text=True, check=False)
  assert stale.returncode == 1 and os.path.basename(SOURCES[0])[:-3] + ".ipynb" in stale.stdout
  # Writing brings it up to date; a notebook left without a source still fails.
  subprocess.run(check[:-1], capture_output=True, check=True)
  assert subprocess.run(check, capture_output=True, check=False).returncode == 0
  source.unlink()
  orphan = subprocess.run(check, capture_output=True, text=True, check=False)
  assert orphan.returncode == 1 and "(no source)" in orphan.stdout


SETUP = os.path.join(NOTEBOOK_DIR, "_setup.py")


@pytest.mark.parametrize("source", SOURCES + [SETUP], ids=os.path.basename)
def test_source_compiles(source):
  with open(source, encoding="utf-8") as f:
    compile(f.read(), source, "exec")


@pytest.mark.parametrize("source", SOURCES, ids=os.path.basename)
def test_source_has_no_undefined_names(source):
  """A notebook runs top to bottom as one module: its shared cells, then its own, linted as one."""
  with open(SETUP, encoding="utf-8") as f:
    text = f.read()
  with open(source, encoding="utf-8") as f:
    text += "\n" + f.read()
  if importlib.util.find_spec("pyflakes") is not None:
    from pyflakes import checker, messages
    undefined = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)
    found = [str(m) for m in checker.Checker(ast.parse(text, source), filename=source).messages
             if isinstance(m, undefined)]
  elif ruff := shutil.which("ruff", path=os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])):
    proc = subprocess.run([ruff, "check", "--no-cache", "--select", "F821,F822,F823", source],
                          capture_output=True, text=True, check=False)
    found = [proc.stdout + proc.stderr] if proc.returncode else []
  else:
    pytest.skip("neither pyflakes nor ruff is installed")
  assert not found, "\n".join(found)


def test_colab_install_and_small_mode_cells_are_the_same_in_every_notebook():
  """They are written once (notebooks/_setup.py) and inserted after every title cell."""
  def first_code_cells(source):
    with open(os.path.splitext(source)[0] + ".ipynb", encoding="utf-8") as f:
      cells = json.load(f)["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"][:2]
  first = first_code_cells(SOURCES[0])
  assert '"google.colab" in sys.modules' in first[0] and "JAXDP_NOTEBOOK_SMALL" in first[1]
  for source in SOURCES[1:]:
    assert first_code_cells(source) == first, os.path.basename(source)
