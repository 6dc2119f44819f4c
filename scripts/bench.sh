#!/usr/bin/env bash
# Benchmarks live in bench/; each prints its figures next to a baseline measured in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
shopt -s nullglob
benches=(bench/bench_*.py)
if ((${#benches[@]} == 0)); then
  echo "no benchmarks yet (bench/bench_*.py)"; exit 0
fi
for b in "${benches[@]}"; do
  echo "== $b"; .venv/bin/python "$b"
done
