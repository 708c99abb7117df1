-- Shared by every rate-limit script: the arguments, and helpers. The store
-- sends prelude.lua + <algorithm>.lua + epilogue.lua as one script.
--
-- KEYS[1]  the user's budget state
-- KEYS[2]  the user's block marker (read and written only with a block time)
-- KEYS[3]  the route-wide budget state (only with route-wide windows)
-- ARGV[1]  now, in microseconds; empty to use the server's clock (TIME)
-- ARGV[2]  cost of the request
-- ARGV[3]  block time in microseconds, 0 for none
-- ARGV[4]  number of user windows, then (length us, limit) pairs, shortest first
-- then     number of route-wide windows, then their pairs
--
-- Reply: { allowed (0/1), retry_after_us, reset_us, blocked (0/1),
-- remaining of every user window, then of every route-wide window }, where
-- reset_us belongs to the constraining window (fewest remaining; ties: the
-- user's, then the shorter). All or nothing: a request is recorded in every
-- window of both budgets, or in none.
--
-- All arithmetic stays on integers below 2^53 (exact in Lua's doubles), and
-- numbers are written with %d: Lua's default formatting keeps 14 digits and
-- timestamps have 16. The Rust memory store computes the same functions.

local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local cost = tonumber(ARGV[2])
local block = tonumber(ARGV[3])

local function read_windows(at)
  local count = tonumber(ARGV[at])
  local D, L = {}, {}
  for i = 1, count do
    D[i] = tonumber(ARGV[at - 1 + 2 * i])
    L[i] = tonumber(ARGV[at + 2 * i])
  end
  return D, L, at + 1 + 2 * count
end
local UD, UL, next_at = read_windows(4)
local GD, GL = read_windows(next_at)

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
  for i = 2, #remaining do
    if remaining[i] < remaining[best] then best = i end
  end
  return best
end

-- Sets a key's TTL to end at `expires` (microseconds on the script's clock),
-- at least one millisecond.
local function expire_at(key, expires)
  redis.call('PEXPIRE', key, math.max(math.ceil((expires - now) / 1000), 1))
end

-- Each algorithm defines evaluate(key, D, L), returning a budget with
-- .allowed, .retry (the longest wait among its denying windows), .commit()
-- (record the request), .remaining() and .reset(i) (after any commit).
