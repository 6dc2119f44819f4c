#!/usr/bin/env bash
# Benchmarks live in bench/; each prints its figures next to a baseline measured in the same run.
# bench_resources.py, bench_ui.py and bench_demo_lag.py measure the running demo: they run when it is up
# (make demo-detached), and are named as not run otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
shopt -s nullglob
benches=(bench/bench_*.py)
if ((${#benches[@]} == 0)); then
  echo "no benchmarks yet (bench/bench_*.py)"; exit 0
fi
on_demo=(bench/bench_resources.py bench/bench_ui.py bench/bench_demo_lag.py)
demo_up=false
if curl -fsS -o /dev/null --max-time 5 http://127.0.0.1:3000/server_info; then demo_up=true; fi
for b in "${benches[@]}"; do
  if [[ " ${on_demo[*]} " == *" $b "* ]] && ! $demo_up; then
    echo "== $b: NOT RUN (measures the running demo; start it with make demo-detached)"; continue
  fi
  echo "== $b"; .venv/bin/python "$b"
done
