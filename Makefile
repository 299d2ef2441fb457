# xlapy — quick start: `make demo` (JAX on xlapy, the main job) and `make test` (the tests).
# Each target creates .venv and installs what it needs by itself.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RUNTIME_STAMP := $(VENV)/.runtime-installed
TEST_STAMP := $(VENV)/.test-installed
DEMO_STAMP := $(VENV)/.demo-installed
LINT_PATHS := xlapy tests examples benchmarks

.PHONY: demo demo-hlo test lint format coverage-ops loc clean kernel-library

# pip 21.3+ installs editable from pyproject.toml (PEP 660); not `--upgrade pip`, with which
# each new pip release would change what CI runs on a clean checkout.
$(VENV)/bin/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "xlapy needs Python 3.11+"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "pip>=21.3"

$(RUNTIME_STAMP): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q -e .
	touch $@

$(TEST_STAMP): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q -e ".[test,mpi]"
	touch $@ $(RUNTIME_STAMP)

# The demo is plain JAX on the `xlapy` platform: it needs the jax/jaxlib the plugin is
# built for (the `jax` extra pins them).
$(DEMO_STAMP): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q -e ".[jax]"
	touch $@ $(RUNTIME_STAMP)

demo: $(DEMO_STAMP)
	$(PY) examples/jax_on_xlapy.py

# The earlier demo: the HLO of a training step exported from JAX, run by xlapy directly.
demo-hlo: $(RUNTIME_STAMP)
	$(PY) examples/train_mlp.py

# The CPU backend's kernel library (kernels generic in their shapes, jit/kernel_library.py):
# built on first need anyway; this builds all of it ahead for this machine and prints the cost.
kernel-library: $(RUNTIME_STAMP)
	$(PY) -m xlapy.backends.cpu.jit.kernel_library

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(PY) -m mypy

test: lint loc
	$(PY) -m pytest -n 2 --dist loadfile

loc:
	@echo "lines of Python per package:"
	@for p in xlapy/*/; do printf "  %-22s %6d\n" $$p $$(find $$p -name '*.py' -exec cat {} + | wc -l); done

format: $(TEST_STAMP)
	$(VENV)/bin/ruff check --fix $(LINT_PATHS)
	$(VENV)/bin/ruff format $(LINT_PATHS)

coverage-ops: $(TEST_STAMP)
	$(PY) -m xlapy.tools.coverage_ops

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis build *.egg-info
