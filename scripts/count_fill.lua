-- fill() for the algorithms whose state table holds each window's count
-- in S[i] (sliding log, fixed window): remaining = limit - count, at least
-- 0. Included after the algorithm, before epilogue.lua.

local function fill(B, N, S, out, o)
  local best, least = 0, 0
  for i = 1, N do
    local r = V[B + 2 * i] - S[i]
    if r < 0 then r = 0 end
    out[o + i] = r
    if best == 0 or r < least then best, least = i, r end
  end
  return best, least
end
