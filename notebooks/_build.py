"""Writes each tutorial notebook <name>.ipynb from its source <name>.py (no outputs stored).

The sources are Jupytext percent-format scripts: `# %%` opens a code cell and
`# %% [markdown]` a text cell whose lines are commented out. Edit the .py
files, never the .ipynb files, then rerun:

  python notebooks/_build.py          # (re)write every notebook
  python notebooks/_build.py --check  # exit 1 if a notebook differs from its source,
                                      # or a source has no notebook or the reverse

Jupytext reads the cells; this script adds what a plain `jupytext --to ipynb`
would not: the two cells every notebook shares, kept once in `_setup.py` (the
one that installs jaxdp inside Colab, the one that reads
JAXDP_NOTEBOOK_SMALL=1), inserted after each source's title cell (which holds
its Colab badge); one set of notebook metadata (kernel, Colab); and
deterministic cell ids, so regenerating changes nothing.
"""

from __future__ import annotations

import glob
import os
import sys

import jupytext
import nbformat

HERE = os.path.dirname(os.path.abspath(__file__))
SETUP = os.path.join(HERE, "_setup.py")
FORMAT = "py:percent"
METADATA = {
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
    "colab": {"provenance": []},
}


def sources(directory: str = HERE) -> list[str]:
  """The notebook sources: every .py in `directory` whose name does not start with `_`."""
  return sorted(p for p in glob.glob(os.path.join(directory, "*.py")) if not os.path.basename(p).startswith("_"))


def setup_cells(directory: str = HERE) -> list:
  """The shared cells of `_setup.py` (its cells start at its first `# %%`)."""
  with open(os.path.join(directory, os.path.basename(SETUP)), encoding="utf-8") as f:
    text = f.read()
  return jupytext.reads(text[text.index("# %%"):], fmt=FORMAT).cells


def render(source: str) -> str:
  """The text of the .ipynb that `source` (a percent-format .py path) produces."""
  name = os.path.splitext(os.path.basename(source))[0]
  with open(source, encoding="utf-8") as f:
    nb = jupytext.reads(f.read(), fmt=FORMAT)
  nb.cells[1:1] = setup_cells(os.path.dirname(source))
  nb.nbformat, nb.nbformat_minor = 4, 5
  nb.metadata = METADATA
  for i, cell in enumerate(nb.cells):
    cell.id = f"{name[:2]}-{i:02d}"  # deterministic ids: regenerating changes nothing
  nbformat.validate(nb)
  return nbformat.writes(nb) + "\n"


def unpaired(directory: str = HERE) -> list[str]:
  """Sources without a notebook and notebooks without a source."""
  py = {os.path.splitext(p)[0] for p in sources(directory)}
  ipynb = {os.path.splitext(p)[0] for p in glob.glob(os.path.join(directory, "*.ipynb"))}
  return sorted([s + ".py (no notebook)" for s in py - ipynb] + [s + ".ipynb (no source)" for s in ipynb - py])


def main(argv) -> int:
  check = "--check" in argv
  stale = []
  for source in sources():
    path = os.path.splitext(source)[0] + ".ipynb"
    text = render(source)
    if check:
      if os.path.exists(path) and open(path, encoding="utf-8").read() != text:
        stale.append(path)
      continue
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
    print(f"wrote {path}")
  problems = stale + unpaired()  # after writing, only notebooks without a source are left
  if problems:
    print("out of date (edit notebooks/<name>.py, then run python notebooks/_build.py):", *problems, sep="\n  ")
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
