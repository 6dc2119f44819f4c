#!/usr/bin/env bash
# The demo: local stack up, demo databases, a steady shop workload, and the Dagster UI.
#   scripts/demo.sh            run (the UI stays in the foreground; Ctrl-C stops UI + workload)
#   CDC_DEMO_DETACH=1 …        run the UI in the background too (used by tests and screenshots)
#   scripts/demo.sh --status   what the demo runs
#   scripts/demo.sh --stop     stop the workload and UI this script started (not the stack)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
export DAGSTER_HOME="$ROOT"
V="$ROOT/.venv/bin"
P="$ROOT/.cdc/dev"
PIDS="$P/pids"; LOGS="$P/logs"
UI_PORT="${CDC_DEMO_UI_PORT:-3000}"
RATE="${CDC_DEMO_RATE:-5}"
mkdir -p "$PIDS" "$LOGS" "$ROOT/.cdc/dagster"

# shellcheck source=scripts/procs.sh
. "$ROOT/scripts/procs.sh"
stop() {  # stop NAME: the whole process group we started (dagster dev has children)
  local pid; pid="$(alive "$1" || true)"
  if [[ -n "$pid" ]]; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    echo "stopped $1 (pid $pid)"
  fi
  rm -f "$PIDS/$1.pid"
}

PROCESSES=(workload capture-shop capture-bench capture-crm apply dagster)
case "${1:-}" in
  --status)
    for name in "${PROCESSES[@]}"; do
      pid="$(alive "$name" || true)"
      if [[ -n "$pid" ]]; then echo "$name: up (pid $pid)"; else echo "$name: down"; fi
    done
    exit 0 ;;
  --stop)
    for name in dagster apply workload capture-shop capture-bench capture-crm; do stop "$name"; done
    exit 0 ;;
esac

"$V/cdc-platform" dev up --profile dev
"$V/cdc-platform" demo setup --profile dev
set -a; . "$P/env"; set +a

if [[ -z "$(alive workload || true)" ]]; then
  setsid "$V/cdc-platform" demo load --profile dev --rate "$RATE" --seconds 0 >> "$LOGS/workload.log" 2>&1 &
  record workload $!
  echo "workload: started ($RATE tx/s; log $LOGS/workload.log)"
else
  echo "workload: already running"
fi

"$V/cdc-platform" config check
# Capture: one long-running process per source (like a Kafka Connect worker): logical
# decoding for the PostgreSQL sources, polling for the MariaDB one.
for source in shop bench crm; do
  if [[ -z "$(alive "capture-$source" || true)" ]]; then
    setsid "$V/cdc-platform" capture run --config cdc_platform.yaml --source "$source" \
      --status-file "$P/capture-$source.json" >> "$LOGS/capture-$source.log" 2>&1 &
    record "capture-$source" $!
    echo "capture $source: started (log $LOGS/capture-$source.log)"
  else
    echo "capture $source: already running"
  fi
done
# Observe every source table once now, so the UI has data before the first schedule tick.
"$V/dagster" job execute -m cdc_platform.definitions -j observe_sources >> "$LOGS/dagster-jobs.log" 2>&1 \
  || { echo "observe_sources failed; see $LOGS/dagster-jobs.log" >&2; exit 1; }
echo "observed every source table (job observe_sources)"
# The first snapshot generation of every table that has none (Spark JDBC into Delta).
"$V/cdc-platform" snapshot --all --if-missing --reason bootstrap 2>> "$LOGS/snapshot.log" \
  || { echo "snapshot failed; see $LOGS/snapshot.log and the run in the Dagster UI" >&2; exit 1; }
# The stream apply: one long-running Spark application for every source (apply.engine:
# stream): it builds current from the generation, then applies micro-batches within seconds,
# and reports current and each changelog day to the Dagster instance (runless, throttled).
if [[ -z "$(alive apply || true)" ]]; then
  setsid "$V/cdc-platform" apply --config cdc_platform.yaml --all >> "$LOGS/apply.log" 2>&1 &
  record apply $!
  echo "apply: started (every streamed source, one Spark application; log $LOGS/apply.log)"
else
  echo "apply: already running"
fi

if [[ -n "$(alive dagster || true)" ]]; then
  echo "Dagster UI already running on http://127.0.0.1:$UI_PORT"; exit 0
fi
if [[ "${CDC_DEMO_DETACH:-0}" == "1" ]]; then
  setsid "$V/dagster" dev -h 127.0.0.1 -p "$UI_PORT" -w workspace.yaml >> "$LOGS/dagster.log" 2>&1 &
  record dagster $!
  for _ in $(seq 1 120); do
    if curl -sf "http://127.0.0.1:$UI_PORT/server_info" >/dev/null 2>&1; then
      echo "Dagster UI: http://127.0.0.1:$UI_PORT (log $LOGS/dagster.log; stop with: make down)"; exit 0
    fi
    sleep 1
  done
  echo "Dagster UI did not answer on 127.0.0.1:$UI_PORT within 120 s; see $LOGS/dagster.log" >&2; exit 1
fi
trap 'for name in apply workload capture-shop capture-bench capture-crm; do stop "$name"; done' EXIT
echo "Dagster UI: http://127.0.0.1:$UI_PORT  (Ctrl-C stops the UI, the workload, capture and apply; 'make down' stops the stack)"
"$V/dagster" dev -h 127.0.0.1 -p "$UI_PORT" -w workspace.yaml
