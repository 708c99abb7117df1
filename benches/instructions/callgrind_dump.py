"""Reads callgrind dumps made with --dump-instr=yes: each function's own
events per instruction address (the inclusive cost of its calls left
out). Shared by hot_lines.py and miss_sites.py."""
import collections
import re


def own_events(paths):
    """{(function, address): [events in the dump's order]}, summed over
    `paths` (one dump per thread or part)."""
    cost = collections.defaultdict(list)
    for path in paths:
        names, fn, addr, after_call = {}, None, 0, False
        for line in open(path, errors="replace"):
            if line.startswith(("fn=", "cfn=")):
                m = re.match(r"(c?fn)=\((\d+)\)(?: (.*))?", line.rstrip("\n"))
                if m and m.group(3):
                    names[m.group(2)] = m.group(3)
                if m and m.group(1) == "fn":
                    fn = names.get(m.group(2))
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
            # (Fields: instruction address, source line, then the events.)
            values = [int(x) for x in fields[2:]]
            c = cost[(fn, addr)]
            if len(c) < len(values):
                c.extend([0] * (len(values) - len(c)))
            for i, v in enumerate(values):
                c[i] += v
    return cost
