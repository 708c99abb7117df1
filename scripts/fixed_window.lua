-- Fixed windows aligned on the Unix epoch: window k of length d is
-- [k*d, (k+1)*d). A budget is a hash with, per window length d, the fields
-- '<d>k' (the window number) and '<d>c' (its count). An allowed request
-- costs HMGET, HSET and PEXPIRE; a denied one HMGET.
--
-- S[i] is the count of window i, S[N + i] its window number, and
-- S[2N + 1 .. 4N] the hash fields.

local function evaluate(key, B, N, S)
  for i = 1, N do
    local d = fmt('%d', V[B + 2 * i - 1])
    S[2 * N + 2 * i - 1] = d .. 'k'
    S[2 * N + 2 * i] = d .. 'c'
  end
  local stored = redis.call('HMGET', key, unpack(S, 2 * N + 1, 4 * N))
  local allowed, retry = true, 0
  for i = 1, N do
    local d, limit = V[B + 2 * i - 1], V[B + 2 * i]
    local k = idiv(now, d)
    local count = 0
    if tonumber(stored[2 * i - 1]) == k then count = tonumber(stored[2 * i]) end
    S[i], S[N + i] = count, k
    if count + cost > limit then
      allowed = false
      -- The next window starts empty; a cost above the limit never fits.
      local wait = (k + 1) * d - now
      if cost > limit then wait = d end
      if wait > retry then retry = wait end
    end
  end
  return allowed, retry
end

local function commit(key, B, N, S)
  local args = {}
  local expires = now
  for i = 1, N do
    local k = S[N + i]
    S[i] = S[i] + cost
    args[4 * i - 3] = S[2 * N + 2 * i - 1]
    args[4 * i - 2] = fmt('%d', k)
    args[4 * i - 1] = S[2 * N + 2 * i]
    args[4 * i] = fmt('%d', S[i])
    expires = math.max(expires, (k + 1) * V[B + 2 * i - 1])
  end
  redis.call('HSET', key, unpack(args))
  expire_at(key, expires)
end

local function remaining(B, N, S, i)
  return math.max(V[B + 2 * i] - S[i], 0)
end

local function reset(key, B, N, S, i)
  return (S[N + i] + 1) * V[B + 2 * i - 1] - now
end
