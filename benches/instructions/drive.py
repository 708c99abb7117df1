"""Sends N EVALSHA calls of one script to a Redis on PORT (see run.sh).

    python drive.py <port> <sha> <calls> <users> <store|counter|general|per-window> [<first> <rate> [<batch>]]

`store`: the store's layout for a straight-line script (the state key (no block key without a
block time), the packed numbers of a 3-window check: TIME, cost 1, no block, 1 s / 1 min / 1 h of
1,000,000, a fingerprint, EXACT).
`counter`: the same without the block time and the fingerprint (only the sliding log reads them).
`general`: the same for the general scripts (the window counts after the block time, no
fingerprint).
`per-window`: scripts/per_window_baseline.lua's (one key per window).
Users are drawn from a fixed seed, so every run sends the same calls.

With <first> and <rate> (see steady.sh), the calls carry an injected clock
instead of asking for `TIME`: call i (counted from <first>) is at
i / <rate> seconds, so a run continues an earlier one's clock, at <rate>
checks a second over all users (its users drawn from a seed of its own).

With <batch> above 1 (store and counter layouts), every <batch> checks go
as one call of the batch script (`lua ... --batched`): their keys, then
their numbers (once, with the count of checks that have them), all at the
clock of the batch's first.
"""

import os
import random
import struct
import sys

import redis

port, sha, calls, users, layout = (int(sys.argv[1]), sys.argv[2], int(sys.argv[3]),
                                   int(sys.argv[4]), sys.argv[5])
first, rate = (int(sys.argv[6]), int(sys.argv[7])) if len(sys.argv) > 7 else (0, 0)
batch = int(sys.argv[8]) if len(sys.argv) > 8 else 1
windows = [(1_000_000, 1_000_000), (60_000_000, 1_000_000), (3_600_000_000, 1_000_000)]
flat = [x for w in windows for x in w]
exact = int(os.environ.get("EXACT", "0"))


def numbers(now):
    if layout == "general":
        return struct.pack("<" + "d" * 11, now, 1, 0, len(windows), 0, *flat)
    if layout == "counter":
        return struct.pack("<" + "d" * 8, now, 1, *flat)
    # (Then the windows' fingerprint: any odd number, the same for every
    # call; and whether every window must be counted exactly: EXACT=1, as
    # the layer asks with IETF headers; 0 by default, as with X-RateLimit-*.)
    return struct.pack("<" + "d" * 11, now, 1, 0, *flat, 12345, exact)


packed = numbers(-1)
rng = random.Random(1 + first)
pipe = redis.Redis(port=port).pipeline(transaction=False)
keys, args = [], []
for i in range(first, first + calls):
    u = rng.randrange(users)
    if rate and len(keys) == 0:
        # (Any fixed epoch: the script's clock is the argument's.)
        packed = numbers(1_700_000_000_000_000 + i * 1_000_000 // rate)
    if batch > 1:
        keys.append(f"k:{{{u}}}:l")
        args.append(packed)
        if len(keys) == batch or i == first + calls - 1:
            # (Each run of the same numbers once, then how many checks it
            # is for, as the store sends them.)
            runs = []
            for a in args:
                if runs and runs[-1][0] == a:
                    runs[-1][1] += 1
                else:
                    runs.append([a, 1])
            pipe.evalsha(sha, len(keys), *keys, *[x for a, k in runs for x in (a, k)])
            keys, args = [], []
    elif layout == "per-window":
        pipe.evalsha(sha, 3, f"pw:{{{u}}}:1", f"pw:{{{u}}}:2", f"pw:{{{u}}}:3", "", 1, *flat)
    else:
        pipe.evalsha(sha, 1, f"k:{{{u}}}:l", packed)
    if i % 100 == 99:
        pipe.execute()
pipe.execute()
