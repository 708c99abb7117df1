
-- Sliding log (sliding_log.lua) for one budget: the sorted set `key` of the
-- microsecond timestamps of its allowed requests (member = score), trimmed
-- to the longest window, window $N. Window i (length di, limit ni) counts
-- ci entries (ZCOUNT; the longest counts the whole set). An allowed check
-- of 3 windows runs TIME, ZREMRANGEBYSCORE, ZCARD, 2 ZCOUNT, ZADD, PEXPIRE
-- and one ZRANGE (the reset), as the general script does, with no table
-- but the reply, no function on the usual path and no loop.
local fmt = string.format
redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt('%d', now - d$N))
local size = redis.call('ZCARD', key)
--$each
local c@ = size
if @ < $N and size > 0 then c@ = redis.call('ZCOUNT', key, fmt('(%d', now - d@), '+inf') end
--$end
-- A denying window's wait: until the oldest entry that must leave it does
-- (rank size + cost - ni - 1), or its whole length for a cost above its
-- limit.
local allowed, retry = 1, 0
--$each
if c@ + cost > n@ then
  allowed = 0
  local wait = d@
  if cost <= n@ then
    local rank = fmt('%d', size + cost - n@ - 1)
    wait = redis.call('ZRANGE', key, rank, rank)[1] + d@ - now
  end
  if wait > retry then retry = wait end
end
--$end
if allowed == 1 then
  local t, added = now + 1, 1
  if cost == 1 then
    local s = fmt('%d', now)
    added = redis.call('ZADD', key, 'NX', s, s)
  else
    t, added = now, 0
  end
  if added < cost then t = add_entries(key, t, cost - added) end
  size = size + cost
--$each
  c@ = c@ + cost
--$end
  -- (The TTL, in milliseconds as straight_save.lua works it out: until the
  -- newest entry leaves the longest window.)
  local ms = t - 1 + d$N - now - 1
  ms = (ms - ms % 1000) / 1000 + 1
  if ms < 1 then ms = 1 end
  redis.call('PEXPIRE', key, fmt('%d', ms + ttl_pad))
end

-- Remaining = limit - count, at least 0, and the constraining window (the
-- first with the fewest), which resets when its oldest entry leaves it.
local least, best_count, best_length = 9007199254740992, 0, 0
--$each
local r@ = n@ - c@
if r@ < 0 then r@ = 0 end
if r@ < least then least, best_count, best_length = r@, c@, d@ end
--$end
local reset = 0
if best_count > 0 then
  local rank = fmt('%d', size - best_count)
  reset = redis.call('ZRANGE', key, rank, rank)[1] + best_length - now
end
return struct.pack('<i8i8i8i8$each(){i8}', allowed, retry, reset, 0, $each(, ){r@})
