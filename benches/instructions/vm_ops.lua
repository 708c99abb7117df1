-- Lua VM instructions a batch of the store's sliding-log checks runs,
-- line by line: the script run by a plain Lua 5.1 (the Lua Redis embeds)
-- against a mock of what Redis gives it (`redis.call` on an in-memory
-- table of strings, `struct` in Lua), counting each VM instruction of the
-- script's own code with a debug hook. Redis's Lua spends 20 to 40 machine
-- instructions on each (benches/HISTORY.md, round 54): this tells which
-- lines a check runs, and how many of them, where callgrind
-- (`steady.sh`) tells the machine instructions in all.
--
--   apt-get install lua5.1
--   cargo run -q --release --example lua sliding-log 3 --batched > /tmp/batch.lua
--   lua5.1 benches/instructions/vm_ops.lua /tmp/batch.lua 100 1200 12
--
-- Arguments: the script, the users, the checks counted (after 100 a user
-- to warm up), the checks per batch. As `steady.sh`: 3 windows (1 s, 1
-- min, 1 h, limits of 1,000,000), 80 checks a second per user, the
-- server's clock. Prints the VM instructions per check, then each line
-- run at least once in 20 checks, with how many a check runs there.
local script_file, nusers, nchecks, batch = arg[1], tonumber(arg[2]), tonumber(arg[3]), tonumber(arg[4])
local function enc(x)
  -- IEEE double little-endian for finite x
  if x == 0 then return string.rep('\0', 8) end
  local sign = 0
  if x < 0 then sign = 1; x = -x end
  local m, e = math.frexp(x) -- x = m * 2^e, 0.5 <= m < 1
  e = e + 1022
  m = (m * 2 - 1) * 2^52
  local bytes = {}
  for i = 1, 6 do bytes[i] = m % 256; m = (m - m % 256) / 256 end
  bytes[7] = (m % 16) + (e % 16) * 16
  bytes[8] = math.floor(e / 16) + sign * 128
  return string.char(unpack(bytes))
end
local function dec(s, i)
  local b = { s:byte(i, i + 7) }
  local sign = b[8] >= 128 and -1 or 1
  local e = (b[8] % 128) * 16 + math.floor(b[7] / 16)
  local m = b[7] % 16
  for j = 6, 1, -1 do m = m * 256 + b[j] end
  if e == 0 and m == 0 then return 0 end
  return sign * (1 + m / 2^52) * 2^(e - 1023)
end
struct = {}
function struct.pack(fmt, ...)
  local n = #fmt - 1
  local args = { ... }
  local out = {}
  for k = 1, n do out[k] = enc(args[k]) end
  return table.concat(out)
end
function struct.unpack(fmt, s, pos)
  pos = pos or 1
  local n = #fmt - 1
  local out = {}
  for k = 1, n do out[k] = dec(s, pos + 8 * (k - 1)) end
  out[n + 1] = pos + 8 * n
  return unpack(out)
end
local db = {}
local clock_us = 1700000000000000
local function norm(s, len, i) i = tonumber(i); if i < 0 then i = len + i end; if i < 0 then i = 0 end; return i end
redis = {}
function redis.call(cmd, key, a, b, ...)
  if cmd == 'TIME' then return { tostring(math.floor(clock_us / 1e6)), tostring(clock_us % 1e6) } end
  local v = db[key] or ''
  if cmd == 'GETRANGE' then
    local s, e = norm(v, #v, a), norm(v, #v, b)
    if e >= #v then e = #v - 1 end
    if s > e then return '' end
    return v:sub(s + 1, e + 1)
  elseif cmd == 'SETRANGE' then
    local off = tonumber(a)
    if #v < off then v = v .. string.rep('\0', off - #v) end
    db[key] = v:sub(1, off) .. b .. v:sub(off + #b + 1)
    return #db[key]
  elseif cmd == 'SET' then db[key] = a; return 'OK'
  elseif cmd == 'PEXPIRE' then return 1
  elseif cmd == 'STRLEN' then return #v
  elseif cmd == 'DEL' then db[key] = nil; return 1
  elseif cmd == 'GET' then return false
  end
  error('unknown ' .. cmd)
end
function redis.error_reply(s) return { err = s } end
local src = io.open(script_file):read('*a')
local chunk = assert(loadstring(src, '=script'))
local windows = { { 1e6, 1e6 }, { 60e6, 1e6 }, { 3600e6, 1e6 } }
local function argnums(now)
  return struct.pack('<ddddddddddd', now, 1, 0, windows[1][1], windows[1][2], windows[2][1], windows[2][2], windows[3][1], windows[3][2], 12345, 0)
end
local counts, total = {}, 0
local counting = false
local function hook()
  local info = debug.getinfo(2, 'Sl')
  if info.source == '=script' then
    counts[info.currentline] = (counts[info.currentline] or 0) + 1
    total = total + 1
  end
end
local user = 0
local function run_batch()
  KEYS = {}
  for k = 1, batch do user = user % nusers + 1; KEYS[k] = 'u' .. user end
  ARGV = { argnums(-1), tostring(batch) }
  -- (80 checks a second per user: a batch every batch / 80 / users s.)
  clock_us = clock_us + 12500 * batch / nusers
  local f = setfenv(chunk, _G)
  if counting then debug.sethook(hook, '', 1) end
  local r = f()
  debug.sethook()
  for k = 1, batch do
    if type(r[k]) ~= 'string' then error('bad reply ' .. tostring(r[k] and r[k].err)) end
  end
end
-- warm: 100 checks per user
for _ = 1, 100 * nusers / batch do run_batch() end
counting = true
for _ = 1, nchecks / batch do run_batch() end
print(string.format('Lua VM instructions per check: %.1f', total / nchecks))
local lines = {}
for l in src:gmatch('([^\n]*)\n') do lines[#lines + 1] = l end
local keys = {}
for l in pairs(counts) do keys[#keys + 1] = l end
table.sort(keys)
for _, l in ipairs(keys) do
  if counts[l] / nchecks >= 0.05 then
    io.write(string.format('%5d %6.2f  %s\n', l, counts[l] / nchecks, (lines[l] or ''):sub(1, 110)))
  end
end
