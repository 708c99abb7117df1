
-- The sliding window counter's wait (sliding_window.lua and
-- straight_sliding_window.lua), for a denied request and for the reset:
-- the time until k more requests fit (the first whole microsecond at which
-- they do), or d when k exceeds the limit. A window counts
-- prev * (d - elapsed) / d + cur requests `elapsed` into its current fixed
-- window; that is written out at each use, in that order (the same doubles
-- as the memory store's), as a Lua call costs more than the arithmetic.
local function wait_for(prev, cur, d, elapsed, limit, k)
  if k > limit then return d end
  local p, c, base, offset
  if cur + k <= limit then
    p, c, base, offset = prev, cur, elapsed, 0
  else
    p, c, base, offset = cur, 0, 0, d - elapsed
  end
  if p * (d - base) / d + c + k <= limit then return offset end
  -- The first e that fits (one: the test only grows with e, and holds at
  -- d): the estimate is almost always right or one off; where doubles
  -- round coarsely (huge limits, long windows) a binary search finds it in
  -- at most 64 steps, as in counters.rs.
  local room = limit - c - k
  local e = math.ceil(d - room * d / p)
  if e < base + 1 then e = base + 1 end
  if e > d then e = d end
  local lo, hi
  if p * (d - e) / d + c + k <= limit then
    if p * (d - (e - 1)) / d + c + k > limit then return offset + e - base end
    lo, hi = base + 1, e - 1
  elseif e < d and p * (d - (e + 1)) / d + c + k <= limit then
    return offset + e + 1 - base
  else
    lo, hi = e + 1, d
  end
  while lo < hi do
    local mid = lo + (hi - lo - (hi - lo) % 2) / 2
    if p * (d - mid) / d + c + k <= limit then hi = mid else lo = mid + 1 end
  end
  return offset + hi - base
end
