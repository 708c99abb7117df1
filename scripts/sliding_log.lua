-- Sliding log over every window of one budget, decided atomically.
--
-- KEYS[1]  the budget's log: a sorted set whose members are the microsecond
--          timestamps of allowed requests (score = member), strictly
--          increasing, so two requests in one microsecond are both counted.
-- ARGV[1]  now, in microseconds; empty to use the server's clock (TIME)
-- ARGV[2]  cost of the request (entries it takes)
-- ARGV[3..] window length (microseconds) and limit, pairs, shortest first
--
-- Returns { allowed (0/1), retry_after_us, remaining_1, reset_1_us, ... }.
-- A request is recorded only if every window allows it (all or nothing);
-- a denied request writes nothing. The log is trimmed to the longest window
-- and expires (PEXPIRE) when its last entry leaves that window.
--
-- Numbers are written with %d: Lua's default formatting keeps 14 digits,
-- and timestamps have 16.

local key = KEYS[1]
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local cost = tonumber(ARGV[2])
local n = (#ARGV - 2) / 2
local longest = tonumber(ARGV[1 + 2 * n])

-- Entries at t leave a window of length d when now >= t + d.
redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now - longest))
local total = redis.call('ZCARD', key)

local counts = {}
local allowed = 1
local retry = 0
for i = 1, n do
  local d = tonumber(ARGV[1 + 2 * i])
  local limit = tonumber(ARGV[2 + 2 * i])
  local count = total
  if i < n and total > 0 then
    count = redis.call('ZCOUNT', key, string.format('(%d', now - d), '+inf')
  end
  counts[i] = count
  local need = count + cost - limit
  if need > 0 then
    allowed = 0
    local wait = d
    if need <= count then
      -- The need-th oldest entry of the window must leave it.
      local rank = total - count + need - 1
      local e = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
      wait = tonumber(e[2]) + d - now
    end
    if wait > retry then retry = wait end
  end
end

local size = total
if allowed == 1 then
  local ts = now
  if total > 0 then
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    local l = tonumber(last[2])
    if l >= ts then ts = l + 1 end
  end
  -- ZADD in batches, to stay within Lua's stack for large costs.
  local j = 0
  while j < cost do
    local args = {}
    local upto = math.min(cost, j + 512)
    while j < upto do
      local s = string.format('%d', ts + j)
      args[#args + 1] = s
      args[#args + 1] = s
      j = j + 1
    end
    redis.call('ZADD', key, unpack(args))
  end
  size = total + cost
  for i = 1, n do counts[i] = counts[i] + cost end
  -- Expire when the newest entry leaves the longest window.
  local ttl = math.ceil((ts + cost - 1 + longest - now) / 1000)
  redis.call('PEXPIRE', key, math.max(ttl, 1))
end

local out = { allowed, retry }
for i = 1, n do
  local d = tonumber(ARGV[1 + 2 * i])
  local limit = tonumber(ARGV[2 + 2 * i])
  local reset = 0
  if counts[i] > 0 then
    local rank = size - counts[i]
    local e = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
    reset = tonumber(e[2]) + d - now
  end
  local remaining = limit - counts[i]
  if remaining < 0 then remaining = 0 end
  out[#out + 1] = remaining
  out[#out + 1] = reset
end
return out
