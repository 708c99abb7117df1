
-- The sliding window counter's helpers (sliding_window.lua and
-- straight_sliding_window.lua), which run only for a denied request and for
-- the reset. used(): the requests a window counts, `elapsed` into its
-- current fixed window.
local function used(prev, cur, d, elapsed)
  return prev * (d - elapsed) / d + cur
end

-- The time until k more requests fit (the first whole microsecond at which
-- they do), or d when k exceeds the limit.
local function wait_for(prev, cur, d, elapsed, limit, k)
  if k > limit then return d end
  local p, c, base, offset
  if cur + k <= limit then
    p, c, base, offset = prev, cur, elapsed, 0
  else
    p, c, base, offset = cur, 0, 0, d - elapsed
  end
  if used(p, c, d, base) + k <= limit then return offset end
  local room = limit - c - k
  local e = math.ceil(d - room * d / p)
  if e < base then e = base end
  if e > d then e = d end
  while e > base and used(p, c, d, e - 1) + k <= limit do e = e - 1 end
  while e < d and used(p, c, d, e) + k > limit do e = e + 1 end
  return offset + e - base
end
