
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
  local room = limit - c - k
  local e = math.ceil(d - room * d / p)
  if e < base then e = base end
  if e > d then e = d end
  while e > base and p * (d - (e - 1)) / d + c + k <= limit do e = e - 1 end
  while e < d and p * (d - e) / d + c + k > limit do e = e + 1 end
  return offset + e - base
end
