-- Shared by every rate-limit script: the arguments, and helpers. The store
-- sends prelude.lua + <algorithm>.lua + epilogue.lua as one script.
--
-- KEYS[1]  the user's budget state
-- KEYS[2]  the user's block marker (read and written only with a block time)
-- KEYS[3]  the route-wide budget state (only with route-wide windows)
-- ARGV[1]  the numbers of the check, packed as little-endian signed 64-bit
--          integers (struct 'i8', no text to parse):
--            now in microseconds (negative: use the server's clock, TIME),
--            cost of the request,
--            block time in microseconds (0 for none),
--            number of user windows, then (length us, limit) pairs,
--              shortest first,
--            number of route-wide windows, then their pairs.
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
-- floor(a / b) is exact for integers 0 <= a < 2^53, b > 0: the quotient's
-- distance to the next integer is at least 1/b, more than its rounding
-- error, a/b * 2^-53, so rounding never crosses an integer.
--
-- Redis runs this whole chunk on every call, so it is written to allocate
-- and convert little: the numbers are unpacked once into V; a budget is a
-- base index B into V and a window count N (window i has length
-- V[B + 2i - 1] and limit V[B + 2i]); its per-window state lives in one
-- table S; numbers go to redis.call as strings formatted with %d (Redis
-- would print a Lua number with %.14g).

local fmt = string.format
local floor, ceil, max = math.floor, math.ceil, math.max
local packed = ARGV[1]
-- ('<i8' repeated: one string to build, and each '<' is harmless)
local V = { struct.unpack(string.rep('<i8', #packed / 8), packed) }
local now = V[1]
-- Milliseconds added to every TTL. TTLs run on the server's clock; with an
-- injected clock (tests), real time may pass faster than the injected one,
-- so keys then live 10 s longer. That changes no decision: every state
-- carries its own times, and stale state reads as empty.
local ttl_pad = 10000
if now < 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2] -- coerced once each (tonumber converts twice)
  ttl_pad = 0
end
local cost = V[2]
local block = V[3]
local UB, UN = 4, V[4]
local GB = UB + 2 * UN + 1
local GN = V[GB]

-- Each algorithm defines, for a budget (key, B, N) with its state table S:
--   evaluate(key, B, N, S) -> allowed, retry (the longest wait among its
--     denying windows), filling S;
--   commit(key, B, N, S) records the request;
--   fill(B, N, S, out, o) -> best, least: writes the remaining of window i
--     to out[o + i] and returns the constraining window (fewest remaining;
--     ties: the shorter) and its remaining, read after any commit (one
--     call per budget: Lua calls are what this script spends most on);
--   reset(key, B, N, S, i) for window i.
