-- Sliding window counter: the current fixed window's count plus the
-- previous window's count weighted by the part of it the sliding window
-- still covers: used = prev * (d - elapsed) / d + cur (doubles, in exactly
-- this order, as in the Rust memory store). A budget's state is, per
-- window, its current count, the previous window's count and the current
-- window number, packed (see load_state). An allowed request: GET and SET.
--
-- S[4w - 2] is the current count of window w, S[4w - 1] the previous one,
-- S[4w] the window number (so the time elapsed in it is now - S[4w] * d).
-- wait_for() is in sliding_window_wait.lua.

local S = load_state(V, UN, GN, 4)
local user_ok, route_ok, retry = true, true, 0
for w = 1, W do
  local d, limit = V[4 + 2 * w], V[5 + 2 * w]
  local elapsed = now % d
  local k = (now - elapsed) / d -- floor(now / d)
  local sk = S[4 * w]
  -- A state of the next window (a request counted first that read the
  -- clock later, or a clock stepped back) is the current one, from its
  -- start: waits run from now, `ahead` before it.
  local ahead = 0
  if sk == k + 1 then k, elapsed, ahead = sk, 0, sk * d - now end
  local cur, prev = 0, 0
  if sk == k then
    cur, prev = S[4 * w - 2], S[4 * w - 1]
  elseif sk == k - 1 then
    prev = S[4 * w - 2]
  end
  if sk ~= k then S[4 * w - 2], S[4 * w - 1], S[4 * w] = cur, prev, k end
  if prev * (d - elapsed) / d + cur + cost > limit then -- used(...), inline
    if w > UN then route_ok = false else user_ok = false end
    local wait = ahead + wait_for(prev, cur, d, elapsed, limit, cost)
    if wait > retry then retry = wait end
  end
end

if user_ok and route_ok then
  out[1] = 1
  for w = 1, W do
    S[4 * w - 2] = S[4 * w - 2] + cost
    -- The current count still weighs in during the next window.
    out[4 + w] = (S[4 * w] + 2) * V[4 + 2 * w]
  end
  save_state(S, out, 4, UN, GN, now, ttl_pad)
elseif block_user and not user_ok then
  return block_user(retry)
end
out[2] = retry

-- Remaining = floor(max(limit - used, 0)), and the constraining window (the
-- fewest; on a tie, the shorter window, then the first), which resets when one more request fits.
local best, least = 0, 0
for w = 1, W do
  local d = V[4 + 2 * w]
  local elapsed = now - S[4 * w] * d
  if elapsed < 0 then elapsed = 0 end
  local r = V[5 + 2 * w] - (S[4 * w - 1] * (d - elapsed) / d + S[4 * w - 2])
  if r > 0 then r = r - r % 1 else r = 0 end
  out[4 + w] = r
  if best == 0 or r < least or (r == least and V[4 + 2 * w] < V[4 + 2 * best]) then
    best, least = w, r
  end
end
if best > 0 then
  local d = V[4 + 2 * best]
  local start = S[4 * best] * d
  local elapsed, ahead = now - start, 0
  if elapsed < 0 then elapsed, ahead = 0, -elapsed end
  out[3] = ahead + wait_for(S[4 * best - 1], S[4 * best - 2], d, elapsed,
    V[5 + 2 * best], least + 1)
end
-- (The reply, packed: see prelude.lua.)
return struct.pack('<' .. rep('d', 4 + W), unpack(out, 1, 4 + W))
