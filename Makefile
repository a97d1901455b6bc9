# Every target creates/updates the project's own virtual environment first,
# so a fresh clone needs nothing but Python >= 3.10 (3.11 recommended).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: venv test test-slow figures-analytic figures-profiles clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

test: venv
	$(PY) -m pytest -q

test-slow: venv
	$(PY) -m pytest -q -m slow

figures-analytic: venv
	$(PY) -m experiments.analytic_figures --out figures

figures-profiles: venv
	$(PY) -m experiments.profile_figures --out figures

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
