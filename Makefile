# Two entry points that work on a fresh machine: `make test` and `make demo`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo clean

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

clean:
	rm -rf $(VENV) build *.egg-info
