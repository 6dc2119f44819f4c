#!/usr/bin/env bash
# The whole test suite: lint, types, then pytest against a real PostgreSQL, MariaDB and Kafka.
# pytest starts the isolated `test` stack itself (ports 5434/9192/3308, .cdc/test/) and stops
# it afterwards if it started it; a service that cannot start fails the run loudly.
# Arguments go to pytest: scripts/test.sh -m "not integration" is the fast layer (no
# services, no jars). SIGTERM (a CI timeout) ends pytest like Ctrl-C: it stops the stack.
set -euo pipefail
cd "$(dirname "$0")/.."
V=.venv/bin
echo "== ruff check"
$V/ruff check cdc_platform cdc_platform_tests bench
echo "== ruff format --check"
$V/ruff format --check cdc_platform cdc_platform_tests bench
echo "== mypy (strict) on cdc_platform/"
$V/mypy
echo "== pytest"
# -p no:cacheprovider: CI runs from a fresh clone; nothing to cache between runs
# --durations: the slowest tests are printed, so a slow suite is visible
exec $V/pytest -p no:cacheprovider --durations=25 "$@"
