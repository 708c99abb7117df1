-- Shared by every rate-limit script (prepended by the store).
--
-- KEYS[1]  the budget's state
-- ARGV[1]  now, in microseconds; empty to use the server's clock (TIME)
-- ARGV[2]  cost of the request
-- ARGV[3..] window length (microseconds) and limit, pairs, shortest first
--
-- Every script returns { allowed (0/1), retry_after_us, reset_us,
-- remaining_1, ..., remaining_n }, where reset_us belongs to the
-- constraining window (fewest remaining; ties: the shorter). A request is
-- recorded only if every window allows it; a denied one writes nothing.
--
-- All arithmetic stays on integers below 2^53 (exact in Lua's doubles), and
-- numbers are written with %d: Lua's default formatting keeps 14 digits and
-- timestamps have 16. The Rust memory store computes the same functions.

local key = KEYS[1]
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local cost = tonumber(ARGV[2])
local n = (#ARGV - 2) / 2
local D, L = {}, {}
for i = 1, n do
  D[i] = tonumber(ARGV[1 + 2 * i])
  L[i] = tonumber(ARGV[2 + 2 * i])
end

local function fmt(x)
  return string.format('%d', x)
end

-- floor(a / b) for non-negative integers, exact even where the double
-- quotient rounds up to the next integer.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- The window with the fewest remaining; ties go to the shorter one.
local function constraining(remaining)
  local best = 1
  for i = 2, n do
    if remaining[i] < remaining[best] then best = i end
  end
  return best
end

-- Sets the key's TTL to end at `expires` (microseconds on the script's
-- clock), at least one millisecond.
local function expire_at(expires)
  redis.call('PEXPIRE', key, math.max(math.ceil((expires - now) / 1000), 1))
end

-- The reply.
local function reply(allowed, retry, reset, remaining)
  local out = { allowed, retry, reset }
  for i = 1, n do out[3 + i] = remaining[i] end
  return out
end

