
-- Sliding log (sliding_log.lua, straight_sliding_log.lua): records `more`
-- requests' worth of entries in the set `key` at the first free
-- microseconds at or after `t` (members that exist are skipped with NX),
-- up to 512 per ZADD, and returns the microsecond after the last one
-- added. Only for a request that costs more than 1 or whose microsecond is
-- taken; the common one-entry ZADD is written out where it is made.
local function add_entries(key, t, more)
  -- When every microsecond from t to the newest entry is taken (a budget
  -- busier than one request per microsecond, or after a costly request),
  -- the first free one follows the newest: found in one search, not by
  -- ZADDs skipping the run a batch at a time (as push() in sliding_log.rs).
  local newest = redis.call('ZRANGE', key, -1, -1)[1]
  if newest then
    newest = newest + 0
    if newest >= t and
        redis.call('ZCOUNT', key, string.format('%d', t), '+inf') == newest - t + 1 then
      t = newest + 1
    end
  end
  local added = 0
  while added < more do
    local args = { 'NX' }
    local upto = math.min(t + (more - added), t + 512)
    while t < upto do
      local s = string.format('%d', t)
      args[#args + 1] = s
      args[#args + 1] = s
      t = t + 1
    end
    added = added + redis.call('ZADD', key, unpack(args))
  end
  return t
end
