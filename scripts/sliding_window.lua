-- Sliding window counter: the current fixed window's count plus the
-- previous window's count weighted by the part of it the sliding window
-- still covers: used = prev * (d - elapsed) / d + cur (doubles, in exactly
-- this order, as in the Rust memory store). A budget is a hash with, per
-- window length d, '<d>k' (window number), '<d>c' (its count) and '<d>p'
-- (the previous window's count). An allowed request: HMGET, HSET, PEXPIRE.

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
  local function fits(e)
    return used(p, c, d, e) + k <= limit
  end
  if fits(base) then return offset end
  local room = limit - c - k
  local e = math.ceil(d - room * d / p)
  if e < base then e = base end
  if e > d then e = d end
  while e > base and fits(e - 1) do e = e - 1 end
  while e < d and not fits(e) do e = e + 1 end
  return offset + e - base
end

local function evaluate(key, D, L)
  local n = #D
  local fields = {}
  for i = 1, n do
    local d = fmt(D[i])
    fields[3 * i - 2] = d .. 'k'
    fields[3 * i - 1] = d .. 'c'
    fields[3 * i] = d .. 'p'
  end
  local stored = redis.call('HMGET', key, unpack(fields))
  local K, CUR, PREV, E = {}, {}, {}, {}
  local budget = { allowed = true, retry = 0 }
  for i = 1, n do
    local d = D[i]
    local k = idiv(now, d)
    K[i] = k
    E[i] = now - k * d
    local sk = tonumber(stored[3 * i - 2])
    CUR[i], PREV[i] = 0, 0
    if sk == k then
      CUR[i], PREV[i] = tonumber(stored[3 * i - 1]), tonumber(stored[3 * i])
    elseif sk == k - 1 then
      PREV[i] = tonumber(stored[3 * i - 1])
    end
    if used(PREV[i], CUR[i], d, E[i]) + cost > L[i] then
      budget.allowed = false
      local wait = wait_for(PREV[i], CUR[i], d, E[i], L[i], cost)
      if wait > budget.retry then budget.retry = wait end
    end
  end
  local remaining = {}

  function budget.commit()
    local args = {}
    local expires = now
    for i = 1, n do
      CUR[i] = CUR[i] + cost
      args[#args + 1] = fields[3 * i - 2]
      args[#args + 1] = fmt(K[i])
      args[#args + 1] = fields[3 * i - 1]
      args[#args + 1] = fmt(CUR[i])
      args[#args + 1] = fields[3 * i]
      args[#args + 1] = fmt(PREV[i])
      -- The current count still weighs in during the next window.
      expires = math.max(expires, (K[i] + 2) * D[i])
    end
    redis.call('HSET', key, unpack(args))
    expire_at(key, expires)
  end

  function budget.remaining()
    for i = 1, n do
      remaining[i] = math.floor(math.max(L[i] - used(PREV[i], CUR[i], D[i], E[i]), 0))
    end
    return remaining
  end

  function budget.reset(i)
    return wait_for(PREV[i], CUR[i], D[i], E[i], L[i], remaining[i] + 1)
  end

  return budget
end
