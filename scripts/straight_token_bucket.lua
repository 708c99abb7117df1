
-- Token bucket (token_bucket.lua): window i (length di, limit ni) has TAT
-- ai, and a token comes back every ti = ceil(di / ni) microseconds.
local $each(, ){e@, a@} = $each(, ){0, 0}
if raw then
  if #raw == $BYTES then
    $each(, ){e@, a@} = struct.unpack('<$each(){i8i8}', raw)
  end
  if #raw ~= $BYTES or $each( or ){e@ ~= d@} then
$REMAP
    $each(, ){e@, a@} =
      struct.unpack('<$each(){i8i8}', remap(raw, { $each(, ){d@} }, 2))
  end
end
-- The state's TTL runs to its last TAT rounded up to a whole second
-- (token_bucket.lua rounds alike): `before` is the one the stored TATs
-- gave, which the last save set.
local before = 0
--$each
if a@ > before then before = a@ end
--$end
before = before - before % 1000000 + 1000000
local retry = 0
--$each
if a@ < now then a@ = now end
local t@ = d@ - 1
t@ = (t@ - t@ % n@) / n@ + 1
local o@ = a@ + cost * t@ - now - n@ * t@
if o@ > 0 then
  if cost > n@ then o@ = n@ * t@ end
  if o@ > retry then retry = o@ end
end
--$end
-- (A denying window always leaves retry > 0.)
local allowed = 0
if retry == 0 then
  allowed = 1
  -- (Every request a bucket allows moves its TAT, but a busy bucket's
  -- rounded TAT stays in the same second for many requests: their saves
  -- keep the TTL.)
  local expires = now
--$each
  a@ = a@ + cost * t@
  if a@ > expires then expires = a@ end
--$end
  expires = expires - expires % 1000000 + 1000000
  local state = struct.pack('<$each(){i8i8}', $each(, ){d@, a@})
$SAVE
end

-- The tokens left, and the constraining window (the first with the
-- fewest): its reset is when one more token is back.
local least, size, t, tat = 9007199254740992, 0, 1, 0
--$each
local r@ = n@ * t@ - (a@ - now)
if r@ > 0 then r@ = (r@ - r@ % t@) / t@ else r@ = 0 end
if r@ < least then least, size, t, tat = r@, n@, t@, a@ end
--$end
local reset = 0
if least < size then
  reset = tat - now - (size - least - 1) * t
  if reset < 0 then reset = 0 end
end
return struct.pack('<i8i8i8i8$each(){i8}', allowed, retry, reset, 0, $each(, ){r@})
