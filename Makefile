# Every target creates/updates the project's own virtual environment first,
# so a fresh clone needs nothing but Python >= 3.10 (3.11 recommended).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
DOCS_STAMP := $(VENV)/.docs-stamp

PROFILE ?= quick
OUT ?= figures
# pytest-xdist workers: the suite keeps both cores of a 2-core machine busy
# (alone it leaves one idle between JAX's multi-threaded steps).
WORKERS ?= 2
TESTS ?=
PYTEST := $(PY) -m pytest -q -n $(WORKERS) --dist loadscope
# AVX2 code paths for numpy's SIMD dispatch, OpenBLAS and XLA: the round-off of
# a processor without AVX-512 (tests/conftest.py, "Exact only within one process").
AVX2_PATHS := NPY_DISABLE_CPU_FEATURES="X86_V4 AVX512_ICL AVX512_SPR" OPENBLAS_CORETYPE=Haswell \
              XLA_FLAGS="--xla_cpu_max_isa=AVX2"

.PHONY: venv docs test test-slow test-cpu-paths reproduce-fig7 reproduce-fig1 figures-analytic figures-profiles figures-subsampled clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

test: venv
	$(PYTEST)

# The documentation site (Sphinx, docs/conf.py) into docs/_build/html; any
# warning fails it. The docs extra installs once, like the dev one.
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

# Only the tests marked slow (the default run deselects them). pytest exits 5
# when nothing is collected, which is not a failure here: a checkout with no
# slow tests left passes.
test-slow: venv
	$(PYTEST) -m slow || test $$? -eq 5

# The default suite (or TESTS=<paths>) as on a processor without AVX-512.
test-cpu-paths: venv
	$(AVX2_PATHS) $(PYTEST) $(TESTS)

# The figures launch from experiments/ (each script holds its figure's profiles; see experiments/README.md).
# The main job: Papernot-Steinke Fig. 7 (and Koskela-Kulkarni Fig. 7), PROFILE=quick|paper.
reproduce-fig7: venv
	$(PY) experiments/fig7.py --profile $(PROFILE) --out $(OUT)
	$(PY) experiments/kk_fig7.py --profile $(PROFILE) --out $(OUT)

reproduce-fig1: venv
	$(PY) experiments/fig1.py --out $(OUT)

figures-analytic: venv
	$(PY) experiments/analytic_figures.py --out $(OUT)

figures-profiles: venv
	$(PY) experiments/profile_figures.py --out $(OUT)

figures-subsampled: venv
	$(PY) experiments/kk_fig1.py --out $(OUT)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info docs/_build docs/api/_generated docs/notebooks
