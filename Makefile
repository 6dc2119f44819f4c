# The two commands (see README):
#   make demo   — install everything, start the local stack, the demo workload and the Dagster UI
#   make test   — install everything, run lint, type checks and the whole test suite
SHELL := /bin/bash
.DEFAULT_GOAL := help
export DAGSTER_HOME := $(CURDIR)

.PHONY: help bootstrap demo demo-detached test test-fast bench down status screenshot faults

help:
	@echo "make demo    # stack + demo workload + Dagster UI on http://127.0.0.1:3000"
	@echo "make test    # ruff, mypy, pytest against a real PostgreSQL + MariaDB + Kafka"
	@echo "make test-fast  # ruff, mypy and the fast layer: no services, no jars (under a minute)"
	@echo "make bench   # benchmarks (bench/), ratios against a baseline in the same run"
	@echo "make status  # what runs;  make down  # stop what the demo started"

bootstrap:
	@bash scripts/bootstrap.sh

demo: bootstrap
	@bash scripts/demo.sh

demo-detached: bootstrap
	@CDC_DEMO_DETACH=1 bash scripts/demo.sh

test: bootstrap
	@bash scripts/test.sh

test-fast:
	@bash scripts/bootstrap.sh --python-only
	@bash scripts/test.sh -m "not integration"

bench: bootstrap
	@bash scripts/bench.sh

faults: bootstrap  # fault injection on the dev stack under a steady workload, then verify (~10 min)
	@.venv/bin/cdc-platform dev up --profile dev >/dev/null
	@.venv/bin/cdc-platform faults --profile dev

screenshot:  # the README's picture of the running demo UI (make demo-detached first)
	@.venv/bin/cdc-platform demo screenshot --out docs/demo-ui.png

status:
	@.venv/bin/cdc-platform dev status --profile dev
	@bash scripts/demo.sh --status

down:
	@bash scripts/demo.sh --stop
	@.venv/bin/cdc-platform dev down --profile dev
