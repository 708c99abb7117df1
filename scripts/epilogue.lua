-- The decision over the user's budget and the route's, with blocks.

-- (Defined only for rules with a block time: every closure costs each call.)
local blocked_reply
if block > 0 then
  blocked_reply = function(wait)
    local out = { 0, wait, wait, 1 }
    for i = 1, UN + GN do out[4 + i] = 0 end
    return out
  end
  local blocked_until = tonumber(redis.call('GET', KEYS[2]))
  if blocked_until and blocked_until > now then
    return blocked_reply(blocked_until - now)
  end
end

local US, GS = {}, nil
local user_ok, retry = evaluate(KEYS[1], UB, UN, US)
local route_ok = true
if GN > 0 then
  GS = {}
  local route_retry
  route_ok, route_retry = evaluate(KEYS[3], GB, GN, GS)
  if route_retry > retry then retry = route_retry end
end

local allowed = 0
if user_ok and route_ok then
  allowed = 1
  commit(KEYS[1], UB, UN, US)
  if GS then commit(KEYS[3], GB, GN, GS) end
elseif block > 0 and not user_ok then
  -- The user exceeded their own limits: block them, atomically.
  redis.call('SET', KEYS[2], fmt('%d', now + block), 'PX', math.max(math.ceil(block / 1000), 1) + ttl_pad)
  return blocked_reply(math.max(block, retry))
end

-- Remaining per window, and the constraining window (fewest remaining;
-- ties go to the user's budget, then to the shorter window).
local out = { allowed, retry, 0, 0 }
local best, least = fill(UB, UN, US, out, 4)
local route_best, route_least = 0, 0
if GS then route_best, route_least = fill(GB, GN, GS, out, 4 + UN) end
if route_best > 0 and (best == 0 or route_least < least) then
  out[3] = reset(KEYS[3], GB, GN, GS, route_best)
elseif best > 0 then
  out[3] = reset(KEYS[1], UB, UN, US, best)
end
return out
