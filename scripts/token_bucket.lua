-- Token bucket as GCRA: a window of n per w is a bucket of n tokens refilled
-- one every t = ceil(w / n) microseconds. A budget is a hash with, per
-- window length w, the field '<w>t': the theoretical arrival time (TAT). A
-- request of cost c is allowed when max(TAT, now) + c*t - now <= n*t. An
-- allowed request: HMGET, HSET, PEXPIRE.

local function evaluate(key, D, L)
  local n = #D
  local fields = {}
  for i = 1, n do fields[i] = fmt(D[i]) .. 't' end
  local stored = redis.call('HMGET', key, unpack(fields))
  local T, TAT = {}, {}
  local budget = { allowed = true, retry = 0 }
  for i = 1, n do
    local size = L[i]
    local t = idiv(D[i], size)
    if t * size < D[i] then t = t + 1 end
    if t < 1 then t = 1 end
    T[i] = t
    TAT[i] = math.max(tonumber(stored[i]) or 0, now)
    local nxt = TAT[i] + cost * t
    if nxt - now > size * t then
      budget.allowed = false
      local wait = nxt - now - size * t
      if cost > size then wait = size * t end
      if wait > budget.retry then budget.retry = wait end
    end
  end
  local remaining = {}

  function budget.commit()
    local args = {}
    local expires = now
    for i = 1, n do
      TAT[i] = TAT[i] + cost * T[i]
      args[#args + 1] = fields[i]
      args[#args + 1] = fmt(TAT[i])
      expires = math.max(expires, TAT[i])
    end
    redis.call('HSET', key, unpack(args))
    expire_at(key, expires)
  end

  function budget.remaining()
    for i = 1, n do
      remaining[i] = idiv(math.max(L[i] * T[i] - (TAT[i] - now), 0), T[i])
    end
    return remaining
  end

  function budget.reset(i)
    if remaining[i] >= L[i] then return 0 end
    return math.max(TAT[i] - now - (L[i] - remaining[i] - 1) * T[i], 0)
  end

  return budget
end
