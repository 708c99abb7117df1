-- A baseline for benchmarks only: the straightforward sliding log with one
-- sorted set per window (ZREMRANGEBYSCORE + ZCARD per key, then ZADD +
-- PEXPIRE per key). The store uses sliding_log.lua; this one exists to
-- measure what sharing one set per budget saves.
--
-- KEYS[i]  the log of window i
-- ARGV[1]  now (microseconds), or empty for TIME; ARGV[2] cost;
-- ARGV[3..] window length (microseconds) and limit, pairs
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local cost = tonumber(ARGV[2])
local n = #KEYS
local allowed = 1
for i = 1, n do
  local d = tonumber(ARGV[1 + 2 * i])
  local limit = tonumber(ARGV[2 + 2 * i])
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', string.format('%d', now - d))
  if redis.call('ZCARD', KEYS[i]) + cost > limit then allowed = 0 end
end
if allowed == 1 then
  local seq = redis.call('INCR', KEYS[1] .. ':seq')
  for i = 1, n do
    local d = tonumber(ARGV[1 + 2 * i])
    local m = string.format('%d-%d', now, seq)
    redis.call('ZADD', KEYS[i], string.format('%d', now), m)
    redis.call('PEXPIRE', KEYS[i], math.ceil(d / 1000))
  end
  redis.call('PEXPIRE', KEYS[1] .. ':seq', 1000)
end
return allowed
