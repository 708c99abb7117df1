-- Token bucket as GCRA: a window of n per w is a bucket of n tokens refilled
-- one every t = ceil(w / n) microseconds. A budget's state is, per window,
-- its theoretical arrival time (TAT), packed (see load_state). A request of
-- cost c is allowed when max(TAT, now) + c*t - now <= n*t. An allowed
-- request: GET and SET.
--
-- S[2w] is the TAT of window w.

local S = load_state(V, UN, GN, 2)
local user_ok, route_ok, retry = true, true, 0
for w = 1, W do
  local d, size = V[4 + 2 * w] - 1, V[5 + 2 * w]
  local t = (d - d % size) / size + 1
  local tat = S[2 * w]
  if tat < now then
    tat = now
    S[2 * w] = now
  end
  local over = tat + cost * t - now - size * t
  if over > 0 then
    if w > UN then route_ok = false else user_ok = false end
    if cost > size then over = size * t end
    if over > retry then retry = over end
  end
end

if user_ok and route_ok then
  out[1] = 1
  for w = 1, W do
    local d, size = V[4 + 2 * w] - 1, V[5 + 2 * w]
    local tat = S[2 * w] + cost * ((d - d % size) / size + 1)
    S[2 * w] = tat
    -- (The TTL runs to the last TAT rounded up to a whole second, as
    -- straight_token_bucket.lua has it: a save there keeps a TTL whose
    -- rounded TAT has not moved.)
    out[4 + w] = tat - tat % 1000000 + 1000000
  end
  save_state(S, out, 2, UN, GN, now, ttl_pad)
elseif block_user and not user_ok then
  return block_user(retry)
end
out[2] = retry

-- The tokens left, floor((size*t - (TAT - now)) / t) and at least 0, and
-- the constraining window (the fewest; on a tie, the shorter, then the first): its reset is when
-- one more token is back.
local best, least, best_t = 0, 0, 1
for w = 1, W do
  local d, size = V[4 + 2 * w] - 1, V[5 + 2 * w]
  local t = (d - d % size) / size + 1
  local a = size * t - (S[2 * w] - now)
  local r = 0
  if a > 0 then r = (a - a % t) / t end
  out[4 + w] = r
  if best == 0 or r < least or (r == least and V[4 + 2 * w] < V[4 + 2 * best]) then
    best, least, best_t = w, r, t
  end
end
if best > 0 and least < V[5 + 2 * best] then
  local wait = S[2 * best] - now - (V[5 + 2 * best] - least - 1) * best_t
  if wait > 0 then out[3] = wait end
end
-- (The reply, packed: see prelude.lua.)
return struct.pack('<' .. rep('d', 4 + W), unpack(out, 1, 4 + W))
