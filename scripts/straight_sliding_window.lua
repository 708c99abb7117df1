
-- Sliding window counter (sliding_window.lua): window i (length di, limit
-- ni) is in fixed window number ki = floor(now / di), ei into it, and
-- counts ci requests there and pi in the window before (si: the number of
-- the window stored).
local $each(, ){x@, c@, p@, s@} = $each(, ){0, 0, 0, 0}
if raw then
  if #raw == $BYTES then
    $each(, ){x@, c@, p@, s@} = struct.unpack('<$each(){i8i8i8i8}', raw)
  end
  if #raw ~= $BYTES or $each( or ){x@ ~= d@} then
$REMAP
    $each(, ){x@, c@, p@, s@} =
      struct.unpack('<$each(){i8i8i8i8}', remap(raw, { $each(, ){d@} }, 4))
  end
end
local allowed, retry = 1, 0
--$each
local e@ = now % d@
local k@ = (now - e@) / d@
if s@ == k@ - 1 then
  c@, p@ = 0, c@
elseif s@ ~= k@ then
  c@, p@ = 0, 0
end
if p@ * (d@ - e@) / d@ + c@ + cost > n@ then
  allowed = 0
  local wait = wait_for(p@, c@, d@, e@, n@, cost)
  if wait > retry then retry = wait end
end
--$end
if allowed == 1 then
  local expires, before = now, 0
--$each
  c@ = c@ + cost
  -- (The current count still weighs in during the next window.)
  if (k@ + 2) * d@ > expires then expires = (k@ + 2) * d@ end
  if (s@ + 2) * d@ > before then before = (s@ + 2) * d@ end
--$end
  local state = struct.pack('<$each(){i8i8i8i8}', $each(, ){d@, c@, p@, k@})
$SAVE
end

-- Remaining = floor(max(limit - used, 0)), and the constraining window (the
-- first with the fewest), which resets when one more request fits.
local least, best = 9007199254740992, 0
--$each
local r@ = n@ - (p@ * (d@ - e@) / d@ + c@)
if r@ > 0 then r@ = r@ - r@ % 1 else r@ = 0 end
if r@ < least then least, best = r@, @ end
--$end
local reset = 0
--$each
if best == @ then reset = wait_for(p@, c@, d@, e@, n@, least + 1) end
--$end
return struct.pack('<i8i8i8i8$each(){i8}', allowed, retry, reset, 0, $each(, ){r@})
