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
# The whole suite, in two parts, one after the other. Tests marked `serial` restart a service
# or run the demo workload: they run first, one at a time, on a stack of their own (profile
# `serial`), with the machine to themselves. The others share nothing (each has its own
# schema, slot, topics, lake and Dagster instance) and run on two workers (pytest-xdist; the
# Kafka Connect tests on one of them, and the tests of the demo source's fixed slot and
# tables on one of them) against the `test` stack. The serial tests used to run beside the
# others; on 2 cores that cost more than running them alone: the fault suite took 1 600 s
# there against 390 s alone for all eleven, its long-running apply holding a core all that
# time (docs/benchmarks.md, "The serial tests before the others"). Each stack is started
# when its part begins and stopped when it ends if this script started it.
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
finish() {
  local status=$?  # the run's: an EXIT trap's last command would otherwise become it
  if [[ "$started_test" == "1" ]]; then $V/cdc-platform dev down --profile test >/dev/null; fi
  if [[ "$started_serial" == "1" ]]; then $V/cdc-platform dev down --profile serial >/dev/null; fi
  return $status
}
trap finish EXIT
rc=0
started_serial="$(start_stack serial)" || exit 1
echo "== pytest, 1 of 2: the serial tests (service restarts, the demo workload), one at a time, on the serial stack"
CDC_TEST_PROFILE=serial $V/pytest -p no:cacheprovider --durations=10 -m serial || rc=$?
if [[ "$started_serial" == "1" ]]; then  # its services would idle beside the others
  $V/cdc-platform dev down --profile serial >/dev/null
  started_serial=0
fi
started_test="$(start_stack test)" || exit 1
echo "== pytest, 2 of 2: the tests that share nothing, two workers, on the test stack"
$V/pytest -p no:cacheprovider --durations=25 -n 2 --dist loadgroup -m "not serial" || rc=$?
exit $rc
