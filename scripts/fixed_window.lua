-- Fixed windows aligned on the Unix epoch: window k of length d is
-- [k*d, (k+1)*d). KEYS[1] is a hash with, per window length d, the fields
-- '<d>k' (the window number) and '<d>c' (its count). 3 commands besides
-- TIME for an allowed request: HMGET, HSET, PEXPIRE; a denied one: HMGET.

local fields = {}
for i = 1, n do
  fields[2 * i - 1] = fmt(D[i]) .. 'k'
  fields[2 * i] = fmt(D[i]) .. 'c'
end
local stored = redis.call('HMGET', key, unpack(fields))

local K, C = {}, {}
local allowed = 1
local retry = 0
for i = 1, n do
  local d = D[i]
  local k = idiv(now, d)
  K[i] = k
  C[i] = 0
  if tonumber(stored[2 * i - 1]) == k then C[i] = tonumber(stored[2 * i]) end
  if C[i] + cost > L[i] then
    allowed = 0
    -- The next window starts empty; a cost above the limit never fits.
    local wait = (k + 1) * d - now
    if cost > L[i] then wait = d end
    if wait > retry then retry = wait end
  end
end

if allowed == 1 then
  local args = {}
  local expires = now
  for i = 1, n do
    C[i] = C[i] + cost
    args[#args + 1] = fields[2 * i - 1]
    args[#args + 1] = fmt(K[i])
    args[#args + 1] = fields[2 * i]
    args[#args + 1] = fmt(C[i])
    expires = math.max(expires, (K[i] + 1) * D[i])
  end
  redis.call('HSET', key, unpack(args))
  expire_at(expires)
end

local remaining = {}
for i = 1, n do remaining[i] = math.max(L[i] - C[i], 0) end
local best = constraining(remaining)
return reply(allowed, retry, (K[best] + 1) * D[best] - now, remaining)
