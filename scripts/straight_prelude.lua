-- The straight-line scripts: one per algorithm and number of user windows
-- (1 to 5), for the common shape (no route-wide windows, no block time).
-- They decide exactly as prelude.lua + the algorithm's script (and
-- counter_state.lua), on the same arguments, keys and stored state, but
-- with every number in a local and no loop, table or function on the usual
-- path: 20-40% fewer instructions per call (BENCHMARKS.md). The store
-- expands them from these templates (src/store/template.rs: lines between
-- --$each and --$end repeat per window with @ for its number,
-- $each(SEP){TEXT} repeats TEXT, $N is the number of windows, $BYTES the
-- size of a counter algorithm's stored state).

local now, cost, _, _, _, $each(, ){d@, n@} =
  struct.unpack('<i8i8i8i8i8$each(){i8i8}', ARGV[1])
local ttl_pad = 10000 -- see prelude.lua
if now < 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
  ttl_pad = 0
end
local key = KEYS[1]

