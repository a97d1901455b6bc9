"""The usage examples in jaxdp.accounting's docstrings print real numbers: run them."""

import doctest
import importlib
import pkgutil

import pytest

import jaxdp.accounting

MODULES = sorted(m.name for m in pkgutil.iter_modules(jaxdp.accounting.__path__, "jaxdp.accounting."))


@pytest.mark.parametrize("name", ["jaxdp.accounting"] + MODULES)
def test_docstring_examples(name):
  result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
  assert result.failed == 0, f"{result.failed} docstring example(s) of {name} failed"
