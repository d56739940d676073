# Two commands do everything on a fresh Debian 12 machine with Python 3.11 (as root):
#   make run    install, then run the whole control plane on embedded defaults
#   make test   install (system packages included), then run the whole suite
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXTRAS := aws,gcp,azure,gpu,opa,dev

.PHONY: run test lint typecheck reliability bench install system-deps clean

$(BIN)/python:
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; install Python 3.11 (apt-get install python3.11 python3.11-venv)"; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[$(EXTRAS)]"
	touch $(STAMP)

install: $(STAMP)

# System packages the tests need (PostgreSQL, Slurm, Packer, Chromium, ...): each
# scripts/ensure-*.sh checks first and installs only what is missing.
system-deps:
	@for script in scripts/ensure-*.sh; do bash "$$script" || exit 1; done

run: $(STAMP)
	$(BIN)/autoscaler up

# PYTEST_ARGS passes extra options, e.g. PYTEST_ARGS="-n 2 --dist loadgroup" or "-k agent".
PYTEST_ARGS ?=

test: $(STAMP) system-deps
	$(BIN)/python -m pytest -m "not slow" -q $(PYTEST_ARGS)

reliability: $(STAMP) system-deps
	$(BIN)/python -m pytest -m slow -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check autoscaler providers tests bench
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
