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
    local t = idiv(d, size)
    if t * size < d then t = t + 1 end
    if t < 1 then t = 1 end
    local tat = math.max(S[i], now)
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
    expires = math.max(expires, S[i])
  end
  save_state(key, B, N, S, 2, expires)
end

local function remaining(B, N, S, i)
  local t = S[N + i]
  return idiv(math.max(V[B + 2 * i] * t - (S[i] - now), 0), t)
end

local function reset(key, B, N, S, i)
  local size = V[B + 2 * i]
  local left = remaining(B, N, S, i)
  if left >= size then return 0 end
  return math.max(S[i] - now - (size - left - 1) * S[N + i], 0)
end
