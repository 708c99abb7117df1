#!/bin/bash
# Instructions Redis spends per EVALSHA of the store's 3-window sliding log
# in steady traffic, where the 1 s window's start moves at most checks:
# RATE checks a second over USERS users on an injected clock (80 a second
# per user by default, as in the load harness), after WARM checks of
# warm-up. The warm-up runs on a plain redis-server, whose keys are saved
# and loaded by the one callgrind then counts, so only the measured checks
# are counted, and every run counts the same calls (benches/HISTORY.md, round 12).
#
#   bash benches/instructions/steady.sh     # WARM=100000 CALLS=20000 USERS=1000 RATE=80000 TAIL=344 BATCH=1 EXACT=0
#
# RATE=0: the checks read the server's clock (TIME), as the store's do,
# and come as fast as the driver sends them (far slower under callgrind
# than in the warm-up, so their logs are not the steady ones above): for
# comparing two scripts on that path.
# BATCH: checks per call; above 1, the batch script (`lua ... --batched`),
# as the store sends the checks of one scheduler tick, and the figure is
# per check.
# TAIL: the bytes of the script's long first read (the 88-byte trailer and
# 32 entries), which it makes when every window is counted exactly (EXACT=1)
# or one has a limit of at most 32; another value measures a longer or
# shorter one. (Otherwise it reads the trailer and the newest entry, 96
# bytes, whatever TAIL is: drive.py's limits are 1,000,000.)
# EXACT=1: every window counted exactly (as the layer asks under the IETF
# headers); by default 0, as under the X-RateLimit-* headers, where a
# window that can neither deny nor constrain is not searched.
# Needs valgrind, redis-server and a Python with `redis`
# (benches/peers/requirements.txt).
set -euo pipefail
cd "$(dirname "$0")/../.."
WARM=${WARM:-100000}
CALLS=${CALLS:-20000}
USERS=${USERS:-1000}
RATE=${RATE:-80000}
TAIL=${TAIL:-344}
EXACT=${EXACT:-0}
BATCH=${BATCH:-1}
batched=
if [ "$BATCH" -gt 1 ]; then batched=--batched; fi
PYTHON=${PYTHON:-.venv-bench/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cargo build -q --release --example lua
# SCRIPT: a file to measure instead of the store's script (a variant
# under study).
if [ -n "${SCRIPT:-}" ]; then cat "$SCRIPT"; else target/release/examples/lua sliding-log 3 $batched; fi \
  | sed -e "s/read, from = 344, '-344'/read, from = $TAIL, '-$TAIL'/" > "$work/script.lua"
port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
run() {
  # (Both servers keep their keys in $work; only the first saves them.)
  "$@" --port "$port" --bind 127.0.0.1 --appendonly no --dir "$work" >/dev/null 2>&1 &
  server=$!
  until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.2; done
  sha=$(redis-cli -p "$port" script load "$(cat "$work/script.lua")")
}
run redis-server
"$PYTHON" benches/instructions/drive.py "$port" "$sha" "$WARM" "$USERS" store 0 "$RATE" "$BATCH"
redis-cli -p "$port" shutdown save >/dev/null 2>&1 || true
wait "$server" || true
run valgrind --tool=callgrind --collect-atstart=no --toggle-collect=evalShaCommand \
  --callgrind-out-file="$work/cg.out" redis-server --save ''
"$PYTHON" benches/instructions/drive.py "$port" "$sha" "$CALLS" "$USERS" store "$WARM" "$RATE" "$BATCH"
reads=$(redis-cli -p "$port" info commandstats | sed -n 's/^cmdstat_getrange:calls=\([0-9]*\),.*/\1/p')
redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
wait "$server" || true
total=$(grep -E '^(summary|totals):' "$work/cg.out" | head -1 | awk '{print $2}')
echo "sliding log, EXACT=$EXACT, long read of $TAIL bytes, $((RATE / USERS)) checks/s per user: $((total / CALLS)) instructions per check ($BATCH per EVALSHA), $(awk "BEGIN { printf \"%.2f\", ${reads:-0} / $CALLS }") GETRANGEs per check"
