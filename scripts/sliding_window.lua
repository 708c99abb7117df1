-- Sliding window counter: the current fixed window's count plus the
-- previous window's count weighted by the part of it the sliding window
-- still covers: used = prev * (d - elapsed) / d + cur (doubles, in exactly
-- this order, as in the Rust memory store). A budget's state is, per
-- window, its current count, the previous window's count and the current
-- window number, packed (see load_state). An allowed request: GET and SET.
--
-- S[i] is the current count of window i, S[N + i] the previous one,
-- S[2N + i] the window number, S[3N + i] the time elapsed in it.

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
  local e = ceil(d - room * d / p)
  if e < base then e = base end
  if e > d then e = d end
  while e > base and used(p, c, d, e - 1) + k <= limit do e = e - 1 end
  while e < d and used(p, c, d, e) + k > limit do e = e + 1 end
  return offset + e - base
end

local function evaluate(key, B, N, S)
  load_state(key, B, N, S, 4)
  local allowed, retry = true, 0
  for i = 1, N do
    local d, limit = V[B + 2 * i - 1], V[B + 2 * i]
    local k = floor(now / d)
    local elapsed = now - k * d
    local sk = S[2 * N + i]
    local cur, prev = 0, 0
    if sk == k then
      cur, prev = S[i], S[N + i]
    elseif sk == k - 1 then
      prev = S[i]
    end
    S[i], S[N + i], S[2 * N + i], S[3 * N + i] = cur, prev, k, elapsed
    if used(prev, cur, d, elapsed) + cost > limit then
      allowed = false
      local wait = wait_for(prev, cur, d, elapsed, limit, cost)
      if wait > retry then retry = wait end
    end
  end
  return allowed, retry
end

local function commit(key, B, N, S)
  local expires = now
  for i = 1, N do
    S[i] = S[i] + cost
    -- The current count still weighs in during the next window.
    local ends = (S[2 * N + i] + 2) * V[B + 2 * i - 1]
    if ends > expires then expires = ends end
  end
  save_state(key, B, N, S, 4, expires)
end

local function fill(B, N, S, out, o)
  local best, least = 0, 0
  for i = 1, N do
    local d = V[B + 2 * i - 1]
    local u = S[N + i] * (d - S[3 * N + i]) / d + S[i]
    local r = floor(max(V[B + 2 * i] - u, 0))
    out[o + i] = r
    if best == 0 or r < least then best, least = i, r end
  end
  return best, least
end

local function reset(key, B, N, S, i)
  local u = used(S[N + i], S[i], V[B + 2 * i - 1], S[3 * N + i])
  return wait_for(S[N + i], S[i], V[B + 2 * i - 1], S[3 * N + i], V[B + 2 * i],
    floor(max(V[B + 2 * i] - u, 0)) + 1)
end
