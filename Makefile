# Two entry points that work on a fresh machine: `make test` and `make demo`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo wheel clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $(STAMP)

# One worker per core: the suite is bound by gcc compiling each test's kernels, one
# process at a time; a test file stays on one worker, which keeps its fixtures.
test: $(STAMP)
	$(PY) -m pytest -q -n auto --dist loadfile

demo: $(STAMP)
	$(PY) -m treadle.demo

# A pure-Python wheel in dist/, for `pip install dist/treadle-*.whl` (extras as for `pip
# install .`). build/ goes first: setuptools keeps modules deleted since in it, and they
# would enter the wheel.
wheel:
	rm -rf build
	$(PYTHON) -m pip wheel --no-deps --wheel-dir dist .

clean:
	rm -rf $(VENV) build dist *.egg-info
