"""The tutorial notebooks execute without errors (small mode) and are stored without outputs.

Each notebook runs with nbclient in a kernel started from this interpreter
(a kernel spec written to a temporary JUPYTER_PATH), in a temporary copy of
notebooks/ so nothing is written into the repository, with
JAXDP_NOTEBOOK_SMALL=1. That each notebook is what its source notebooks/<name>.py
builds is checked in test_build.py.
"""

import glob
import json
import os
import shutil
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                            "notebooks")
NOTEBOOKS = sorted(glob.glob(os.path.join(NOTEBOOK_DIR, "*.ipynb")))
TIMEOUT_S = 300  # seconds
COLAB_URL = "https://colab.research.google.com/github/jaxdp/jaxdp/blob/main/notebooks/{}"


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
  """Environment for the kernel: this interpreter as `python3`, small mode."""
  jupyter_path = tmp_path_factory.mktemp("jupyter")
  spec_dir = jupyter_path / "kernels" / "python3"
  spec_dir.mkdir(parents=True)
  spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
          "display_name": "Python 3 (jaxdp tests)", "language": "python"}
  (spec_dir / "kernel.json").write_text(json.dumps(spec))
  # Figures render with the kernel's inline backend, so plotting errors surface too.
  # PYTHONPATH: the kernel imports the jaxdp of this checkout, the one under
  # test, even where another copy is installed.
  root = os.path.dirname(NOTEBOOK_DIR)
  env = {"JUPYTER_PATH": str(jupyter_path), "JAXDP_NOTEBOOK_SMALL": "1", "PYDEVD_DISABLE_FILE_VALIDATION": "1",
         "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  yield
  for k, v in saved.items():
    if v is None:
      os.environ.pop(k, None)
    else:
      os.environ[k] = v


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """A throw-away copy of notebooks/, the kernels' working directory."""
  dest = tmp_path_factory.mktemp("nbrun") / "notebooks"
  shutil.copytree(NOTEBOOK_DIR, dest)
  return dest


def _execute(nb, cwd):
  client = nbclient.NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3",
                                   resources={"metadata": {"path": str(cwd)}})
  client.execute()
  return nb


def _text(cell) -> str:
  out = []
  for o in cell.get("outputs", []):
    if o.get("output_type") == "stream":
      out.append(o.get("text", ""))
    elif "data" in o:
      out.append(o["data"].get("text/plain", ""))
  return "".join(out)


def test_there_are_notebooks():
  names = {os.path.basename(p) for p in NOTEBOOKS}
  assert {"01_accounting.ipynb", "02_private_search_mnist.ipynb", "03_reproduce_fig7.ipynb",
          "04_subsampled_tuning.ipynb", "05_tune_your_own_model.ipynb",
          "06_private_fine_tuning.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_stored_without_outputs_and_with_a_colab_badge(path):
  nb = nbformat.read(path, as_version=4)
  nbformat.validate(nb)
  for cell in nb.cells:
    if cell.cell_type == "code":
      assert cell.outputs == [] and cell.execution_count is None, f"stored output in {path}"
  assert nb.cells[0].cell_type == "markdown"
  assert COLAB_URL.format(os.path.basename(path)) in nb.cells[0].source
  first_code = next(c for c in nb.cells if c.cell_type == "code")
  assert '"google.colab" in sys.modules' in first_code.source and "pip" in first_code.source


def test_kernel_is_this_interpreter(kernel_env, workdir):
  nb = nbformat.v4.new_notebook()
  nb.cells.append(nbformat.v4.new_code_cell("import os, sys; print(sys.executable); print(os.getcwd()); "
                                            "print(os.environ['JAXDP_NOTEBOOK_SMALL'])"))
  nb.cells.append(nbformat.v4.new_code_cell("import jaxdp; print(jaxdp.__file__)"))
  nb = _execute(nb, workdir)
  lines = _text(nb.cells[0]).split()
  assert os.path.realpath(lines[0]) == os.path.realpath(sys.executable)
  assert os.path.realpath(lines[1]) == os.path.realpath(workdir)
  assert lines[2] == "1"
  jaxdp_file = _text(nb.cells[1]).strip()
  assert os.path.realpath(jaxdp_file).startswith(os.path.realpath(os.path.dirname(NOTEBOOK_DIR)) + os.sep)


#: Executing a notebook is an end-to-end run in a fresh kernel (13-45 s each in
#: small mode, 60 s for the first five together); their code paths are the unit
#: tests', so they run with the slow tests (`make test-slow`, which CI runs).
#: Their sources are compiled and linted in the default suite (test_build.py).
SLOW_NOTEBOOKS = tuple(os.path.basename(p) for p in NOTEBOOKS)


@pytest.mark.parametrize("path", [
    pytest.param(p, marks=pytest.mark.slow) if os.path.basename(p) in SLOW_NOTEBOOKS else p
    for p in NOTEBOOKS], ids=os.path.basename)
@pytest.mark.timeout(TIMEOUT_S)  # per notebook, kernel start included (nbclient's timeout is per cell)
def test_notebook_runs(path, kernel_env, workdir):
  nb = nbformat.read(os.path.join(workdir, os.path.basename(path)), as_version=4)
  try:
    _execute(nb, workdir)
  except nbclient.exceptions.CellExecutionError as err:
    pytest.fail(f"{os.path.basename(path)} failed:\n{err}")
  for cell in nb.cells:
    if cell.cell_type == "code":
      assert not any(o.get("output_type") == "error" for o in cell.outputs)
  assert any("small mode" in _text(c) for c in nb.cells if c.cell_type == "code")
  # Every notebook plots; the figures must have been rendered.
  assert any("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
