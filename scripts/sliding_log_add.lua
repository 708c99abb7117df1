
-- Sliding log (sliding_log.lua): records `more`
-- requests' worth of entries in the set `key` at the first free
-- microseconds at or after `t` (members that exist are skipped with NX),
-- up to 512 per ZADD, and returns the microsecond after the last one
-- added. Only for a request that costs more than 1 or whose microsecond is
-- taken, and for a penalty (adjust.lua); the common one-entry ZADD is
-- written out where it is made.

-- `t`, or the microsecond after the newest entry when every one from `t`
-- to the newest is taken (a budget busier than one request per
-- microsecond, or after a costly request): one search, not ZADDs skipping
-- the run a batch at a time (as push() in sliding_log.rs).
local function past_taken_run(key, t)
  local newest = redis.call('ZRANGE', key, '-1', '-1')[1]
  if newest then
    newest = newest + 0
    if newest >= t and
        redis.call('ZCOUNT', key, string.format('%d', t), '+inf') == newest - t + 1 then
      return newest + 1
    end
  end
  return t
end

local function add_entries(key, t, more)
  t = past_taken_run(key, t)
  local added = 0
  while added < more do
    local args = { 'NX' }
    local upto = math.min(t + (more - added), t + 512)
    local tried = upto - t
    while t < upto do
      local s = string.format('%d', t)
      args[#args + 1] = s
      args[#args + 1] = s
      t = t + 1
    end
    local got = redis.call('ZADD', key, unpack(args))
    added = added + got
    -- Some were taken (a clock stepped back below a run): look again.
    if got < tried then t = past_taken_run(key, t) end
  end
  return t
end
