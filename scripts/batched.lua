-- Checks sent together. The store sends the checks that arrive in the
-- same scheduler tick as one batch (src/store/redis.rs, `Batcher`); those
-- of one algorithm and window count that run a straight-line script on
-- one key go as ONE call of this script instead of one EVALSHA each:
-- Redis parses, looks up and sets up one script call, and reads its clock
-- once, for the whole batch.
--
-- KEYS[i] is check i's key, as the straight-line script takes it in
-- KEYS[1]. ARGV holds the checks' numbers (what that script takes in
-- ARGV[1]) once for all the checks that have the same, in order: ARGV[1]
-- is the numbers of the first ARGV[2] checks, ARGV[3] those of the next
-- ARGV[4], and so on (a batch's checks mostly have the same: one rule, a
-- cost of 1, the server's clock; the store keeps the checks in the order
-- they came, two of one key must run in that order, and starts a new run
-- where the numbers change). Redis makes each argument a Lua string,
-- hashing every byte, and the script unpacks each once.
--
-- The reply is the list of that script's replies, one per check, in order.
-- Each check decides exactly as it would alone (the very same code, in
-- `run` below), and all of them at one instant: the script runs
-- atomically, at one reading of the server's clock. A check that fails
-- answers with its error, and the others with their decisions.
local n = #KEYS
-- (Counts that do not add up to one per key, or that are not whole
-- numbers, are a bug of the caller: no check runs.)
local counted = 0
for g = 2, #ARGV, 2 do
  local count = tonumber(ARGV[g])
  if not count or count < 1 or count % 1 ~= 0 then counted = -1; break end
  counted = counted + count
end
if counted ~= n or #ARGV % 2 ~= 0 then
  return redis.error_reply('ERR a batch of checks whose numbers do not match its keys')
end
-- The numbers of the checks running now: ARGV[g].
local g = -1
-- (The server's clock in microseconds, read once, on the first check that
-- asks: `clock or server_now()`. TIME answers with two strings, which cost
-- Redis's Lua about 1,900 instructions to make a number of.)
local clock
local function server_now()
  local t = redis.call('TIME')
  clock = t[1] * 1000000 + t[2]
  return clock
end
-- (The library functions the checks call, made locals once per batch:
-- see straight_prelude.lua.)
$LIBS
local unpack, KEYS = unpack, KEYS
-- (Helpers the checks share, made once per batch.)
$SHARED
-- The checks from `from` on, in order, until one fails (then the first
-- check without a reply, after `done`): one pcall for them all, not one
-- per check. (The replies' list is made at its full size, from the keys,
-- which the replies replace: grown one reply at a time, Redis's Lua would
-- move it at every power of two.)
-- Each run of checks that have the same numbers unpacks them once, into
-- locals, and reads the clock once; then each check's code runs inline,
-- in a `repeat ... until true` that its answer leaves with `break` (its
-- `return` alone), not as a function: a call of a Lua function with a
-- frame the size of a check's costs Redis about 1,100 instructions, 3% of
-- a check (benches/HISTORY.md, round 55). (Its `i` is the check's.)
local replies, last, done = { unpack(KEYS) }, 0, 0
local function run(from)
  local i = from
  while i <= n do
    if i > last then
      g = g + 2
      last = last + tonumber(ARGV[g + 1])
    end
    local late = false
    $ARGS
    while i <= last do
      repeat
        if late then replies[i] = '' break end
        $CHECK
      until true
      done = i
      i = i + 1
    end
  end
end
local from = 1
while from <= n do
  local ok, reply = pcall(run, from)
  if ok then break end
  local i = done + 1
  if type(reply) == 'table' then
    -- (An error a command raised, as some Redis versions give it: a table
    -- with `err`.)
    replies[i] = reply
  elseif type(reply) == 'string' and string.find(reply, '^%u+ ') then
    -- (The same as Redis 7 gives it: its text, which starts with its code,
    -- `READONLY ...`: kept, so the client reads the code.)
    replies[i] = { err = reply }
  else
    replies[i] = { err = 'ERR ' .. tostring(reply) }
  end
  done, from = i, i + 1
end
return replies
