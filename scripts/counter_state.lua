-- State of the counter algorithms (fixed window, sliding window, token
-- bucket), between prelude.lua and the algorithm.

-- The counter algorithms keep a budget's state in one string: per window,
-- its length then `width - 1` numbers, all packed as struct 'i8' (no text to
-- format or parse). load_state puts field f of window i in S[(f-1)N + i]
-- (0 when the window is not stored: a new budget, or changed windows);
-- save_state writes them back with the key's TTL in the same SET.
local function load_state(key, B, N, S, width)
  local raw = redis.call('GET', key)
  -- (Without a stored state nothing is read from R: V stands in for it, so
  -- no empty table is made.)
  local R = raw and { struct.unpack(string.rep('<i8', floor(#raw / 8)), raw) } or V
  local stored = raw and floor(#raw / (8 * width)) or 0
  for i = 1, N do
    local d = V[B + 2 * i - 1]
    -- Usually the stored windows are the check's, in order.
    local at = (i - 1) * width
    if i > stored or R[at + 1] ~= d then
      at = -1
      for j = 0, stored - 1 do
        if R[j * width + 1] == d then at = j * width end
      end
    end
    for f = 1, width - 1 do
      S[(f - 1) * N + i] = at >= 0 and R[at + 1 + f] or 0
    end
  end
end

local function save_state(key, B, N, S, width, expires)
  local values = {}
  for i = 1, N do
    local at = (i - 1) * width
    values[at + 1] = V[B + 2 * i - 1]
    for f = 1, width - 1 do values[at + 1 + f] = S[(f - 1) * N + i] end
  end
  local ms = max(ceil((expires - now) / 1000), 1) + ttl_pad
  redis.call('SET', key, struct.pack(string.rep('<i8', width * N), unpack(values)),
    'PX', fmt('%d', ms))
end
