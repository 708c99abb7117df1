#!/bin/bash
# Instructions Redis spends per EVALSHA, counted by callgrind: deterministic
# for the same binary and calls, whatever else the machine is doing. Compares
# the store's 3-window sliding-log script with the straightforward
# per-window script (BENCHMARKS.md).
#
#   bash benches/instructions/run.sh        # CALLS=20000 USERS=1000 PYTHON=...
#   ALGORITHMS="sliding_log sliding_window fixed_window token_bucket" GENERAL=1 bash benches/instructions/run.sh
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
# The scripts the store runs for a 3-window check without route-wide windows
# or block time (`cargo run --example lua`): the straight-line ones, and
# with GENERAL=1 the general ones too.
cargo build -q --release --example lua
for algorithm in ${ALGORITHMS:-sliding_log}; do
  name=${algorithm//_/-}
  target/release/examples/lua "$name" 3 > "$work/$algorithm.lua"
  layout=store
  [ "$algorithm" = sliding_log ] || layout=counter
  specs+=("$layout:$work/$algorithm.lua")
  if [ -n "${GENERAL:-}" ]; then
    target/release/examples/lua "$name" 3 --general > "$work/$algorithm-general.lua"
    specs+=("general:$work/$algorithm-general.lua")
  fi
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
