-- Fixed windows aligned on the Unix epoch: window k of length d is
-- [k*d, (k+1)*d). A budget's state is, per window, its count and window
-- number, packed (see load_state). An allowed request costs GET and SET; a
-- denied one GET.
--
-- S[3w - 1] is the count of window w, S[3w] its window number.

local S = load_state(V, UN, GN, 3)
local user_ok, route_ok, retry = true, true, 0
for w = 1, W do
  local d, limit = V[4 + 2 * w], V[5 + 2 * w]
  local k = (now - now % d) / d -- floor(now / d)
  -- A state of the next window (a request counted first that read the
  -- clock later, or a clock stepped back) is the current one.
  if S[3 * w] == k + 1 then k = S[3 * w] end
  local count = S[3 * w - 1]
  if S[3 * w] ~= k then
    count = 0
    S[3 * w - 1], S[3 * w] = 0, k
  end
  if count + cost > limit then
    if w > UN then route_ok = false else user_ok = false end
    -- The next window starts empty; a cost above the limit never fits.
    local wait = (k + 1) * d - now
    if cost > limit then wait = d end
    if wait > retry then retry = wait end
  end
end

if user_ok and route_ok then
  out[1] = 1
  for w = 1, W do
    S[3 * w - 1] = S[3 * w - 1] + cost
    out[4 + w] = (S[3 * w] + 1) * V[4 + 2 * w] -- the window's end
  end
  save_state(S, out, 3, UN, GN, now, ttl_pad)
elseif block_user and not user_ok then
  return block_user(retry)
end
out[2] = retry

-- Remaining = limit - count, at least 0, and the constraining window (the
-- fewest; on a tie, the shorter window, then the first), which resets when it ends.
local best, least = 0, 0
for w = 1, W do
  local r = V[5 + 2 * w] - S[3 * w - 1]
  if r < 0 then r = 0 end
  out[4 + w] = r
  if best == 0 or r < least or (r == least and V[4 + 2 * w] < V[4 + 2 * best]) then
    best, least = w, r
  end
end
if best > 0 then out[3] = (S[3 * best] + 1) * V[4 + 2 * best] - now end
-- (The reply, packed: see prelude.lua.)
return struct.pack('<' .. rep('d', 4 + W), unpack(out, 1, 4 + W))
