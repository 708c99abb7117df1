
-- Fixed window (fixed_window.lua): window i (length di, limit ni) is
-- number ki = floor(now / di) and holds ci requests (si: the number of the
-- window stored).
local $each(, ){e@, c@, s@} = $each(, ){0, 0, 0}
if raw then
  if #raw == $BYTES then
    $each(, ){e@, c@, s@} = struct.unpack('<$each(){i8i8i8}', raw)
  end
  if #raw ~= $BYTES or $each( or ){e@ ~= d@} then
$REMAP
    $each(, ){e@, c@, s@} =
      struct.unpack('<$each(){i8i8i8}', remap(raw, { $each(, ){d@} }, 3))
  end
end
local retry = 0
--$each
local k@ = (now - now % d@) / d@
if s@ ~= k@ then c@ = 0 end
if c@ + cost > n@ then
  local wait = (k@ + 1) * d@ - now
  if cost > n@ then wait = d@ end
  if wait > retry then retry = wait end
end
--$end
-- (A denying window always leaves retry > 0.)
local allowed = 0
if retry == 0 then
  allowed = 1
  local expires, before = now, 0
--$each
  c@ = c@ + cost
  if (k@ + 1) * d@ > expires then expires = (k@ + 1) * d@ end
  if (s@ + 1) * d@ > before then before = (s@ + 1) * d@ end
--$end
  local state = struct.pack('<$each(){i8i8i8}', $each(, ){d@, c@, k@})
$SAVE
end

-- Remaining = limit - count, at least 0, and the constraining window (the
-- first with the fewest), which resets when it ends.
local least, reset = 9007199254740992, 0
--$each
local r@ = n@ - c@
if r@ < 0 then r@ = 0 end
if r@ < least then least, reset = r@, (k@ + 1) * d@ - now end
--$end
return struct.pack('<i8i8i8i8$each(){i8}', allowed, retry, reset, 0, $each(, ){r@})
