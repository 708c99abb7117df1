-- Sliding log over every window of one budget, decided atomically.
--
-- KEYS[1]  the budget's log: a sorted set of the distinct microsecond
--          timestamps of allowed requests (member = score).
-- ARGV[1]  now, in microseconds; empty to use the server's clock (TIME)
-- ARGV[2]  cost of the request (entries it takes)
-- ARGV[3..] window length (microseconds) and limit, pairs, shortest first
--
-- Returns { allowed (0/1), retry_after_us, reset_us, remaining_1, ... }
-- where reset_us belongs to the constraining window (fewest remaining,
-- ties: the shorter). A request is recorded only if every window allows it
-- (all or nothing); a denied request writes nothing. A request takes the
-- first free microseconds at or after now, so two requests in one
-- microsecond are both counted. The log is trimmed to the longest window
-- and expires (PEXPIRE) when its newest entry leaves that window.
--
-- The same decisions as src/store/sliding_log.rs, with as few commands as
-- possible: an allowed request on 3 windows costs TIME, ZREMRANGEBYSCORE,
-- ZCARD, 2 ZCOUNT, ZADD, PEXPIRE and one ZRANGE.
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

-- An entry at t leaves a window of length d when now >= t + d.
redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now - longest))
local total = redis.call('ZCARD', key)

local counts = {}
local allowed = 1
local retry = 0
for i = 1, n do
  local d = tonumber(ARGV[1 + 2 * i])
  local count = total
  if i < n and total > 0 then
    count = redis.call('ZCOUNT', key, string.format('(%d', now - d), '+inf')
  end
  counts[i] = count
  local need = count + cost - tonumber(ARGV[2 + 2 * i])
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
  -- Try now .. now+cost-1 at once; members that exist are skipped (NX) and
  -- the missing ones take the next free microseconds.
  local added = 0
  local t = now
  while added < cost do
    local args = { 'NX' }
    local upto = math.min(t + (cost - added), t + 512)
    while t < upto do
      local s = string.format('%d', t)
      args[#args + 1] = s
      args[#args + 1] = s
      t = t + 1
    end
    added = added + redis.call('ZADD', key, unpack(args))
  end
  size = total + cost
  for i = 1, n do counts[i] = counts[i] + cost end
  -- Expire when the newest entry leaves the longest window.
  redis.call('PEXPIRE', key, math.max(math.ceil((t - 1 + longest - now) / 1000), 1))
end

local out = { allowed, retry, 0 }
local best = nil
for i = 1, n do
  local remaining = tonumber(ARGV[2 + 2 * i]) - counts[i]
  if remaining < 0 then remaining = 0 end
  out[3 + i] = remaining
  if best == nil or remaining < out[3 + best] then best = i end
end
if counts[best] > 0 then
  local rank = size - counts[best]
  local e = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
  out[3] = tonumber(e[2]) + tonumber(ARGV[1 + 2 * best]) - now
end
return out
