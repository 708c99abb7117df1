-- Adjusts a user's budget outside a check (Adjustment in src/store/mod.rs;
-- the memory store's sliding_log::adjust and counters::adjust are the
-- specification): a penalty of n spends n more units whether or not they
-- fit, a refund of n gives back up to n. Rare (once per adjusted
-- response), so written for clarity: the whole state is read and written.
--
-- KEYS[1]  the user's budget state, in the layout the check's script
--          keeps it (see layout below)
-- ARGV[1]  little-endian doubles: now in microseconds (negative: the
--          server's clock, TIME); n (above 0: a penalty of n, below: a
--          refund of -n); the layout: 1 sorted-set sliding log
--          (sliding_log.lua), 2 packed sliding log
--          (straight_packed_log.lua), 3 sliding window, 4 fixed window,
--          5 token bucket (counter_state.lua); the packed log's windows
--          fingerprint (0 for the others); then (length, limit) of every
--          window, shortest first.
-- Reply: the number of entries a sliding log holds after it (0 for the
-- counter algorithms), as text.

local fmt = string.format
local packed = ARGV[1]
local V = { struct.unpack('<' .. string.rep('d', #packed / 8), packed) }
local now, n, layout, fp = V[1], V[2], V[3], V[4]
local W = (#packed / 8 - 4) / 2
local ttl_pad = 10000 -- see prelude.lua
if now < 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
  ttl_pad = 0
end
local key = KEYS[1]
local longest, most = V[3 + 2 * W], 0
for w = 1, W do
  if V[4 + 2 * w] > most then most = V[4 + 2 * w] end
end
local function whole_ms(us)
  local ms = us - 1
  ms = (ms - ms % 1000) / 1000 + 1
  if ms < 1 then ms = 1 end
  return ms
end

-- The sliding logs: their live entries (those still in the longest
-- window), sorted, as a list; a penalty's entries take the first free
-- microseconds at or after now (as push() in sliding_log.rs), at most the
-- largest limit of them; a refund drops the newest.
local function adjusted(list)
  if n > 0 then
    local add = math.min(n, most)
    local out, j = { }, 1
    while j <= #list and list[j] < now do out[#out + 1] = list[j]; j = j + 1 end
    local t = now
    while add > 0 do
      if list[j] == t then j = j + 1 else add = add - 1 end
      out[#out + 1] = t
      t = t + 1
    end
    while j <= #list do out[#out + 1] = list[j]; j = j + 1 end
    return out
  end
  for _ = 1, math.min(-n, #list) do list[#list] = nil end
  return list
end

if layout == 1 then
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt('%d', now - longest))
  local members = redis.call('ZRANGE', key, '0', '-1')
  local list = { }
  for i = 1, #members do list[i] = members[i] + 0 end
  local before = #list
  list = adjusted(list)
  if #list == 0 then
    redis.call('DEL', key)
    return '0'
  end
  if n > 0 then
    for i = 1, #list, 256 do
      local args = { 'NX' }
      for j = i, math.min(i + 255, #list) do
        local s = fmt('%d', list[j])
        args[#args + 1] = s
        args[#args + 1] = s
      end
      redis.call('ZADD', key, unpack(args))
    end
  elseif #list < before then
    redis.call('ZREMRANGEBYRANK', key, fmt('%d', #list), '-1')
  end
  -- The key lives until its newest entry leaves the longest window.
  local ms = math.ceil((list[#list] + longest - now) / 1000)
  if ms < 1 then ms = 1 end
  redis.call('PEXPIRE', key, fmt('%d', ms + ttl_pad))
  return fmt('%d', #list)
end

if layout == 2 then
  -- The packed log: its entries from `start` to `size`, then a trailer
  -- whose last five numbers are size, at, expires, start and fp. It is
  -- written back whole with the trailer a check of these windows writes
  -- after a rewrite: every window's hint at the log's start (which holds
  -- on any clock), so the next check reads it as its own.
  local s = redis.call('GET', key)
  local list = { }
  if s then
    if #s < 40 or #s % 8 ~= 0 then
      error('a sliding-log budget holds a value this script did not write (its key, which names the user, is left out)')
    end
    local size, _, _, start = struct.unpack('<dddd', s, #s - 39)
    if size < 0 or size % 1 ~= 0 or start < 1 or start > size + 1 or 8 * size + 40 > #s then
      error('a sliding-log budget holds a value this script did not write (its key, which names the user, is left out)')
    end
    for i = start, size do
      local e = struct.unpack('<d', s, 8 * i - 7)
      if e + longest > now then list[#list + 1] = e end
    end
  end
  list = adjusted(list)
  if #list == 0 then
    redis.call('DEL', key)
    return '0'
  end
  local newest = list[#list]
  -- (The TTL as straight_log_ttl.lua sets it.)
  local slack = (longest - longest % 4) / 4
  if slack < 1000000 then slack = 1000000 elseif slack > 60000000 then slack = 60000000 end
  local ms = whole_ms(newest + longest + slack - now)
  local out = { }
  for i = 1, #list do out[i] = list[i] end
  for _ = 1, W do
    out[#out + 1] = 1
    out[#out + 1] = list[1]
  end
  out[#out + 1] = #list
  out[#out + 1] = now
  out[#out + 1] = now + ms * 1000
  out[#out + 1] = 1
  out[#out + 1] = fp
  local bytes = { }
  for i = 1, #out, 64 do
    bytes[#bytes + 1] = struct.pack('<' .. string.rep('d', math.min(64, #out - i + 1)),
      unpack(out, i, math.min(i + 63, #out)))
  end
  redis.call('SET', key, table.concat(bytes), 'PX', fmt('%d', ms + ttl_pad))
  return fmt('%d', #list)
end

-- The counter algorithms: per window, its length then width - 1 numbers
-- (counter_state.lua), laid out for these windows in order (the last
-- stored with each length, or zeros), as a check lays them out.
local width = ({ 4, 3, 2 })[layout - 2]
local raw = redis.call('GET', key)
-- (Nothing spent: nothing to give back.)
if not raw and n < 0 then return '0' end
local R, stored = { }, 0
if raw then
  stored = math.floor(#raw / (8 * width))
  R = { struct.unpack('<' .. string.rep('d', stored * width), raw) }
end
local S, expires = { }, now
for w = 1, W do
  local d, limit = V[3 + 2 * w], V[4 + 2 * w]
  local from = -1
  for j = 0, stored - 1 do
    if R[j * width + 1] == d then from = j * width end
  end
  local f = { 0, 0, 0 }
  for i = 2, width do
    if from >= 0 then f[i - 1] = R[from + i] end
  end
  local m = n
  if m > limit then m = limit end
  local k = (now - now % d) / d
  if layout == 3 then
    -- [d, current count, previous count, window number]
    if f[3] == k + 1 then k = f[3] end
    local cur, prev = 0, 0
    if f[3] == k then cur, prev = f[1], f[2] elseif f[3] == k - 1 then prev = f[1] end
    cur = math.max(cur + m, 0)
    f = { cur, prev, k }
    if (k + 2) * d > expires then expires = (k + 2) * d end
  elseif layout == 4 then
    -- [d, count, window number]
    if f[2] == k + 1 then k = f[2] end
    local count = 0
    if f[2] == k then count = f[1] end
    count = math.max(count + m, 0)
    f = { count, k }
    if (k + 1) * d > expires then expires = (k + 1) * d end
  else
    -- [d, TAT]: m tokens are m refill intervals of t.
    local t = d - 1
    t = (t - t % limit) / limit + 1
    local tat = math.max(f[1], now) + m * t
    if tat < now then tat = now end
    f = { tat }
    -- (Rounded up to a whole second, as token_bucket.lua has it.)
    local ends = tat - tat % 1000000 + 1000000
    if ends > expires then expires = ends end
  end
  S[#S + 1] = d
  for i = 1, width - 1 do S[#S + 1] = f[i] end
end
redis.call('SET', key, struct.pack('<' .. string.rep('d', #S), unpack(S)),
  'PX', fmt('%d', whole_ms(expires - now) + ttl_pad))
return '0'
