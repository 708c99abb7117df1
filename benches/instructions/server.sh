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
#   LAYOUT='tower_ratelimit|MapFuture' bash benches/instructions/server.sh   # and how each
#     matching function's hot code fills its lines (layout.py)
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
# shellcheck source=serve_callgrind.sh
source "$here/serve_callgrind.sh"
for scenario in $SCENARIOS; do
  serve_callgrind "$exe" "$scenario" "$work/$scenario.out" "$REQUESTS"
  python3 "$here/hot_lines.py" "$scenario" "$REQUESTS" "$work/$scenario.out".*
  if [ -n "${LAYOUT:-}" ]; then
    (cd "$here" && python3 layout.py "$exe" "$REQUESTS" "$LAYOUT" "$work/$scenario.out".*)
  fi
done
