"""Sphinx configuration of jaxdp's documentation (`make docs`; Read the Docs: .readthedocs.yaml).

The API reference is generated here from each public package's `__all__`
(docs/api/_generated, not committed), so a name added to an `__all__` is
documented without editing the docs, and one without a docstring or with a
malformed one fails the build (`-W`). The notebooks are rendered as they are
committed, without executing them: the slow tests execute them.
"""

import os
import sys

DOCS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(DOCS)
sys.path.insert(0, ROOT)
sys.path.insert(0, DOCS)

import _apigen  # noqa: E402  (docs/_apigen.py, found through the path set above)

project = "jaxdp"
author = "the jaxdp authors"
copyright = "the jaxdp authors"  # noqa: A001  (Sphinx's configuration name)
release = version = "0.1.0"

# No intersphinx: a build must never need the network (CI has none).
extensions = [
    "myst_nb",  # Markdown pages (MyST) and .ipynb notebooks
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",  # the docstrings are Google style (Args / Returns / Raises)
    "sphinx.ext.mathjax",
]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "**/.ipynb_checkpoints"]
root_doc = "index"

# The notebooks are executed by the slow tests (tests/notebooks), with a small
# profile; the docs show them as committed and never run them.
nb_execution_mode = "off"
myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
# Methods that only implement dp_accounting's PrivacyAccountant interface are documented there.
autodoc_inherit_docstrings = False
autodoc_class_signature = "separated"

autosummary_generate = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_attr_annotations = True
# An "Attributes:" section becomes fields of its class, not attribute entries
# that autodoc's members would describe a second time.
napoleon_use_ivar = True
# The docstrings quote code in single backticks, as in Markdown.
default_role = "code"

html_theme = "furo"
html_title = "jaxdp"


def _copy_notebooks() -> None:
  """docs/notebooks/<name>.ipynb from notebooks/: Sphinx reads only the source directory."""
  src, dst = os.path.join(ROOT, "notebooks"), os.path.join(DOCS, "notebooks")
  os.makedirs(dst, exist_ok=True)
  for name in sorted(os.listdir(src)):
    if name.endswith(".ipynb"):
      _write_if_changed(os.path.join(dst, name), open(os.path.join(src, name), "rb").read())


def _write_if_changed(path: str, data: bytes) -> None:
  # An unchanged file keeps its mtime, so an incremental build re-reads nothing.
  if not os.path.exists(path) or open(path, "rb").read() != data:
    with open(path, "wb") as f:
      f.write(data)


_copy_notebooks()
_apigen.write_api_pages(os.path.join(DOCS, "api", "_generated"))
