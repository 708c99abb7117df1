
-- Fixed window (fixed_window.lua): window i (length di, limit ni) is
-- number ki = floor(now / di) and holds ci requests (si: the number of the
-- window stored).
-- The script decides and records; its reply is whether it allowed the
-- request, its clock and the state as it left it, and the store works the
-- remaining counts, the reset and the retry out of them with the memory
-- store's own function (src/store/redis.rs, decode_counters): Redis spends
-- nothing on the report.
-- A state of the next window (a request counted first that read the clock
-- later, or a clock stepped back) is the current one.
local allowed = 1
--$each
local k@ = (now - now % d@) / d@
if s@ == k@ + 1 then k@ = s@ end
if s@ ~= k@ then c@ = 0 end
if c@ + cost > n@ then allowed = 0 end
--$end
local expires, before = now, 0
if allowed == 1 then
--$each
  c@ = c@ + cost
  if (k@ + 1) * d@ > expires then expires = (k@ + 1) * d@ end
  if (s@ + 1) * d@ > before then before = (s@ + 1) * d@ end
--$end
end
-- (One packed state: saved when allowed, and the reply either way.)
local state = pack8('<$each(){ddd}', $each(, ){d@, c@, k@})
if allowed == 1 then
$SAVE
end
$REPLY pack8('<dd', allowed, now) .. state$DONE
