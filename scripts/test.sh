#!/usr/bin/env bash
# The whole test suite: lint, types, then pytest against a real PostgreSQL, MariaDB and Kafka.
# The whole suite (no arguments) starts the isolated `test` stack (ports 5434/9192/3308,
# .cdc/test/) and stops it afterwards if it started it; a service that cannot start fails
# the run loudly. With arguments they go to pytest, which starts the stack itself when a
# test needs it: scripts/test.sh -m "not integration" is the fast layer (no services, no
# jars). SIGTERM (a CI timeout) ends pytest like Ctrl-C; the stack is stopped on exit.
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
if (($#)); then
  exec $V/pytest -p no:cacheprovider --durations=25 "$@"
fi
# The whole suite, in two parts, so that it fits CI's budget on 2 cores. Most tests share
# nothing (each has its own schema, slot, topics, lake and Dagster instance) and spend much
# of their time waiting on capture, Kafka and Spark start-up: they run on two workers
# (pytest-xdist; the Kafka Connect tests on one of them, and the tests of the demo source's
# fixed slot and tables on one of them). Tests marked `serial` restart a shared service or
# run the demo workload: they run afterwards, one at a time. The stack is started once for both parts and stopped at the end if this
# script started it (the workers never stop it under each other).
started="$($V/python - <<'PY'
import sys
from cdc_platform.devtools.stack import PROFILES, stack_down, stack_status, stack_up
profile = PROFILES["test"]
was_up = any(state.startswith("up") for state in stack_status(profile).values())
try:
    up = stack_up(profile)
except Exception as exc:  # the stack's own message names its log file
    if not was_up:
        stack_down(profile)  # stop what this script started, even half-way
    sys.exit(f"the test stack could not start: {exc}")
print(int(up.started_kafka or up.started_postgres or up.started_mariadb))
PY
)" || exit 1
stop_stack() { [[ "$started" == "1" ]] && $V/cdc-platform dev down --profile test >/dev/null; }
trap stop_stack EXIT
echo "== pytest, part 1 of 2: tests that share nothing, two workers"
rc=0
$V/pytest -p no:cacheprovider --durations=25 -n 2 --dist loadgroup -m "not serial" || rc=$?
echo "== pytest, part 2 of 2: serial tests (service restarts, the demo workload), one at a time"
$V/pytest -p no:cacheprovider --durations=10 -m serial || rc=$?
exit $rc
