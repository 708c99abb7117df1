#!/bin/bash
# The memory path's stores in the load harness's pattern (benches/cold.rs),
# counted by cachegrind with the data caches of this machine's cores
# (32 KB L1, 512 KB L2 as the last level): per check, the instructions and
# the data lines missed at the last level, read and written, less those of
# the stream that stands in for a server's other work. Deterministic for
# the same binary.
#
#   bash benches/instructions/cold.sh                    # every store, both patterns
#   STORES="log gcra" PATTERNS=steady bash benches/instructions/cold.sh
#   EXE=/path/to/another/cold-binary bash benches/instructions/cold.sh
#
# Needs valgrind and python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
STORES=${STORES:-"governor gcra log"}
PATTERNS=${PATTERNS:-"bursts steady"}
exe=${EXE:-$(bash benches/instructions/bench_exe.sh cold)}

# Prints "instructions read-misses write-misses checks" for one run.
count() {
  valgrind --tool=cachegrind --cache-sim=yes --D1=32768,8,64 --LL=524288,8,64 \
    --cachegrind-out-file=/dev/null "$exe" "$1" "$2" 2>&1 | python3 -c '
import re, sys
text = sys.stdin.read()
num = lambda s: int(s.replace(",", ""))
refs = num(re.search(r"I\s+refs:\s+([\d,]+)", text).group(1))
ll = re.search(r"LLd misses:\s+[\d,]+\s+\(\s*([\d,]+) rd\s+\+\s+([\d,]+) wr", text)
checks = num(re.search(r": ([\d,]+) checks", text).group(1))
print(refs, num(ll.group(1)), num(ll.group(2)), checks)'
}

printf '%-9s %-7s %14s %16s %17s\n' store pattern "instr/check" "LL rd miss/check" "LL wr miss/check"
for pattern in $PATTERNS; do
  read -r base_i base_r base_w checks < <(count none "$pattern")
  for store in $STORES; do
    read -r i r w _ < <(count "$store" "$pattern")
    python3 -c "print('%-9s %-7s %14.0f %16.2f %17.2f' % ('$store', '$pattern', ($i - $base_i) / $checks, ($r - $base_r) / $checks, ($w - $base_w) / $checks))"
  done
done
