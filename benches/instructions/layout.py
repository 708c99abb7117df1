"""How well the hot code of each function fills its cache lines: reads a
callgrind dump made with --dump-instr=yes over REQUESTS requests and the
binary's disassembly (objdump), and prints, for each function whose name
matches PATTERN (a regular expression) and that runs at least once per
two requests:

- its hot lines (64-byte lines of code holding an instruction run at
  least once per two requests, as hot_lines.py counts them);
- its hot code, in lines' worth of bytes (what those lines would take if
  the hot instructions were packed together);
- the rare code laid out between its first and last hot instruction, in
  lines' worth of bytes: code a request skips but the instruction cache
  still holds beside the code it runs.

Each instance of a generic function (one per type it is made for) is a
row of its own: they share a name, not their code.

A function with much rare code between its hot blocks is one whose rare
branches could go out of line (round 23 in benches/HISTORY.md).

    python3 layout.py EXE REQUESTS PATTERN FILE...

server.sh runs it for each scenario when LAYOUT=PATTERN is set."""
import bisect
import re
import subprocess
import sys
from collections import defaultdict

from callgrind_dump import own_events

LINE = 64


def instructions(exe, lo, hi):
    """The start addresses of the instructions from `lo` to `hi` (inclusive),
    and the address after the last one."""
    text = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", f"--start-address={lo}",
         f"--stop-address={hi + 16}", exe],
        capture_output=True, text=True, check=True).stdout
    starts = [int(m.group(1), 16) for m in re.finditer(r"^\s+([0-9a-f]+):", text, re.M)]
    inside = [a for a in starts if lo <= a <= hi]
    after = next((a for a in starts if a > hi), hi + 1)
    return inside, after


def symbol_starts(exe):
    """The sorted start addresses of the binary's code symbols: one
    function's instances (its monomorphizations) share a name, and are
    told apart by where they start."""
    text = subprocess.run(["nm", "--defined-only", exe],
                          capture_output=True, text=True, check=True).stdout
    return sorted({int(f[0], 16) for f in (line.split() for line in text.splitlines())
                   if len(f) >= 3 and f[1] in "tTwW"})


def main():
    exe, requests, pattern = sys.argv[1], int(sys.argv[2]), re.compile(sys.argv[3])
    starts = symbol_starts(exe)
    runs = defaultdict(int)
    by_function = defaultdict(list)
    for (fn, addr), events in own_events(sys.argv[4:]).items():
        if fn and events:
            runs[addr] += events[0]
            if pattern.search(fn):
                instance = starts[max(bisect.bisect_right(starts, addr) - 1, 0)]
                by_function[(fn, instance)].append(addr)
    rows = []
    for (fn, _), addrs in by_function.items():
        hot = sorted(a for a in addrs if runs[a] >= requests / 2)
        if not hot:
            continue
        inside, after = instructions(exe, hot[0], hot[-1])
        ends = inside[1:] + [after]
        hot_bytes = rare_bytes = 0
        for start, end in zip(inside, ends):
            if runs.get(start, 0) >= requests / 2:
                hot_bytes += end - start
            else:
                rare_bytes += end - start
        lines = {a // LINE for a in hot}
        rows.append((len(lines), hot_bytes / LINE, rare_bytes / LINE, fn))
    rows.sort(reverse=True)
    print(f"{'hot lines':>9} {'hot code':>9} {'rare code between':>18}  function (each instance)")
    for lines, hot, rare, fn in rows:
        print(f"{lines:9d} {hot:9.1f} {rare:18.1f}  {fn[:110]}")
    print(f"{sum(r[0] for r in rows):9d} {sum(r[1] for r in rows):9.1f} "
          f"{sum(r[2] for r in rows):18.1f}  (all of the above)")


if __name__ == "__main__":
    main()
