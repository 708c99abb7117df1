
-- The decision over the user's budget and the route's, with blocks.

local function reply(allowed, retry, reset, blocked, remaining)
  local out = { allowed, retry, reset, blocked }
  for i = 1, #remaining do out[4 + i] = remaining[i] end
  return out
end

local function blocked_reply(wait)
  local zeros = {}
  for i = 1, #UD + #GD do zeros[i] = 0 end
  return reply(0, wait, wait, 1, zeros)
end

if block > 0 then
  local blocked_until = tonumber(redis.call('GET', KEYS[2]))
  if blocked_until and blocked_until > now then
    return blocked_reply(blocked_until - now)
  end
end

local user = evaluate(KEYS[1], UD, UL)
local route = nil
if #GD > 0 then route = evaluate(KEYS[3], GD, GL) end

local allowed = user.allowed and (route == nil or route.allowed)
local retry = user.retry
if route and route.retry > retry then retry = route.retry end
if allowed then
  user.commit()
  if route then route.commit() end
elseif block > 0 and not user.allowed then
  -- The user exceeded their own limits: block them, atomically.
  redis.call('SET', KEYS[2], fmt(now + block), 'PX', math.max(math.ceil(block / 1000), 1))
  return blocked_reply(math.max(block, retry))
end

local remaining = user.remaining()
local best = constraining(remaining)
local reset
if route then
  local shared = route.remaining()
  local shared_best = constraining(shared)
  if shared[shared_best] < remaining[best] then
    reset = route.reset(shared_best)
  else
    reset = user.reset(best)
  end
  local n = #remaining
  for i = 1, #shared do remaining[n + i] = shared[i] end
else
  reset = user.reset(best)
end
local allowed_flag = 0
if allowed then allowed_flag = 1 end
return reply(allowed_flag, retry, reset, 0, remaining)
