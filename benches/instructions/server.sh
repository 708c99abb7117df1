#!/bin/bash
# The code a real axum server runs per request, counted by callgrind: the
# load harness's servers (benches/load.rs, `--serve SCENARIO`), each driven
# over one keep-alive connection (a warm-up, then REQUESTS counted). For
# each scenario: instructions per request, and the code's hot lines (the
# 64-byte lines of code run at least once per two requests: the footprint
# a request needs in the instruction cache), in all and in the rate
# limiter's own functions. Deterministic for the same binary.
#
#   bash benches/instructions/server.sh                  # the memory scenarios
#   SCENARIOS="governor-header memory-header-gcra" REQUESTS=5000 bash benches/instructions/server.sh
#   EXE=/path/to/another/load-binary bash benches/instructions/server.sh   # another build's
#
# Needs valgrind and python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
REQUESTS=${REQUESTS:-10000}
SCENARIOS=${SCENARIOS:-"bare governor-allowed memory-allowed memory-allowed-gcra memory-allowed-noheaders governor-header memory-header memory-header-gcra"}
exe=${EXE:-$(bash benches/instructions/bench_exe.sh load)}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
here=benches/instructions
for scenario in $SCENARIOS; do
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  users=""
  case $scenario in *header*) users=--users ;; esac
  valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file="$work/$scenario.out" \
    "$exe" --serve "$scenario" "$port" redis://127.0.0.1:1 >"$work/$scenario.log" 2>&1 &
  pid=$!
  python3 "$here/http_drive.py" "$port" 3000 $users
  callgrind_control -z "$pid" >/dev/null 2>&1
  python3 "$here/http_drive.py" "$port" "$REQUESTS" $users
  callgrind_control -d "$pid" >/dev/null 2>&1
  sleep 1
  kill "$pid"; wait "$pid" 2>/dev/null || true
  python3 "$here/hot_lines.py" "$scenario" "$REQUESTS" "$work/$scenario.out".*
done
