-- The packed sliding log's helpers (HELPERS in straight_packed_log.lua):
-- made where they are used in a script of one check, and once for the
-- whole batch in a batch script (SHARED in batched.lua), as Redis's Lua
-- makes a function's closure each time its definition runs.
-- (Offsets are written with %d, here and in straight_packed_log.lua's
-- usual paths: Redis would write a Lua number with %.17g, about 600
-- instructions more per number.)
-- The entry at index i: from the tail read (the last entries of the log,
-- from index base + 1), else one GETRANGE. (The helpers take what they
-- need as arguments: a closure costs Redis per variable it captures; so
-- they call the library by its globals, not by the locals the prelude
-- makes of it (straight_prelude.lua), three variables more to capture on
-- every call of a script of one check: round 46 in benches/HISTORY.md.)
local function entry(i, base, tail, key)
  if i > base then return (struct.unpack('<d', tail, 8 * (i - base) - 7)) end
  local s = redis.call('GETRANGE', key, string.format('%d', 8 * i - 8),
    string.format('%d', 8 * i - 1))
  if #s < 8 then error('a sliding-log budget holds a value this script did not write (its key, which names the user, is left out)') end
  return (struct.unpack('<d', s))
end

-- The first index from `from` whose entry is after `bound`, and that
-- entry (nil: none), when the one before `from` is not: the next 16
-- entries in one read, then a binary search.
local function seek(from, bound, size, newest, base, tail, key)
  if newest <= bound or from > size then return size + 1, nil end
  if from <= base then
    local last = from + 15
    if last > base then last = base end
    local chunk = redis.call('GETRANGE', key, string.format('%d', 8 * from - 8),
      string.format('%d', 8 * last - 1))
    if #chunk < 8 * (last - from + 1) then
      error('a sliding-log budget holds a value this script did not write (its key, which names the user, is left out)')
    end
    for j = from, last do
      local e = struct.unpack('<d', chunk, 8 * (j - from) + 1)
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
    local e = struct.unpack('<d', tail, 8 * (j - base) - 7)
    if e > bound then return j, e end
  end
  return size + 1, nil
end
