-- The straight-line scripts: one per counter algorithm and number of user
-- windows (1 to 5), for the common shape (no route-wide windows, no block
-- time). They decide exactly as prelude.lua + counter_state.lua + the
-- algorithm's script, on the same arguments, keys and stored state, but
-- with every number in a local and no loop, table or function on the usual
-- path: about 40% fewer instructions per call (BENCHMARKS.md). The store
-- expands them from these templates (src/store/template.rs: lines between
-- --$each and --$end repeat per window with @ for its number,
-- $each(SEP){TEXT} repeats TEXT, $BYTES is the size of the stored state).

local now, cost, _, _, _, $each(, ){d@, n@} =
  struct.unpack('<i8i8i8i8i8$each(){i8i8}', ARGV[1])
local ttl_pad = 10000 -- see prelude.lua
if now < 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
  ttl_pad = 0
end
local key = KEYS[1]
local raw = redis.call('GET', key)

-- The stored state laid out for the check's windows, in order, each with
-- the fields stored for its length (the last window stored with it) or
-- zeros, as load_state in counter_state.lua. Only for changed windows.
local function remap(raw, D, width)
  local stored = math.floor(string.len(raw) / (8 * width))
  local R = { struct.unpack(string.rep('<i8', stored * width), raw) }
  local out = {}
  for i = 1, table.getn(D) do
    local from = -1
    for j = 0, stored - 1 do
      if R[j * width + 1] == D[i] then from = j * width end
    end
    out[table.getn(out) + 1] = D[i]
    for f = 2, width do
      out[table.getn(out) + 1] = from >= 0 and R[from + f] or 0
    end
  end
  return struct.pack(string.rep('<i8', table.getn(out)), unpack(out))
end

-- The TTL of a saved state is the milliseconds until its last window ends,
-- rounded up (ms = floor((expires - now - 1) / 1000) + 1), at least 1, and
-- goes to SET as a number: below 10^14, Redis writes it exactly, so neither
-- a function nor string.format is needed (about 1.5k instructions a call).
