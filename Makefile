# Two entry points: `make serve` (service, default model, no hardware) and `make test` (every test;
# `make test-fast` leaves out the `slow` ones, for local iteration). Both set up what they need.
# `make images` builds the Docker images offline (docs/images.md).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: serve test test-fast debian-packages bench images

serve: $(VENV)/.serve-installed
	EDGETPU_SERVE_HOST=$(HOST) EDGETPU_SERVE_PORT=$(PORT) $(BIN)/python -m app

test: $(VENV)/.test-installed debian-packages
	$(BIN)/python -m pytest

# Without the `slow` tests (model conversions and rebuilds, the benchmark scripts): minutes less.
test-fast: $(VENV)/.test-installed debian-packages
	$(BIN)/python -m pytest -m 'not slow and not edgetpu'

# The Debian packages the tests need, listed once in tests/debian-packages.txt; installs the missing
# ones (as root, or with sudo), does nothing when all are there.
debian-packages:
	bash tests/install-debian-packages.sh tests/debian-packages.txt

# edgetpu-serve:latest (x86-64) and edgetpu-serve:devboard (arm64, through QEMU): debootstrap'd
# base, hash-pinned wheelhouse, the runtime files of docker/runtime/ checked by sha256, builds
# with --network=none. IMAGES=latest (a USB Accelerator or a PCIe card), IMAGES=devboard: one of them.
# As root on Debian or Ubuntu; a Docker engine already here is used as it is (docker/tools/host.sh).
IMAGES ?= latest devboard
images:
	PYTHON=$(PYTHON) bash docker/tools/host.sh $(IMAGES)
	PYTHON=$(PYTHON) bash docker/tools/images.sh $(IMAGES)

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
