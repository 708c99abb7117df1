#!/bin/bash
# Builds one bench target (cargo bench --no-run) and prints its executable's
# path: `bash benches/instructions/bench_exe.sh load`.
set -euo pipefail
cargo bench --bench "$1" --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import sys, json
name = sys.argv[1]
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == name and m.get("executable"):
        print(m["executable"])' "$1" | tail -n 1
