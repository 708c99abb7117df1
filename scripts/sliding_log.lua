-- Sliding log: a budget is a sorted set of the distinct microsecond
-- timestamps of allowed requests (member = score), shared by all its
-- windows, trimmed to the longest. A request of cost c takes the first c
-- free microseconds at or after now, so two requests in one microsecond are
-- both counted. An entry at t is in a window of length d while now < t + d.
--
-- An allowed request on 3 windows costs ZREMRANGEBYSCORE, ZCARD, 2 ZCOUNT,
-- ZADD, PEXPIRE and one ZRANGE (for the reset). S[i] is the count of window
-- i, S[N + 1] the size of the set.

-- Sets a key's TTL to end at `expires` (microseconds on the script's clock),
-- at least one millisecond.
local function expire_at(key, expires)
  redis.call('PEXPIRE', key, fmt('%d', max(ceil((expires - now) / 1000), 1) + ttl_pad))
end

-- The timestamp of the entry at `rank` (members are their own scores; the
-- arithmetic converts the string once, tonumber would twice).
local function entry_at(key, rank)
  local r = fmt('%d', rank)
  return redis.call('ZRANGE', key, r, r)[1] + 0
end

local function evaluate(key, B, N, S)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt('%d', now - V[B + 2 * N - 1]))
  local total = redis.call('ZCARD', key)
  S[N + 1] = total
  local allowed, retry = true, 0
  for i = 1, N do
    local d = V[B + 2 * i - 1]
    local count = total
    if i < N and total > 0 then
      count = redis.call('ZCOUNT', key, fmt('(%d', now - d), '+inf')
    end
    S[i] = count
    local need = count + cost - V[B + 2 * i]
    if need > 0 then
      allowed = false
      local wait = d
      if need <= count then
        -- The need-th oldest entry of the window must leave it.
        wait = entry_at(key, total - count + need - 1) + d - now
      end
      if wait > retry then retry = wait end
    end
  end
  return allowed, retry
end

local function commit(key, B, N, S)
  -- Try now .. now+cost-1 at once; members that exist are skipped (NX)
  -- and the missing ones take the next free microseconds.
  local t = now
  local added = 0
  if cost == 1 then
    local s = fmt('%d', t)
    added = redis.call('ZADD', key, 'NX', s, s)
    t = t + 1
  end
  while added < cost do
    local args = { 'NX' }
    local upto = math.min(t + (cost - added), t + 512)
    while t < upto do
      local s = fmt('%d', t)
      args[#args + 1] = s
      args[#args + 1] = s
      t = t + 1
    end
    added = added + redis.call('ZADD', key, unpack(args))
  end
  S[N + 1] = S[N + 1] + cost
  for i = 1, N do S[i] = S[i] + cost end
  expire_at(key, t - 1 + V[B + 2 * N - 1])
end

local function reset(key, B, N, S, i)
  if S[i] == 0 then return 0 end
  return entry_at(key, S[N + 1] - S[i]) + V[B + 2 * i - 1] - now
end
