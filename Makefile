# slurm-elastic — the two commands a newcomer needs are `make demo` and `make test`.
# Both do their own set-up on a fresh Debian 12 machine (as root): Debian packages,
# this package with its extras, and the local Slurm cluster.

PYTHON ?= python3
NODES ?= 4
# Slurm version of `make demo` / `make cluster-up` (22.05: the host's; 24.11: Debian 13's,
# the default; 26.05: Debian unstable's).  `make test` runs every version.
SLURM ?= 24.11
# The legs `make test` runs, in order (scripts/test-matrix.sh): the tests that need no
# cluster, a Slurm version each, and the pyslurm backend inside the 24.11 root.
TEST_LEGS ?= unit 22.05 24.11 26.05 parser-24.11 pyslurm-24.11
# Which local cluster instance (0..7) cluster-up/test use; instance 0 is /etc/slurm/slurm.conf.
INSTANCE ?= $(or $(SLURM_ELASTIC_TEST_INSTANCE),0)
export PYTHONUNBUFFERED := 1
# The pytest fixture (tests/slurm_cluster.py) uses the instance and size brought up here.
export SLURM_ELASTIC_TEST_INSTANCE := $(INSTANCE)
export SLURM_ELASTIC_TEST_NODES := $(NODES)

.PHONY: help setup cluster-up cluster-down cluster-status test test-unit lint demo bench clean

help:
	@echo "make demo          bring up a local Slurm cluster (SLURM=$(SLURM)), run the daemon and a mixed elastic workload"
	@echo "make test          the whole suite on Slurm 22.05, the live-cluster tests on 24.11 and 26.05"
	@echo "make test-unit     tests that need no cluster"
	@echo "make cluster-up    start the local cluster (SLURM=$(SLURM) NODES=$(NODES))"
	@echo "make cluster-down  stop every local cluster"
	@echo "make lint          ruff, mypy and the package graph's import contracts (lint-imports)"

setup:
	PYTHON=$(PYTHON) bash scripts/install-deps.sh

cluster-up: setup
	bash scripts/cluster.sh up --slurm $(SLURM) --nodes $(NODES) --instance $(INSTANCE)

cluster-down:
	bash scripts/cluster.sh down --all

cluster-status:
	bash scripts/cluster.sh status --slurm $(SLURM) --instance $(INSTANCE)

lint:
	$(PYTHON) -m ruff check slurm_elastic tests scripts examples
	$(PYTHON) -m ruff format --check slurm_elastic tests scripts examples
	$(PYTHON) -c "from importlinter.cli import lint_imports_command; lint_imports_command()"
	$(PYTHON) -m mypy

test: setup lint
	PYTHON=$(PYTHON) bash scripts/test-matrix.sh --instance $(INSTANCE) --legs "$(TEST_LEGS)"

test-unit: setup
	$(PYTHON) -m pytest -q -m "not slurm" tests

demo: cluster-up
	$(PYTHON) -m slurm_elastic.demo --slurm $(SLURM) --instance $(INSTANCE)

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache demo-out sim-out
