"""Sends the load harness's pattern of sliding-log checks to a Redis on PORT
(see bursts.sh): bursts of half a second, 9 s apart (the harness runs every
scenario for 0.5 s in turn), each with PER_USER checks of every one of USERS
users in a random order, 12 checks per call of the batch script, on an
injected clock; 3 windows (1 s, 1 min, 1 h) of 1,000,000,000, as in the
harness.

    python bursts.py <port> <sha> <exact> <bursts> <users> <first burst>
"""

import random
import struct
import sys

import redis

port, sha, exact, bursts, users, first = (int(a) if i != 1 else a for i, a in enumerate(sys.argv[1:7]))
PER_USER = 31
WINDOWS = [(1_000_000, 1_000_000_000), (60_000_000, 1_000_000_000), (3_600_000_000, 1_000_000_000)]
flat = [x for w in WINDOWS for x in w]
pipe = redis.Redis(port=port).pipeline(transaction=False)
rng = random.Random(7 + first)
for b in range(first, first + bursts):
    # (Any fixed epoch: the script's clock is the argument's.)
    base = 1_700_000_000_000_000 + b * 9_000_000
    order = [u for u in range(users) for _ in range(PER_USER)]
    rng.shuffle(order)
    n = len(order)
    for i in range(0, n, 12):
        now = base + i * 500_000 // n
        keys = [f"k:{{{u}}}:l" for u in order[i:i + 12]]
        # (The store's numbers: clock, cost 1, no block, the windows, a
        # fingerprint, whether every window is counted exactly.)
        numbers = struct.pack("<" + "d" * 11, now, 1, 0, *flat, 12345, exact)
        pipe.evalsha(sha, len(keys), *keys, numbers, len(keys))
        if len(pipe) >= 100:
            pipe.execute()
    pipe.execute()
