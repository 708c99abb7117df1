-- Shared by every rate-limit script: the arguments, the reply and blocks.
-- The store sends prelude.lua + [counter_state.lua +] <algorithm>.lua as one
-- script.
--
-- KEYS[1]  the user's budget state
-- KEYS[2]  the user's block marker (read and written only with a block time,
--          and given only then; without one, a check with KEYS[3] repeats
--          KEYS[3] here, a key that exists while the route is in use)
-- KEYS[3]  the route-wide budget state (only with route-wide windows)
-- ARGV[1]  the numbers of the check, packed as little-endian doubles
--          (struct 'd', whole numbers; no text to parse, and cheaper to
--          unpack than the 64-bit integers of 'i8'):
--            now in microseconds (negative: use the server's clock, TIME,
--            and refuse the check, answering '', past minus this number
--            on it, unless it is -1),
--            cost of the request,
--            block time in microseconds (0 for none),
--            number of user windows UN, number of route-wide windows GN
--            (not for the straight-line scripts, straight_prelude.lua),
--            then (length us, limit) of every window: the user's, shortest
--            first, then the route's, shortest first; then, for the
--            packed sliding log alone, a fingerprint of the user's windows.
--
-- Reply: one string of little-endian doubles (whole numbers), packed like
-- ARGV[1] (one bulk string is cheaper for Redis to write and for the client
-- to read than an array of integers): allowed (0/1), retry_after_us,
-- reset_us, blocked (0/1), the remaining of every user window, then of
-- every route-wide window, where
-- reset_us belongs to the constraining window (fewest remaining; ties: the
-- shorter window, then the first in that order, the user's before a
-- route-wide one). (The straight-line
-- counter scripts answer otherwise: allowed, now, then the state they
-- left; see straight_fixed_window.lua. The packed sliding log answers an
-- allowed request with reset_us and the remaining alone, or, on its usual
-- path, with the bytes it wrote: see straight_packed_log.lua.) All or nothing: a
-- request is recorded in every window of both budgets, or in none.
--
-- All arithmetic stays on integers below 2^53 (exact in Lua's doubles), and
-- numbers are written with %d: Lua's default formatting keeps 14 digits and
-- timestamps have 16. The Rust memory store computes the same functions.
-- floor(a / b) is exact for integers 0 <= a < 2^53, b > 0: the quotient's
-- distance to the next integer is at least 1/b, more than its rounding
-- error, a/b * 2^-53, so rounding never crosses an integer. The scripts
-- write it (a - a % b) / b (Lua's % is a - floor(a / b) * b, so this is
-- exact too), and ceil(a / b) as floor((a - 1) / b) + 1 for a >= 1: a few
-- VM operations where math.floor is a C call.
--
-- Redis runs this whole chunk on every call, and callgrind shows what its
-- Lua spends: about 40 instructions per VM operation, 110 per table read,
-- 300 per C call, 1,200 per table that grows (each power of two reallocates
-- and rehashes it), 170 per variable a closure captures, 1,500 per extra
-- key, 5,000 to 10,000 per redis.call. So the scripts define no functions
-- on the common path (the block helpers exist only for rules with a block
-- time), make every table at its full size with a constructor, and treat
-- the windows of both budgets as one list, w = 1 .. W: window w has length
-- V[4 + 2w] and limit V[5 + 2w], and its state lives in one table S.
-- Numbers go to redis.call as strings formatted with %d (Redis would print
-- a Lua number with %.14g).

local fmt, rep = string.format, string.rep
local packed = ARGV[1]
-- (one '<' then 'd' repeated: a '<' per number costs the parser 60
-- instructions each)
local V = { struct.unpack('<' .. rep('d', #packed / 8), packed) }
local now = V[1]
-- Milliseconds added to every TTL. TTLs run on the server's clock; with an
-- injected clock (tests), real time may pass faster than the injected one,
-- so keys then live 10 s longer. That changes no decision: every state
-- carries its own times, and stale state reads as empty.
local ttl_pad = 10000
if now < 0 then
  -- (On the server's clock, `now` is minus the check's deadline on that
  -- clock, or -1 for none: a check Redis runs later than that, after a
  -- stall, has been answered by the caller's fail mode already, and is
  -- refused with an empty reply, recording nothing.)
  local t, deadline = redis.call('TIME'), -now
  now = t[1] * 1000000 + t[2] -- coerced once each (tonumber converts twice)
  if now > deadline and deadline > 1 then return '' end
  ttl_pad = 0
end
local cost, block, UN, GN = V[2], V[3], V[4], V[5]
local W = UN + GN

-- The reply, filled in place; 8 slots hold up to 4 windows (more grow the
-- table), and the reply ends after the last window.
local out = { 0, 0, 0, 0, 0, 0, 0, 0 }
out[5 + W] = nil

-- Blocks (only for rules with a block time). block_user(retry) blocks the
-- user after a request their own limits denied, and returns the reply.
local block_user
if block > 0 then
  local function blocked(wait)
    out[1], out[2], out[3], out[4] = 0, wait, wait, 1
    for w = 1, W do out[4 + w] = 0 end
    return struct.pack('<' .. rep('d', 4 + W), unpack(out, 1, 4 + W))
  end
  local blocked_until = tonumber(redis.call('GET', KEYS[2]))
  if blocked_until and blocked_until > now then
    return blocked(blocked_until - now)
  end
  -- A request of cost 1 (or 0) blocks for the block time or its own wait, the
  -- longer: a user blocked for less than the wait would be denied and
  -- blocked again when the block ends, so every blocked answer's wait is
  -- the time until the user can pass. (A costlier request's wait is its
  -- own, not a cheaper one's, and one above a limit waits for ever: those
  -- block for the block time.)
  block_user = function(retry)
    local hold = block
    if cost <= 1 then hold = math.max(block, retry) end
    redis.call('SET', KEYS[2], fmt('%d', now + hold), 'PX',
      fmt('%d', math.max(math.ceil(hold / 1000), 1) + ttl_pad))
    return blocked(math.max(block, retry))
  end
end
