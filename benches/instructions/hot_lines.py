"""Reads a callgrind dump made with --dump-instr=yes over REQUESTS requests
and prints instructions per request and the hot lines of code (64-byte
lines whose instructions ran at least REQUESTS / 2 times), in all and in
the rate limiter's own functions (this crate's; tower_governor's and
governor's, with dashmap under them).

    python3 hot_lines.py NAME REQUESTS FILE..."""
import sys

from callgrind_dump import own_events

OWN = ("tower_ratelimit", "governor", "dashmap")


name, requests = sys.argv[1], int(sys.argv[2])
# (Instructions, the first event.)
total = {key: events[0] for key, events in own_events(sys.argv[3:]).items() if events}
hot = {(fn, addr // 64) for (fn, addr), n in total.items() if n >= requests / 2}
lines = {line for _, line in hot}
own = {line for fn, line in hot if fn and any(o in fn for o in OWN)}
ir = sum(total.values()) / requests
print(f"{name:26} {ir:8.0f} instructions/request  {len(lines):5d} hot lines of code  {len(own):4d} in the limiter's own functions")
