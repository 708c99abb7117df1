#!/bin/bash
# Where a real axum server misses the core's caches per request: the load
# harness's server (benches/load.rs, `--serve SCENARIO`) built with line
# tables (the same code, into target/lines), driven over one keep-alive
# connection (a warm-up, then REQUESTS counted) under callgrind with this
# machine's caches (32 KB L1s, 512 KB L2 as the last level). Prints, per
# request, the totals (instructions, instruction-cache and data-cache
# misses), then each instruction of the rate limiter's own code (this
# crate's, tower_governor's, governor's, dashmap's and the memcmp they call)
# that misses the L1 data cache on at least one request in five, with its
# source line. Deterministic for the same binary.
#
#   bash benches/instructions/misses.sh                       # memory-header
#   SCENARIOS="governor-header memory-header" REQUESTS=3000 bash benches/instructions/misses.sh
#
# Needs valgrind, binutils' addr2line and python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
REQUESTS=${REQUESTS:-5000}
SCENARIOS=${SCENARIOS:-memory-header}
exe=$(CARGO_TARGET_DIR=target/lines CARGO_PROFILE_BENCH_DEBUG=line-tables-only \
  bash benches/instructions/bench_exe.sh load)
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
here=benches/instructions
# shellcheck source=serve_callgrind.sh
source "$here/serve_callgrind.sh"
for scenario in $SCENARIOS; do
  serve_callgrind "$exe" "$scenario" "$work/$scenario.out" "$REQUESTS" \
    --cache-sim=yes --I1=32768,8,64 --D1=32768,8,64 --LL=524288,8,64
  python3 "$here/miss_sites.py" "$scenario" "$REQUESTS" "$exe" "$work/$scenario.out".*
done
