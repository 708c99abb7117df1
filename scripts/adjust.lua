-- Adjusts a user's budget outside a check (Adjustment in src/store/mod.rs;
-- the memory store's sliding_log::adjust and counters::adjust are the
-- specification): a penalty of n spends n more units whether or not they
-- fit, a refund of n gives back up to n. Rare (once per adjusted
-- response), so written for clarity; but a sliding log's cost does not
-- grow with its length (below).
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
--
-- (The store sends straight_log_packed.lua's packed() and
-- sliding_log_add.lua's add_entries() before this file.)

local fmt = string.format
local args = ARGV[1]
local V = { struct.unpack('<' .. string.rep('d', #args / 8), args) }
local now, n, layout, fp = V[1], V[2], V[3], V[4]
local W = (#args / 8 - 4) / 2
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

-- The sliding logs (as sliding_log::adjust): entries that left the
-- longest window go first, as a check drops them; a penalty's entries take
-- the first free microseconds at or after now (as push() in
-- sliding_log.rs), at most the largest limit of them and no more than
-- leave the log twice that long; a refund drops the newest. In a sorted
-- set, a penalty's entries go past a run of taken microseconds with one
-- search (add_entries), none read; in a packed log, only the entries at or
-- after now are read (a clock that went back, or requests in this
-- microsecond), and the rest is found by binary search and copied by
-- Redis, so an adjustment costs Lua the same however long the log.

-- How many entries of a penalty fit a log of `live` entries.
local function room(live)
  return math.max(0, math.min(n, most, 2 * most - live))
end

-- The penalty's entries merged with `later`, the entries at or after now
-- (sorted): the merged list from now, and how many were added.
local function merged(later, add)
  local out, j, t = { }, 1, now
  while add > 0 do
    if later[j] == t then j = j + 1 else add = add - 1 end
    out[#out + 1] = t
    t = t + 1
  end
  while j <= #later do out[#out + 1] = later[j]; j = j + 1 end
  return out
end

if layout == 1 then
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt('%d', now - longest))
  local live = redis.call('ZCARD', key)
  if n > 0 then
    local add = room(live)
    if add == 0 then return fmt('%d', live) end
    -- (The first free microseconds at or after now, as a check takes
    -- them: past a run of taken ones with one search, not by reading the
    -- entries from now on, which a burst ahead of the clock makes as many
    -- as the limit.)
    add_entries(key, now, add)
    live = live + add
  else
    local drop = math.min(-n, live)
    if drop > 0 then redis.call('ZREMRANGEBYRANK', key, fmt('%d', -drop), '-1') end
    live = live - drop
  end
  if live == 0 then
    redis.call('DEL', key)
    return '0'
  end
  -- The key lives until its newest entry leaves the longest window.
  local newest = redis.call('ZRANGE', key, '-1', '-1')[1] + 0
  local ms = math.ceil((newest + longest - now) / 1000)
  if ms < 1 then ms = 1 end
  redis.call('PEXPIRE', key, fmt('%d', ms + ttl_pad))
  return fmt('%d', live)
end

if layout == 2 then
  -- The packed log: entries 1 .. size (those before `start` dropped), then
  -- a trailer whose last five numbers are size, at, expires, start and fp
  -- (straight_packed_log.lua). It is left as a check of these windows
  -- leaves a log: a trailer of this rule's length with every window's
  -- hint at the log's start (which holds on any clock), so that the next
  -- check reads it as its own.
  local forged = 'a sliding-log budget holds a value this script did not write (its key, which names the user, is left out)'
  local length = redis.call('STRLEN', key)
  local size, at, expires, start = 0, 0, 0, 1
  if length > 0 then
    if length < 40 or length % 8 ~= 0 then error(forged) end
    size, at, expires, start = struct.unpack('<dddd',
      redis.call('GETRANGE', key, fmt('%d', length - 40), fmt('%d', length - 9)))
    if size < 0 or size % 1 ~= 0 or start < 1 or start > size + 1 or start % 1 ~= 0
        or 8 * size + 40 > length then
      error(forged)
    end
  end
  -- (A clock that went back: the TTL is set again, as a check sets it.)
  if now < at then expires = 0 end
  local function entry(i)
    local e = redis.call('GETRANGE', key, fmt('%d', 8 * i - 8), fmt('%d', 8 * i - 1))
    if #e ~= 8 then error(forged) end
    return (struct.unpack('<d', e))
  end
  -- The first index from `lo` whose entry is above `bound` (size + 1: none).
  local function first_above(lo, bound)
    local hi = size + 1
    while lo < hi do
      local mid = (lo + hi - (lo + hi) % 2) / 2
      if entry(mid) > bound then hi = mid else lo = mid + 1 end
    end
    return lo
  end
  local function range(from, to)
    if to < from then return '' end
    local bytes = redis.call('GETRANGE', key, fmt('%d', 8 * from - 8), fmt('%d', 8 * to - 1))
    if #bytes ~= 8 * (to - from + 1) then error(forged) end
    return bytes
  end
  local first = first_above(start, now - longest)
  local live = size - first + 1
  -- The PX for a log whose newest entry is `newest` (nil: the TTL set
  -- before lasts long enough; never a shorter one, as a check never sets
  -- one: a longer rule on the same budget may still count its entries),
  -- as straight_log_ttl.lua sets it; and `expires` with it.
  local function ttl(newest)
    if expires >= newest + longest then return nil end
    local slack = (longest - longest % 4) / 4
    if slack < 1000000 then slack = 1000000 elseif slack > 60000000 then slack = 60000000 end
    local ms = whole_ms(newest + longest + slack - now)
    expires = now + ms * 1000
    return ms + ttl_pad
  end
  -- A trailer of this rule's length for `total` entries whose log starts
  -- at index `from` with the entry `oldest`: every window's hint there.
  local function trailer(from, total, oldest)
    local numbers = { }
    for _ = 1, W do
      numbers[#numbers + 1] = from
      numbers[#numbers + 1] = oldest
    end
    for _, v in ipairs({ total, now, expires, from, fp }) do numbers[#numbers + 1] = v end
    return struct.pack('<' .. string.rep('d', #numbers), unpack(numbers))
  end
  local body, count
  if n > 0 then
    local add = room(live)
    -- (With nothing to add, entries that left the window still go, as
    -- the memory store drops them.)
    if add == 0 and first == start then return fmt('%d', live) end
    local q = first_above(first, now - 1)
    -- The usual case: no entry at or after now, or every microsecond from
    -- now to the newest taken (as after a penalty): the new entries follow
    -- the newest, written over the old trailer with the new one (the
    -- entries that left the window stay before `start`, as a check leaves
    -- them, until a check drops them), if they cover it.
    local from = nil
    if q > size then
      from = now
    else
      local newest = entry(size)
      if newest - now == size - q then from = newest + 1 end
    end
    if from and add > 0 then
      local added = { }
      for i = 1, add do added[i] = from + i - 1 end
      local oldest = from
      if first <= size then oldest = entry(first) end
      local px = ttl(from + add - 1)
      local tail = packed(added) .. trailer(first, size + add, oldest)
      if length - 8 * size <= #tail then
        redis.call('SETRANGE', key, fmt('%d', 8 * size), tail)
        if px then redis.call('PEXPIRE', key, fmt('%d', px)) end
        return fmt('%d', live + add)
      end
    end
    -- Otherwise the new entries take the free microseconds among those
    -- at or after now (a clock that went back), and the log is written
    -- whole.
    local later = { }
    if q <= size then
      local bytes = range(q, size)
      for i = 1, #bytes, 8 do later[#later + 1] = struct.unpack('<d', bytes, i) end
    end
    body, count = range(first, q - 1) .. packed(merged(later, add)), live + add
  else
    -- A refund: the log without its newest entries, written whole.
    count = live - math.min(-n, live)
    if count > 0 then body = range(first, first + count - 1) end
  end
  if count == 0 then
    redis.call('DEL', key)
    return '0'
  end
  local px = ttl(struct.unpack('<d', body, 8 * count - 7))
  -- (The trailer appended by Redis: a concatenation would make Lua copy
  -- and hash the whole log once more.)
  if px then
    redis.call('SET', key, body, 'PX', fmt('%d', px))
  else
    redis.call('SET', key, body, 'KEEPTTL')
  end
  redis.call('APPEND', key, trailer(1, count, struct.unpack('<d', body, 1)))
  return fmt('%d', count)
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
  -- A count moved by m: at least 0, and a penalty's at most `most` (but
  -- never below where it was).
  local function moved(value, most)
    if m > 0 then return math.min(value + m, math.max(most, value)) end
    return math.max(value + m, 0)
  end
  local k = (now - now % d) / d
  if layout == 3 then
    -- [d, current count, previous count, window number]
    if f[3] == k + 1 then k = f[3] end
    local cur, prev = 0, 0
    if f[3] == k then cur, prev = f[1], f[2] elseif f[3] == k - 1 then prev = f[1] end
    cur = moved(cur, 2 * limit)
    f = { cur, prev, k }
    if (k + 2) * d > expires then expires = (k + 2) * d end
  elseif layout == 4 then
    -- [d, count, window number]
    if f[2] == k + 1 then k = f[2] end
    local count = 0
    if f[2] == k then count = f[1] end
    count = moved(count, 2 * limit)
    f = { count, k }
    if (k + 1) * d > expires then expires = (k + 1) * d end
  else
    -- [d, TAT]: m tokens are m refill intervals of t.
    local t = d - 1
    t = (t - t % limit) / limit + 1
    local base = math.max(f[1], now)
    local tat = math.max(base + m * t, now)
    if m > 0 then tat = math.min(tat, math.max(now + 2 * limit * t, base)) end
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
