# blobmount: the one entry point for setup, demo, tests, checks and benchmarks.
# `make demo` and `make test` work on a fresh Debian machine with Python and npm.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TOOLS := .tools
AZURITE_VERSION := 3.37.0
DEBIAN_PACKAGES := fuse3 libfuse3-dev pkg-config
BENCH_DEBIAN_PACKAGES := rclone
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup system-deps venv azurite demo test test-unit test-integration test-e2e \
        test-processes lint fmt typecheck bench-deps bench bench-quick pre-pr clean

setup: system-deps venv azurite

# install_debian(packages, extra missing check): apt-get install whichever are not installed yet
define install_debian
	@missing=""; \
	for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	$(2) \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi
endef

# (a variable: the comma in the import would split $(call)'s arguments)
NEED_VENV := $(PYTHON) -c "import ensurepip, venv" 2>/dev/null || missing="$$missing python3-venv";
# npm installs Azurite; node also runs the seeding of big test datasets
NEED_NODE := command -v npm >/dev/null 2>&1 || missing="$$missing nodejs npm";

system-deps:
	$(call install_debian,$(DEBIAN_PACKAGES),$(NEED_VENV) $(NEED_NODE))

# the peers the benchmark compares with (rclone mount); not needed by the tests
bench-deps:
	$(call install_debian,$(BENCH_DEBIAN_PACKAGES))

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

# the stamp names the version, so a checkout that pins a new one reinstalls it (the seeding of
# big test datasets writes that version's database format)
AZURITE_STAMP := $(TOOLS)/.azurite-$(AZURITE_VERSION)

azurite: $(AZURITE_STAMP)

$(AZURITE_STAMP):
	mkdir -p $(TOOLS)
	npm install --prefix $(TOOLS) --no-audit --no-fund --loglevel=error azurite@$(AZURITE_VERSION)
	rm -f $(TOOLS)/.azurite-*
	touch $@

demo: setup
	$(PY) -m blobmount.testing.demo

# pytest-xdist processes for `make test` and `make test-processes` (each with its own Azurite):
# a mount test mostly waits on the mount, so 2 halve the time on 2 cores; 0 runs in one process
TEST_JOBS ?= 2
PYTEST_JOBS := $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadfile)

test: setup
	$(PY) -m pytest $(PYTEST_JOBS)

test-unit: venv
	$(PY) -m pytest tests/unit

test-integration: setup
	$(PY) -m pytest tests/integration

test-e2e: setup
	$(PY) -m pytest tests/e2e

# the tests that mount, again with every mount served by 2 processes (DATASET_MOUNT_WORKER_PROCESSES)
test-processes: setup
	BLOBMOUNT_TEST_WORKER_PROCESSES=2 $(PY) -m pytest $(PYTEST_JOBS) -m "fuse and not single_process"

lint: venv
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

fmt: venv
	$(VENV)/bin/ruff format src tests benchmarks
	$(VENV)/bin/ruff check --fix src tests benchmarks

typecheck: venv
	$(VENV)/bin/mypy

bench: setup bench-deps
	$(PY) benchmarks/run.py

bench-quick: setup bench-deps
	$(PY) benchmarks/run.py --quick

pre-pr: fmt lint typecheck test-unit

clean:
	rm -rf $(VENV) $(TOOLS) .pytest_cache .mypy_cache .ruff_cache .demo benchmarks/results

# -- release checks ---------------------------------------------------------------------------
.PHONY: deps-check wheel-smoke

# every module src/ imports is a declared dependency, and every declared one is used ([tool.deptry])
deps-check: venv
	$(VENV)/bin/deptry src

# build the sdist and the wheel, install the wheel into a clean venv, mount the demo with it
wheel-smoke: setup
	.ci/wheel-smoke

# the release's sdist and wheel in dist/ (what docker/Dockerfile installs); old ones removed
.PHONY: dist
dist: venv
	rm -rf dist
	$(PY) -m build --outdir dist .
