"""The docstrings' `>>>` examples run and print what they show (issue 45: doctests in CI).

One test per module of the package whose source holds an example; the docs
render these same docstrings (docs/api), so an example that drifts from the
code fails here, not in a reader's session.
"""

import doctest
import importlib
import io
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jaxdp")


def _modules_with_examples() -> list:
  """Dotted names of the package's modules whose source holds a `>>>` line (read, not imported)."""
  found = []
  for folder, _, files in os.walk(PACKAGE):
    for name in sorted(files):
      if name.endswith(".py") and ">>> " in open(os.path.join(folder, name), encoding="utf-8").read():
        rel = os.path.relpath(os.path.join(folder, name), os.path.dirname(PACKAGE))[:-3]
        found.append(rel.replace(os.sep, ".").removesuffix(".__init__"))
  return sorted(found)


MODULES = _modules_with_examples()


def test_the_package_has_examples():
  assert "jaxdp.accounting" in MODULES and len(MODULES) >= 10, MODULES


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples(module_name):
  module = importlib.import_module(module_name)
  tests = [t for t in doctest.DocTestFinder().find(module) if t.examples]
  assert tests, f"{module_name}: '>>> ' in its source, but no docstring example found"
  runner, out = doctest.DocTestRunner(optionflags=0), io.StringIO()
  for test in tests:
    runner.run(test, out=out.write)
  assert runner.failures == 0, out.getvalue()
