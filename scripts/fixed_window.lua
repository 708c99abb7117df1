-- Fixed windows aligned on the Unix epoch: window k of length d is
-- [k*d, (k+1)*d). A budget's state is, per window, its count and window
-- number, packed (see load_state). An allowed request costs GET and SET; a
-- denied one GET.
--
-- S[i] is the count of window i, S[N + i] its window number.

local function evaluate(key, B, N, S)
  load_state(key, B, N, S, 3)
  local allowed, retry = true, 0
  for i = 1, N do
    local d, limit = V[B + 2 * i - 1], V[B + 2 * i]
    local k = floor(now / d)
    if S[N + i] ~= k then S[i] = 0 end
    S[N + i] = k
    if S[i] + cost > limit then
      allowed = false
      -- The next window starts empty; a cost above the limit never fits.
      local wait = (k + 1) * d - now
      if cost > limit then wait = d end
      if wait > retry then retry = wait end
    end
  end
  return allowed, retry
end

local function commit(key, B, N, S)
  local expires = now
  for i = 1, N do
    S[i] = S[i] + cost
    local ends = (S[N + i] + 1) * V[B + 2 * i - 1]
    if ends > expires then expires = ends end
  end
  save_state(key, B, N, S, 3, expires)
end

local function reset(key, B, N, S, i)
  return (S[N + i] + 1) * V[B + 2 * i - 1] - now
end
