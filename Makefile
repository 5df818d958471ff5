# Two entry points: `make serve` (service, default model, no hardware) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: serve test bench

serve: $(VENV)/.serve-installed
	EDGETPU_SERVE_HOST=$(HOST) EDGETPU_SERVE_PORT=$(PORT) $(BIN)/python -m app

test: $(VENV)/.test-installed
	$(BIN)/python -m pytest

bench: $(VENV)/.test-installed
	$(BIN)/python bench/service_overhead.py

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The service alone: no TensorFlow, no torch.
$(VENV)/.serve-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

# Tests also convert models and compare with the float PyTorch checkpoint.
$(VENV)/.test-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[convert,dev]'
	touch $@ $(VENV)/.serve-installed
