# Two commands do everything on a fresh Debian 12 machine with Python 3.11 (as root):
#   make run    install what the loop needs, then run the whole control plane on embedded defaults
#   make test   install (system packages included), then run the whole suite
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
# Two installs, one stamp each: `make run` needs only what the embedded loop imports
# (NVML bindings, no cloud SDKs, no test tooling); `make test` adds every extra. A venv made by
# `make run` is upgraded by `make test`; the full install also satisfies `make run`.
STAMP     := $(VENV)/.installed-all
RUN_STAMP := $(VENV)/.installed-run
EXTRAS    := aws,gcp,azure,gpu,opa,dev
RUN_EXTRAS := gpu
PIP       := $(BIN)/pip --quiet --disable-pip-version-check

.PHONY: run test lint typecheck reliability bench install system-deps clean

$(BIN)/python:
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; install Python 3.11 (apt-get install python3.11 python3.11-venv)"; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(RUN_STAMP): pyproject.toml | $(BIN)/python
	$(PIP) install -e ".[$(RUN_EXTRAS)]"
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml | $(BIN)/python
	$(PIP) install --upgrade pip
	$(PIP) install -e ".[$(EXTRAS)]"
	touch $(STAMP) $(RUN_STAMP)

install: $(STAMP)

# System packages the tests need (PostgreSQL, Slurm, Packer, Chromium, ...): each
# scripts/ensure-*.sh checks first and installs only what is missing.
system-deps:
	@for script in scripts/ensure-*.sh; do bash "$$script" || exit 1; done

# Ctrl-C stops it: the local agents it started drain and stop first (it says so).
run: $(RUN_STAMP)
	$(BIN)/autoscaler up

# PYTEST_ARGS passes extra options, e.g. PYTEST_ARGS="-k agent", or "-n 0" to run serially.
PYTEST_ARGS ?=
# Tests mostly wait (servers, agents, CLI processes), so more workers than cores pays:
# docs/testing.md, "Suite time", has the measurements. Tests that share something of the
# whole machine run on one worker each (tests/xdist_groups.py, through --dist loadgroup).
TEST_WORKERS ?= 3

# Lint first: a landing that breaks ruff, mypy --strict or the import layers fails here.
test: $(STAMP) system-deps lint
	$(BIN)/python -m pytest -m "not slow" -q -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

reliability: $(STAMP) system-deps
	$(BIN)/python -m pytest -m slow -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check autoscaler providers tests bench
	$(BIN)/ruff format --check autoscaler providers tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
