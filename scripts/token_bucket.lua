-- Token bucket as GCRA: a window of n per w is a bucket of n tokens refilled
-- one every t = ceil(w / n) microseconds. KEYS[1] is a hash with, per window
-- length w, the field '<w>t': the theoretical arrival time (TAT). A request
-- of cost c is allowed when max(TAT, now) + c*t - now <= n*t. An allowed
-- request: HMGET, HSET, PEXPIRE.

local fields = {}
for i = 1, n do fields[i] = fmt(D[i]) .. 't' end
local stored = redis.call('HMGET', key, unpack(fields))

local T, TAT = {}, {}
local allowed = 1
local retry = 0
for i = 1, n do
  local size = L[i]
  local t = idiv(D[i], size)
  if t * size < D[i] then t = t + 1 end
  if t < 1 then t = 1 end
  T[i] = t
  TAT[i] = math.max(tonumber(stored[i]) or 0, now)
  local nxt = TAT[i] + cost * t
  if nxt - now > size * t then
    allowed = 0
    local wait = nxt - now - size * t
    if cost > size then wait = size * t end
    if wait > retry then retry = wait end
  end
end

if allowed == 1 then
  local args = {}
  local expires = now
  for i = 1, n do
    TAT[i] = TAT[i] + cost * T[i]
    args[#args + 1] = fields[i]
    args[#args + 1] = fmt(TAT[i])
    expires = math.max(expires, TAT[i])
  end
  redis.call('HSET', key, unpack(args))
  expire_at(expires)
end

local remaining = {}
for i = 1, n do
  remaining[i] = idiv(math.max(L[i] * T[i] - (TAT[i] - now), 0), T[i])
end
local b = constraining(remaining)
local reset = 0
if remaining[b] < L[b] then
  reset = math.max(TAT[b] - now - (L[b] - remaining[b] - 1) * T[b], 0)
end
return reply(allowed, retry, reset, remaining)
