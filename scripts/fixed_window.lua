-- Fixed windows aligned on the Unix epoch: window k of length d is
-- [k*d, (k+1)*d). A budget is a hash with, per window length d, the fields
-- '<d>k' (the window number) and '<d>c' (its count). An allowed request
-- costs HMGET, HSET and PEXPIRE; a denied one HMGET.

local function evaluate(key, D, L)
  local n = #D
  local fields = {}
  for i = 1, n do
    fields[2 * i - 1] = fmt(D[i]) .. 'k'
    fields[2 * i] = fmt(D[i]) .. 'c'
  end
  local stored = redis.call('HMGET', key, unpack(fields))
  local K, C = {}, {}
  local budget = { allowed = true, retry = 0 }
  for i = 1, n do
    local d = D[i]
    local k = idiv(now, d)
    K[i] = k
    C[i] = 0
    if tonumber(stored[2 * i - 1]) == k then C[i] = tonumber(stored[2 * i]) end
    if C[i] + cost > L[i] then
      budget.allowed = false
      -- The next window starts empty; a cost above the limit never fits.
      local wait = (k + 1) * d - now
      if cost > L[i] then wait = d end
      if wait > budget.retry then budget.retry = wait end
    end
  end

  function budget.commit()
    local args = {}
    local expires = now
    for i = 1, n do
      C[i] = C[i] + cost
      args[#args + 1] = fields[2 * i - 1]
      args[#args + 1] = fmt(K[i])
      args[#args + 1] = fields[2 * i]
      args[#args + 1] = fmt(C[i])
      expires = math.max(expires, (K[i] + 1) * D[i])
    end
    redis.call('HSET', key, unpack(args))
    expire_at(key, expires)
  end

  function budget.remaining()
    local r = {}
    for i = 1, n do r[i] = math.max(L[i] - C[i], 0) end
    return r
  end

  function budget.reset(i)
    return (K[i] + 1) * D[i] - now
  end

  return budget
end
