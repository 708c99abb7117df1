-- Checks sent together. The store sends the checks that arrive in the
-- same scheduler tick as one batch (src/store/redis.rs, `Batcher`); those
-- of one algorithm and window count that run a straight-line script on
-- one key go as ONE call of this script instead of one EVALSHA each:
-- Redis parses, looks up and sets up one script call, and reads its clock
-- once, for the whole batch.
--
-- KEYS[i] and ARGV[i] are check i's key and numbers, as the straight-line
-- script takes them in KEYS[1] and ARGV[1], and the reply is the list of
-- that script's replies, one per check, in order. Each check decides
-- exactly as it would alone (the very same code, in `check` below), and
-- all of them at one instant: the script runs atomically, at one reading
-- of the server's clock. A check that fails answers with its error, and the
-- others with their decisions.
local clock
local function server_time()
  if not clock then clock = redis.call('TIME') end
  return clock
end
-- (A check with a block time has a second key, and is never sent here.)
local function no_block_key()
  error('a check with a block time in a batch')
end
-- (Helpers the checks share, made once per batch.)
$SHARED
local function check(i)
  $CHECK
end
local replies = {}
for i = 1, #KEYS do
  local ok, reply = pcall(check, i)
  if ok then
    replies[i] = reply
  elseif type(reply) == 'table' then
    -- (An error a command raised, as Redis gives it: a table with `err`.)
    replies[i] = reply
  else
    replies[i] = { err = 'ERR ' .. tostring(reply) }
  end
end
return replies
