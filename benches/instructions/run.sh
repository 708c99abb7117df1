#!/bin/bash
# Instructions Redis spends per EVALSHA, counted by callgrind: deterministic
# for the same binary and calls, whatever else the machine is doing. Compares
# the store's 3-window sliding-log script with the straightforward
# per-window script (BENCHMARKS.md).
#
#   bash benches/instructions/run.sh        # CALLS=20000 USERS=1000 PYTHON=...
#   ALGORITHMS="sliding_log sliding_window fixed_window token_bucket" bash benches/instructions/run.sh
#
# Needs valgrind, redis-server and a Python with `redis`
# (benches/peers/requirements.txt).
set -euo pipefail
cd "$(dirname "$0")/../.."
CALLS=${CALLS:-20000}
USERS=${USERS:-1000}
PYTHON=${PYTHON:-.venv-bench/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
specs=()
for algorithm in ${ALGORITHMS:-sliding_log}; do
  # The same files, in the same order, as src/store/redis.rs puts together.
  case $algorithm in
    sliding_log) parts="sliding_log" ;;
    *) parts="counter_state $algorithm" ;;
  esac
  for part in prelude $parts; do cat "scripts/$part.lua"; done > "$work/$algorithm.lua"
  specs+=("store:$work/$algorithm.lua")
done
specs+=(per-window:scripts/per_window_baseline.lua)
for spec in "${specs[@]}"; do
  layout=${spec%%:*}
  file=${spec#*:}
  port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  valgrind --tool=callgrind --collect-atstart=no --toggle-collect=evalShaCommand \
    --callgrind-out-file="$work/cg.out" \
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 &
  server=$!
  until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.2; done
  sha=$(redis-cli -p "$port" script load "$(cat "$file")")
  "$PYTHON" benches/instructions/drive.py "$port" "$sha" "$CALLS" "$USERS" "$layout"
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$server" || true
  total=$(grep -E '^(summary|totals):' "$work/cg.out" | head -1 | awk '{print $2}')
  echo "$(basename "$file" .lua) ($layout layout): $((total / CALLS)) instructions per EVALSHA"
done
