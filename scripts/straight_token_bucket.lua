
-- Token bucket (token_bucket.lua): window i (length di, limit ni) has TAT
-- ai, and a token comes back every ti = ceil(di / ni) microseconds.
local $each(, ){e@, a@} = $each(, ){0, 0}
if raw then
  if string.len(raw) ~= $BYTES then raw = remap(raw, { $each(, ){d@} }, 2) end
  $each(, ){e@, a@} = struct.unpack('<$each(){i8i8}', raw)
  if $each( or ){e@ ~= d@} then
    $each(, ){e@, a@} = struct.unpack('<$each(){i8i8}', remap(raw, { $each(, ){d@} }, 2))
  end
end
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
  -- (A bucket's TTL moves with every request it allows: before stays 0.)
  local expires, before = now, 0
--$each
  a@ = a@ + cost * t@
  if a@ > expires then expires = a@ end
--$end
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
return { allowed, retry, reset, 0, $each(, ){r@} }
