-- Token bucket as GCRA: a window of n per w is a bucket of n tokens refilled
-- one every t = ceil(w / n) microseconds. A budget's state is, per window,
-- its theoretical arrival time (TAT), packed (see load_state). A request of
-- cost c is allowed when max(TAT, now) + c*t - now <= n*t. An allowed
-- request: GET and SET.
--
-- S[i] is the TAT of window i, S[N + i] its t.

local function evaluate(key, B, N, S)
  load_state(key, B, N, S, 2)
  local allowed, retry = true, 0
  for i = 1, N do
    local d, size = V[B + 2 * i - 1], V[B + 2 * i]
    local t = ceil(d / size) -- exact, as floor (see the prelude)
    if t < 1 then t = 1 end
    local tat = S[i]
    if tat < now then tat = now end
    S[i], S[N + i] = tat, t
    local nxt = tat + cost * t
    if nxt - now > size * t then
      allowed = false
      local wait = nxt - now - size * t
      if cost > size then wait = size * t end
      if wait > retry then retry = wait end
    end
  end
  return allowed, retry
end

local function commit(key, B, N, S)
  local expires = now
  for i = 1, N do
    S[i] = S[i] + cost * S[N + i]
    if S[i] > expires then expires = S[i] end
  end
  save_state(key, B, N, S, 2, expires)
end

-- The tokens left: floor((size*t - (TAT - now)) / t), at least 0.
local function fill(B, N, S, out, o)
  local best, least = 0, 0
  for i = 1, N do
    local t = S[N + i]
    local a = V[B + 2 * i] * t - (S[i] - now)
    local r = 0
    if a > 0 then r = floor(a / t) end
    out[o + i] = r
    if best == 0 or r < least then best, least = i, r end
  end
  return best, least
end

local function reset(key, B, N, S, i)
  local size, t = V[B + 2 * i], S[N + i]
  local left = floor(max(size * t - (S[i] - now), 0) / t)
  if left >= size then return 0 end
  return max(S[i] - now - (size - left - 1) * t, 0)
end
