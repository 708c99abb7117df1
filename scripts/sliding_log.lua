-- Sliding log: a budget is a sorted set of the distinct microsecond
-- timestamps of allowed requests (member = score), shared by all its
-- windows, trimmed to the longest. A request of cost c takes the first c
-- free microseconds at or after now, so two requests in one microsecond are
-- both counted. An entry at t is in a window of length d while now < t + d.
--
-- An allowed request on 3 windows costs ZREMRANGEBYSCORE, ZCARD, 2 ZCOUNT,
-- ZADD, PEXPIRE and two ZRANGEs (the newest entry, for the TTL, and one
-- for the reset). C[w] is the count of window
-- w; budget b (1: the user's, 2: the route's) holds windows first .. last,
-- and its set's size is total[b]. A budget without windows is not touched.

-- The timestamp of the entry at `rank` (members are their own scores; the
-- arithmetic converts the string once, tonumber would twice).
local function entry_at(key, rank)
  local r = fmt('%d', rank)
  return redis.call('ZRANGE', key, r, r)[1] + 0
end

local C = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }
local total = { 0, 0 }
local keys = { KEYS[1], KEYS[3] }
local user_ok, route_ok, retry = true, true, 0
for b = 1, 2 do
  local first, last = 1, UN
  if b == 2 then first, last = UN + 1, W end
  local key = keys[b]
  if first <= last then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt('%d', now - V[4 + 2 * last]))
    local n = redis.call('ZCARD', key)
    total[b] = n
    for w = first, last do
      local d = V[4 + 2 * w]
      local count = n
      if w < last and n > 0 then
        count = redis.call('ZCOUNT', key, fmt('(%d', now - d), '+inf')
      end
      C[w] = count
      local need = count + cost - V[5 + 2 * w]
      if need > 0 then
        if b == 2 then route_ok = false else user_ok = false end
        local wait = d
        if need <= count then
          -- The need-th oldest entry of the window must leave it.
          wait = entry_at(key, n - count + need - 1) + d - now
        end
        if wait > retry then retry = wait end
      end
    end
  end
end

if user_ok and route_ok then
  out[1] = 1
  for b = 1, 2 do
    local first, last = 1, UN
    if b == 2 then first, last = UN + 1, W end
    local key = keys[b]
    if first <= last then
      -- One entry at now, or (add_entries, sliding_log_add.lua) the next
      -- free microseconds.
      local t = now
      local added = 0
      if cost == 1 then
        local s = fmt('%d', t)
        added = redis.call('ZADD', key, 'NX', s, s)
        t = t + 1
      end
      if added < cost then t = add_entries(key, t, cost - added) end
      -- The key lives until its newest entry leaves the longest window:
      -- this request's last one, or an older request's that a clock which
      -- went back left ahead of it (only a set that had entries can hold
      -- one).
      local newest = t - 1
      if total[b] > 0 then
        local top = redis.call('ZRANGE', key, '-1', '-1')[1] + 0
        if top > newest then newest = top end
      end
      total[b] = total[b] + cost
      for w = first, last do C[w] = C[w] + cost end
      local ms = math.ceil((newest + V[4 + 2 * last] - now) / 1000)
      if ms < 1 then ms = 1 end
      redis.call('PEXPIRE', key, fmt('%d', ms + ttl_pad))
    end
  end
elseif block_user and not user_ok then
  return block_user(retry)
end
out[2] = retry

-- Remaining = limit - count, at least 0, and the constraining window (the
-- fewest; on a tie, the shorter window, then the first), which resets when its oldest entry leaves it.
local best, least = 0, 0
for w = 1, W do
  local r = V[5 + 2 * w] - C[w]
  if r < 0 then r = 0 end
  out[4 + w] = r
  if best == 0 or r < least or (r == least and V[4 + 2 * w] < V[4 + 2 * best]) then
    best, least = w, r
  end
end
if best > 0 and C[best] > 0 then
  local b = 1
  if best > UN then b = 2 end
  out[3] = entry_at(keys[b], total[b] - C[best]) + V[4 + 2 * best] - now
end
-- (The reply, packed: see prelude.lua.)
return struct.pack('<' .. rep('d', 4 + W), unpack(out, 1, 4 + W))
