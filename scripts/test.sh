#!/usr/bin/env bash
# The whole test suite: lint, types, then pytest against a real PostgreSQL and Kafka.
# pytest starts the isolated `test` stack itself (ports 5434/9192, .cdc/test/) and stops
# it afterwards if it started it; a service that cannot start fails the run loudly.
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
exec $V/pytest -p no:cacheprovider "$@"
