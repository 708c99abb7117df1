-- Sliding log: a budget is a sorted set of the distinct microsecond
-- timestamps of allowed requests (member = score), shared by all its
-- windows, trimmed to the longest. A request of cost c takes the first c
-- free microseconds at or after now, so two requests in one microsecond are
-- both counted. An entry at t is in a window of length d while now < t + d.
--
-- An allowed request on 3 windows costs ZREMRANGEBYSCORE, ZCARD, 2 ZCOUNT,
-- ZADD, PEXPIRE and one ZRANGE (for the reset).

local function evaluate(key, D, L)
  local n = #D
  local longest = D[n]
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - longest))
  local total = redis.call('ZCARD', key)
  local counts = {}
  local budget = { allowed = true, retry = 0 }
  for i = 1, n do
    local d = D[i]
    local count = total
    if i < n and total > 0 then
      count = redis.call('ZCOUNT', key, '(' .. fmt(now - d), '+inf')
    end
    counts[i] = count
    local need = count + cost - L[i]
    if need > 0 then
      budget.allowed = false
      local wait = d
      if need <= count then
        -- The need-th oldest entry of the window must leave it.
        local rank = total - count + need - 1
        local e = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
        wait = tonumber(e[2]) + d - now
      end
      if wait > budget.retry then budget.retry = wait end
    end
  end
  local size = total

  function budget.commit()
    -- Try now .. now+cost-1 at once; members that exist are skipped (NX)
    -- and the missing ones take the next free microseconds.
    local added = 0
    local t = now
    while added < cost do
      local args = { 'NX' }
      local upto = math.min(t + (cost - added), t + 512)
      while t < upto do
        local s = fmt(t)
        args[#args + 1] = s
        args[#args + 1] = s
        t = t + 1
      end
      added = added + redis.call('ZADD', key, unpack(args))
    end
    size = total + cost
    for i = 1, n do counts[i] = counts[i] + cost end
    expire_at(key, t - 1 + longest)
  end

  function budget.remaining()
    local r = {}
    for i = 1, n do r[i] = math.max(L[i] - counts[i], 0) end
    return r
  end

  function budget.reset(i)
    if counts[i] == 0 then return 0 end
    local rank = size - counts[i]
    local e = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
    return tonumber(e[2]) + D[i] - now
  end

  return budget
end
