
-- Sliding log, packed (straight-line): the same function as
-- sliding_log.lua and the memory store's sliding_log.rs, with a budget's
-- log in one string instead of a sorted set. A sorted set costs seven
-- commands per check, and Redis's Lua spends 5,000 to 10,000 instructions
-- on each; this layout reads and writes a few dozen bytes with GETRANGE
-- and SETRANGE, whatever the size of the log (BENCHMARKS.md).
--
-- The string: the entries (the log), sorted distinct microsecond
-- timestamps, then a trailer, all little-endian signed 64-bit integers:
--   size     the number of entries in the string;
--   newest   the last entry;
--   at       the clock reading the window hints below were worked out at;
--   expires  when the key's TTL ends, on the scripts' clock;
--   then per window (shortest first) d, h, t: its length, the index (from
--   1) of its first entry at `at`, and that entry (0: the window was
--   empty, h = size + 1). The longest window's h is where the log starts:
--   entries before it left the log (as the memory store pops them, on
--   every check) and count no more, whatever the clock or the rule does
--   next; they leave the string in batches, when they are as many as the
--   rest;
--   count    the number of windows ($N here).
-- While the clock has not gone back since `at`, every entry before a
-- window's h is out of that window for good, and its t tells in one
-- comparison whether entries left it since: the usual check reads only
-- the trailer (and the entries just before it, in the same GETRANGE),
-- appends with one SETRANGE over the old trailer, and costs Redis about
-- as much as a counter algorithm. Anything else (another rule, a clock
-- that went back, two requests in one microsecond) takes the slow path:
-- the whole log read, worked out afresh, and written back.
local unpack8, fmt = struct.unpack, string.format
local TRAILER = 8 * (3 * $N + 5)
-- (The trailer and the 32 entries before it.)
local tail = redis.call('GETRANGE', key, fmt('%d', -(TRAILER + 256)), '-1')
local size, newest, at, expires, count = 0, 0, 0, 0, 0
local $each(, ){sd@, h@, t@} = $each(, ){d@, 1, 0}
local base, rewrite, whole, existed = 0, false, nil, #tail > 0
if #tail >= TRAILER and #tail % 8 == 0 then
  size, newest, at, expires, $each(, ){sd@, h@, t@}, count =
    unpack8('<i8i8i8i8$each(){i8i8i8}i8', tail, #tail - TRAILER + 1)
  base = size - (#tail - TRAILER) / 8
end

-- The entry at index i: from the tail read (the last entries of the log
-- from index base + 1), else one GETRANGE. (The helpers take what they
-- need as arguments: a closure costs Redis per variable it captures.)
local function entry(i, base, tail, key)
  if i > base then return (struct.unpack('<i8', tail, 8 * (i - base) - 7)) end
  local at = string.format('%d', 8 * i - 8)
  return (struct.unpack('<i8', redis.call('GETRANGE', key, at, string.format('%d', 8 * i - 1))))
end

-- The first index from `from` whose entry is after `bound`, and that
-- entry (nil: none), when the one before `from` is not: the next 16
-- entries in one read, then a binary search.
local function seek(from, bound, size, newest, base, tail, key)
  if newest <= bound then return size + 1, nil end
  if from <= base then
    local last = math.min(from + 15, base)
    local chunk = redis.call('GETRANGE', key, string.format('%d', 8 * from - 8),
      string.format('%d', 8 * last - 1))
    for j = from, last do
      local e = struct.unpack('<i8', chunk, 8 * (j - from) + 1)
      if e > bound then return j, e end
    end
    local lo, hi = last + 1, size
    while lo < hi do
      local mid = (lo + hi - (lo + hi) % 2) / 2
      if entry(mid, base, tail, key) > bound then hi = mid else lo = mid + 1 end
    end
    return lo, entry(lo, base, tail, key)
  end
  for j = from, size do
    local e = struct.unpack('<i8', tail, 8 * (j - base) - 7)
    if e > bound then return j, e end
  end
  return size + 1, nil
end

-- The helpers of the rare paths, made only there: the entries of a packed
-- string from index `from` as a table; a list packed; the first index of
-- a list whose entry is after `bound`.
local function tools()
  local function entries_of(s, from)
    local out = { }
    for i = 8 * from - 7, #s, 4096 do
      local chunk = s:sub(i, i + 4095)
      local part = { struct.unpack('<' .. string.rep('i8', #chunk / 8), chunk) }
      for j = 1, #part - 1 do out[#out + 1] = part[j] end
    end
    return out
  end
  local function packed(list)
    local parts = { }
    for i = 1, #list, 256 do
      local last = math.min(i + 255, #list)
      parts[#parts + 1] = struct.pack('<' .. string.rep('i8', last - i + 1), unpack(list, i, last))
    end
    return table.concat(parts)
  end
  local function after(list, bound)
    local lo, hi = 1, #list + 1
    while lo < hi do
      local mid = (lo + hi - (lo + hi) % 2) / 2
      if list[mid] > bound then hi = mid else lo = mid + 1 end
    end
    return lo
  end
  return entries_of, packed, after
end
local entries_of, packed, after

if count ~= $N or now < at or $each( or ){sd@ ~= d@} or h$N < 1 or h$N > size + 1 then
  -- The slow path: the log as the string holds it (from where it starts),
  -- less the entries that left the longest window, with exact hints.
  entries_of, packed, after = tools()
  whole = { }
  local v = false
  if existed then v = redis.call('GET', key) end
  if v and #v >= 8 and #v % 8 == 0 then
    local c = unpack8('<i8', v, #v - 7)
    local tl = 8 * (3 * c + 5)
    if c >= 1 and c <= 64 and #v >= tl then
      local sz, start = unpack8('<i8', v, #v - tl + 1), unpack8('<i8', v, #v - 23)
      if sz >= 0 and 8 * sz + tl == #v and start >= 1 then
        whole = entries_of(v:sub(1, 8 * sz), start)
      end
    end
  end
  local live = after(whole, now - d$N)
  if live > 1 then
    local kept = { }
    for i = live, #whole do kept[#kept + 1] = whole[i] end
    whole = kept
  end
  size, newest, at, expires, base, rewrite = #whole, whole[#whole] or 0, now, 0, 0, true
  tail = packed(whole)
--$each
  h@ = after(whole, now - d@)
  t@ = whole[h@] or 0
--$end
end

-- Window i starts at index pi, its oldest entry is oi (nil: none) and it
-- counts ci: its hint, unless entries left it since (then a seek).
--$each
local p@, o@ = h@, t@
if h@ > size then
  o@ = nil
elseif t@ <= now - d@ then
  p@, o@ = seek(h@ + 1, now - d@, size, newest, base, tail, key)
end
--$end
local $each(, ){c@} = $each(, ){size + 1 - p@}

-- A denying window's wait: until the need-th oldest entry of the window
-- leaves it, or its whole length for a cost above its limit.
local allowed, retry = 1, 0
--$each
if c@ + cost > n@ then
  allowed = 0
  local wait = d@
  if cost <= n@ then
    local oldest = o@
    if c@ + cost - n@ > 1 then oldest = entry(p@ + c@ + cost - n@ - 1, base, tail, key) end
    wait = oldest + d@ - now
  end
  if wait > retry then retry = wait end
end
--$end

-- The TTL ends when the newest entry `last` leaves the longest window
-- (length d). It is set later than that (by a quarter of that window, at
-- least a second, at most a minute), so most writes keep the TTL set
-- before: ttl() gives the PX to set (nil: none) and when it ends, on the
-- scripts' clock. (With an injected clock, `expires` is on that clock,
-- and the TTL's pad covers real time running ahead of it, as for every
-- script.)
local function ttl(last, d, now, expires, pad)
  if expires >= last + d then return nil, expires end
  local slack = (d - d % 4) / 4
  if slack < 1000000 then slack = 1000000 elseif slack > 60000000 then slack = 60000000 end
  local ms = last + d + slack - now - 1
  ms = (ms - ms % 1000) / 1000 + 1
  return string.format('%d', ms + pad), now + ms * 1000
end

if allowed == 1 then
  local dead = p$N - 1
  if not rewrite and size > 0 and now > newest and (dead < 64 or dead * 2 < size) then
    -- The usual case: time moved past the newest entry. The request's
    -- entries (now and the microseconds after it) and the new trailer go
    -- over the old trailer; the TTL moves only when it must.
    local added
    if cost == 1 then
      added = struct.pack('<i8', now)
    else
      if not packed then entries_of, packed, after = tools() end
      local list = { }
      for i = 1, cost do list[i] = now + i - 1 end
      added = packed(list)
    end
--$each
    if c@ == 0 then o@ = now end
--$end
    local px
    px, expires = ttl(now + cost - 1, d$N, now, expires, ttl_pad)
    redis.call('SETRANGE', key, fmt('%d', 8 * size), added ..
      struct.pack('<i8i8i8i8$each(){i8i8i8}i8', size + cost, now + cost - 1, now, expires,
        $each(, ){d@, p@, o@}, $N))
    if px then redis.call('PEXPIRE', key, px) end
  else
    -- Everything else: the log from where it starts, with the request's
    -- entries at the first free microseconds at or after now (as push()
    -- in sliding_log.rs), written whole.
    if not packed then entries_of, packed, after = tools() end
    local list = whole
    if not rewrite then
      list = { }
      if p$N <= size then
        list = entries_of(redis.call('GETRANGE', key, fmt('%d', 8 * p$N - 8), fmt('%d', 8 * size - 1)), 1)
      end
    else
      local kept = { }
      for i = p$N, #list do kept[#kept + 1] = list[i] end
      list = kept
    end
    local out, j, t, left = { }, 1, now, cost
    while j <= #list and list[j] < now do out[#out + 1] = list[j]; j = j + 1 end
    while left > 0 do
      if list[j] == t then j = j + 1 else left = left - 1 end
      out[#out + 1] = t
      t = t + 1
    end
    while j <= #list do out[#out + 1] = list[j]; j = j + 1 end
--$each
    p@ = after(out, now - d@)
    o@ = out[p@]
--$end
    local px
    px, expires = ttl(out[#out], d$N, now, 0, ttl_pad)
    redis.call('SET', key, packed(out) ..
      struct.pack('<i8i8i8i8$each(){i8i8i8}i8', #out, out[#out], now, expires,
        $each(, ){d@, p@, o@ or 0}, $N), 'PX', px)
  end
--$each
  c@ = c@ + cost
--$end
elseif rewrite then
  -- Denied on the slow path: the log as worked out (its dropped entries
  -- gone), or no key for an empty one.
  if size == 0 then
    if existed then redis.call('DEL', key) end
  else
    local px
    px, expires = ttl(newest, d$N, now, 0, ttl_pad)
    redis.call('SET', key, tail ..
      struct.pack('<i8i8i8i8$each(){i8i8i8}i8', size, newest, now, expires,
        $each(, ){d@, p@, o@ or 0}, $N), 'PX', px)
  end
elseif $each( or ){p@ ~= h@} then
  -- Denied after entries left a window: the new hints (and where the log
  -- starts) over the old trailer.
  redis.call('SETRANGE', key, fmt('%d', 8 * size),
    struct.pack('<i8i8i8i8$each(){i8i8i8}i8', size, newest, now, expires,
      $each(, ){d@, p@, o@ or 0}, $N))
end

-- Remaining = limit - count, at least 0, and the constraining window (the
-- first with the fewest), which resets when its oldest entry leaves it.
local least, reset = 9007199254740992, 0
--$each
local r@ = n@ - c@
if r@ < 0 then r@ = 0 end
if r@ < least then
  least, reset = r@, 0
  if c@ > 0 and o@ then reset = o@ + d@ - now end
end
--$end
return struct.pack('<i8i8i8i8$each(){i8}', allowed, retry, reset, 0, $each(, ){r@})
