-- State of the counter algorithms (fixed window, sliding window, token
-- bucket), between prelude.lua and the algorithm. Both helpers capture no
-- variable (a captured variable costs every call; these take parameters)
-- and run once per call.

-- The counter algorithms keep a budget's state in one string: per window,
-- its length then `width - 1` numbers, all packed as struct 'd' (whole
-- numbers; no text to format or parse). The state table S holds the
-- windows of both budgets in the same way: window w's length at S[(w - 1) * width + 1], its field f at
-- S[(w - 1) * width + 1 + f]. So in the usual case (one budget whose stored
-- windows are the check's, in order) the unpacked string is S as it is, and
-- saving packs S without a copy. A window not stored (a new budget, or
-- changed windows) starts with every field 0.
local function load_state(V, UN, GN, width)
  local floor, unpack_d = math.floor, struct.unpack
  local raw = redis.call('GET', KEYS[1])
  local R, stored = nil, 0
  if raw then
    stored = floor(#raw / (8 * width))
    R = { unpack_d('<' .. string.rep('d', stored * width), raw) }
    if GN == 0 and stored == UN then
      local same = true
      for w = 1, UN do
        if R[(w - 1) * width + 1] ~= V[4 + 2 * w] then same = false end
      end
      if same then return R end
    end
  end
  local G, route_stored = nil, 0
  if GN > 0 then
    local route_raw = redis.call('GET', KEYS[3])
    if route_raw then
      route_stored = floor(#route_raw / (8 * width))
      G = { unpack_d('<' .. string.rep('d', route_stored * width), route_raw) }
    end
  end
  local S = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }
  for w = 1, UN + GN do
    local d, at = V[4 + 2 * w], (w - 1) * width
    local T, n = R, stored
    if w > UN then T, n = G, route_stored end
    -- (the last window stored with this length)
    local from = -1
    for j = 0, n - 1 do
      if T[j * width + 1] == d then from = j * width end
    end
    S[at + 1] = d
    for f = 2, width do
      S[at + f] = from >= 0 and T[from + f] or 0
    end
  end
  return S
end

-- Writes the state of both budgets back, each in one SET whose TTL ends
-- when the last of its windows may still count (out[4 + w] holds window w's
-- end, in microseconds on the script's clock).
local function save_state(S, out, width, UN, GN, now, pad)
  local first, n, key = 1, UN, KEYS[1]
  while true do
    local expires = now
    for w = first, first + n - 1 do
      if out[4 + w] > expires then expires = out[4 + w] end
    end
    local ms = math.ceil((expires - now) / 1000)
    if ms < 1 then ms = 1 end
    redis.call('SET', key, struct.pack('<' .. string.rep('d', width * n),
      unpack(S, width * (first - 1) + 1, width * (first + n - 1))),
      'PX', string.format('%d', ms + pad))
    if first > UN or GN == 0 then return end
    first, n, key = UN + 1, GN, KEYS[3]
  end
end
