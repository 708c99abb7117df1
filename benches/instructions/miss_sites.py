"""Reads callgrind dumps made with --dump-instr=yes --cache-sim=yes over
REQUESTS requests and prints, per request, the totals and the rate
limiter's instructions that miss the L1 data cache on at least one request
in five, each with its source line (addr2line on EXE, built with line
tables).

    python3 miss_sites.py NAME REQUESTS EXE FILE..."""
import re
import subprocess
import sys

from callgrind_dump import own_events

OWN = re.compile(r"tower_ratelimit|governor|dashmap|memcmp")
EVENTS = "Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw".split()


def read(paths):
    """Events per instruction address of the limiter's own code, the
    function of each, and the totals over every function."""
    cost, fn_of, totals = {}, {}, [0] * len(EVENTS)
    for (fn, addr), events in own_events(paths).items():
        events = (events + [0] * len(EVENTS))[: len(EVENTS)]
        for i, v in enumerate(events):
            totals[i] += v
        if fn and OWN.search(fn):
            cost[addr] = events
            fn_of[addr] = fn
    return cost, fn_of, totals


name, requests, exe = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cost, fn_of, totals = read(sys.argv[4:])
per = {e: t / requests for e, t in zip(EVENTS, totals)}
own = [sum(c[i] for c in cost.values()) / requests for i in range(len(EVENTS))]
print(f"{name}: per request {per['Ir']:.0f} instructions, {per['I1mr']:.1f} instruction-cache "
      f"misses, {per['D1mr']:.1f} data reads and {per['D1mw']:.1f} data writes missing L1; "
      f"the limiter's own code: {own[4]:.1f} reads and {own[5]:.1f} writes missing L1")
sites = [(a, c) for a, c in cost.items() if (c[4] + c[5]) / requests >= 0.2]
sites.sort(key=lambda s: -(s[1][4] + s[1][5]))
for addr, c in sites:
    where = subprocess.run(["addr2line", "-i", "-e", exe, hex(addr)],
                           capture_output=True, text=True).stdout.split("\n")
    # (The innermost frame and the crate's own frame around it.)
    frames = [w.split("/src/", 1)[-1] for w in where if w][:3]
    print(f"  {c[4] / requests:4.1f} read {c[5] / requests:4.1f} write  "
          f"{fn_of[addr][:60]:60}  {' <- '.join(frames)}")
