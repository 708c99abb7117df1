#!/bin/bash
# Instructions Redis spends per check of the store's 3-window sliding log in
# the load harness's pattern of traffic (bursts.py: 0.5 s bursts 9 s apart,
# 31 checks per user per burst over 1,000 users, batches of 12), counted by
# callgrind over one burst after WARM bursts of warm-up (run on a plain
# redis-server whose keys the counted one loads, as steady.sh does).
#
#   bash benches/instructions/bursts.sh     # WARM=8 USERS=1000 EXACT=0 SCRIPT=<a variant's batch script>
#
# Needs valgrind, redis-server and a Python with `redis`
# (benches/peers/requirements.txt).
set -euo pipefail
cd "$(dirname "$0")/../.."
WARM=${WARM:-8}
USERS=${USERS:-1000}
EXACT=${EXACT:-0}
PYTHON=${PYTHON:-.venv-bench/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cargo build -q --release --example lua
target/release/examples/lua sliding-log 3 --batched > "$work/store.lua"
cp "${SCRIPT:-$work/store.lua}" "$work/measured.lua"
port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
run() {
  "$@" --port "$port" --bind 127.0.0.1 --appendonly no --dir "$work" >/dev/null 2>&1 &
  server=$!
  until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.2; done
}
# (The warm-up always runs the store's script, so every variant is
# measured on the same logs.)
run redis-server
sha=$(redis-cli -p "$port" script load "$(cat "$work/store.lua")")
"$PYTHON" benches/instructions/bursts.py "$port" "$sha" "$EXACT" "$WARM" "$USERS" 0
redis-cli -p "$port" shutdown save >/dev/null 2>&1 || true
wait "$server" || true
run valgrind --tool=callgrind --collect-atstart=no --toggle-collect=evalShaCommand \
  --callgrind-out-file="$work/cg.out" redis-server --save ''
sha=$(redis-cli -p "$port" script load "$(cat "$work/measured.lua")")
"$PYTHON" benches/instructions/bursts.py "$port" "$sha" "$EXACT" 1 "$USERS" "$WARM"
reads=$(redis-cli -p "$port" info commandstats | sed -n 's/^cmdstat_getrange:calls=\([0-9]*\),.*/\1/p')
redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
wait "$server" || true
checks=$((31 * USERS))
total=$(grep -E '^(summary|totals):' "$work/cg.out" | head -1 | awk '{print $2}')
echo "sliding log in the harness's bursts, EXACT=$EXACT: $((total / checks)) instructions per check (12 per EVALSHA), $(awk "BEGIN { printf \"%.2f\", ${reads:-0} / $checks }") GETRANGEs per check"
