
-- Token bucket (token_bucket.lua): window i (length di, limit ni) has TAT
-- ai, and a token comes back every ti = ceil(di / ni) microseconds.
-- The state's TTL runs to its last TAT rounded up to a whole second
-- (token_bucket.lua rounds alike): `before` is the one the stored TATs
-- gave, which the last save set.
local before = 0
--$each
if a@ > before then before = a@ end
--$end
before = before - before % 1000000 + 1000000
-- The script decides and records; the store reports (see
-- straight_fixed_window.lua).
local allowed = 1
--$each
if a@ < now then a@ = now end
local t@ = d@ - 1
t@ = (t@ - t@ % n@) / n@ + 1
if a@ + cost * t@ - now - n@ * t@ > 0 then allowed = 0 end
--$end
local expires = now
if allowed == 1 then
  -- (Every request a bucket allows moves its TAT, but a busy bucket's
  -- rounded TAT stays in the same second for many requests: their saves
  -- keep the TTL.)
--$each
  a@ = a@ + cost * t@
  if a@ > expires then expires = a@ end
--$end
  expires = expires - expires % 1000000 + 1000000
end
-- (One packed state: saved when allowed, and the reply either way.)
local state = pack8('<$each(){dd}', $each(, ){d@, a@})
if allowed == 1 then
$SAVE
end
$REPLY pack8('<dd', allowed, now) .. state$DONE
