
-- Sliding window counter (sliding_window.lua): window i (length di, limit
-- ni) is in fixed window number ki = floor(now / di), ei into it, and
-- counts ci requests there and pi in the window before (si: the number of
-- the window stored).
-- The script decides and records; the store reports (see
-- straight_fixed_window.lua). A state of the next window (a request counted
-- first that read the clock later, or a clock stepped back) is the current
-- one, from its start.
local allowed = 1
--$each
local e@ = now % d@
local k@ = (now - e@) / d@
if s@ == k@ + 1 then k@, e@ = s@, 0 end
if s@ == k@ - 1 then
  c@, p@ = 0, c@
elseif s@ ~= k@ then
  c@, p@ = 0, 0
end
if p@ * (d@ - e@) / d@ + c@ + cost > n@ then allowed = 0 end
--$end
local expires, before = now, 0
if allowed == 1 then
--$each
  c@ = c@ + cost
  -- (The current count still weighs in during the next window.)
  if (k@ + 2) * d@ > expires then expires = (k@ + 2) * d@ end
  if (s@ + 2) * d@ > before then before = (s@ + 2) * d@ end
--$end
end
-- (One packed state: saved when allowed, and the reply either way.)
local state = pack8('<$each(){dddd}', $each(, ){d@, c@, p@, k@})
if allowed == 1 then
$SAVE
end
$REPLY pack8('<dd', allowed, now) .. state$DONE
