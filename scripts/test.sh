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
# The whole suite, in two parts that run at once, so that it fits CI's budget on 2 cores.
# Most tests share nothing (each has its own schema, slot, topics, lake and Dagster
# instance): part 1 runs them on two workers (pytest-xdist; the Kafka Connect tests on one
# of them, and the tests of the demo source's fixed slot and tables on one of them) against
# the `test` stack. Tests marked `serial` restart a service or run the demo workload: part 2
# runs them one at a time on a stack of their own (profile `serial`), beside part 1. The
# serial tests wait on restarts and recoveries much of the time, so beside part 1 they
# cost less wall time than after it. Each stack is started once and stopped at the end if
# this script started it (the workers never stop it under each other).
start_stack() {
  $V/python - "$1" <<'PY'
import sys
from cdc_platform.devtools.stack import PROFILES, stack_down, stack_status, stack_up
profile = PROFILES[sys.argv[1]]
was_up = any(state.startswith("up") for state in stack_status(profile).values())
try:
    up = stack_up(profile)
except Exception as exc:  # the stack's own message names its log file
    if not was_up:
        stack_down(profile)  # stop what this script started, even half-way
    sys.exit(f"the {profile.name} stack could not start: {exc}")
print(int(up.started_kafka or up.started_postgres or up.started_mariadb))
PY
}
started_test=0
started_serial=0
serial_pid=""
serial_log="$(mktemp)"
finish() {
  [[ -n "$serial_pid" ]] && kill "$serial_pid" 2>/dev/null && wait "$serial_pid" 2>/dev/null
  [[ "$started_test" == "1" ]] && $V/cdc-platform dev down --profile test >/dev/null
  [[ "$started_serial" == "1" ]] && $V/cdc-platform dev down --profile serial >/dev/null
  rm -f "$serial_log"
}
trap finish EXIT
started_test="$(start_stack test)" || exit 1
started_serial="$(start_stack serial)" || exit 1
echo "== pytest, part 2 of 2 (started first, in the background): serial tests (service restarts, the demo workload), one at a time, on the serial stack"
CDC_TEST_PROFILE=serial $V/pytest -p no:cacheprovider --durations=10 -m serial >"$serial_log" 2>&1 &
serial_pid=$!
echo "== pytest, part 1 of 2: tests that share nothing, two workers, on the test stack"
rc=0
$V/pytest -p no:cacheprovider --durations=25 -n 2 --dist loadgroup -m "not serial" || rc=$?
serial_rc=0
wait "$serial_pid" || serial_rc=$?
serial_pid=""
echo "== pytest, part 2 of 2: its output"
cat "$serial_log"
((serial_rc == 0)) || rc=$serial_rc
exit $rc
