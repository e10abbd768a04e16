# `make demo` and `make test` each create .venv when missing, install softmaxkit with its
# dev extra (torch pinned to the CPU build 2.13.0 when torch is not importable), then run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint venv clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip setuptools wheel

$(STAMP): $(PY) pyproject.toml
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "torch==2.13.0"
	$(PY) -m pip install -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/softmaxkit report --quick

# the suite runs on every core (pytest-xdist; TEST_WORKERS=0 runs it in this process)
TEST_WORKERS ?= auto

test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS)

lint: $(STAMP)
	$(VENV)/bin/ruff check src
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) softmaxkit-report
