"""Reads a callgrind dump made with --dump-instr=yes over REQUESTS requests
and prints instructions per request and the hot lines of code (64-byte
lines whose instructions ran at least REQUESTS / 2 times), in all and in
the rate limiter's own functions (this crate's; tower_governor's and
governor's, with dashmap under them).

    python3 hot_lines.py NAME REQUESTS FILE..."""
import collections
import re
import sys

OWN = ("tower_ratelimit", "governor", "dashmap")


def costs(path):
    """Self instructions per (function, instruction address)."""
    names = {}
    cost = collections.Counter()
    fn, addr, after_call = None, 0, False
    for line in open(path, errors="replace"):
        if line.startswith(("fn=", "cfn=")):
            m = re.match(r"c?fn=\((\d+)\)(?: (.*))?", line.rstrip("\n"))
            if m and m.group(2):
                names[m.group(1)] = m.group(2)
            if m and line.startswith("fn="):
                fn = names.get(m.group(1))
            continue
        if line.startswith("calls="):
            after_call = True
            continue
        if line[:1] not in "0123456789+-*":
            continue
        fields = line.split()
        a = fields[0]
        if a.startswith("0x"):
            addr = int(a, 16)
        elif a[0] in "+-":
            addr += int(a)
        if after_call:
            # (The inclusive cost of a call, not this function's own.)
            after_call = False
            continue
        if len(fields) > 2:
            cost[(fn, addr)] += int(fields[2])
    return cost


name, requests = sys.argv[1], int(sys.argv[2])
total = collections.Counter()
for path in sys.argv[3:]:
    total.update(costs(path))
hot = {(fn, addr // 64) for (fn, addr), n in total.items() if n >= requests / 2}
lines = {line for _, line in hot}
own = {line for fn, line in hot if fn and any(o in fn for o in OWN)}
ir = sum(total.values()) / requests
print(f"{name:26} {ir:8.0f} instructions/request  {len(lines):5d} hot lines of code  {len(own):4d} in the limiter's own functions")
