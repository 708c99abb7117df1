
-- Fixed window (fixed_window.lua): window i (length di, limit ni) is
-- number ki = floor(now / di) and holds ci requests (si: the number of the
-- window stored).
-- (A state of this rule's length is unpacked straight into the locals
-- that declare its numbers; none, into zeros. Assigned to locals declared
-- before, each number would cost Redis's Lua a move, and its default a
-- load: benches/HISTORY.md, round 54.)
local usual = raw and #raw == $BYTES
local $each(, ){e@, c@, s@} =
  unpack8('<$each(){ddd}', usual and raw or string.rep('\0', $BYTES))
if raw and (not usual or $each( or ){e@ ~= d@}) then
$REMAP
  $each(, ){e@, c@, s@} =
    unpack8('<$each(){ddd}', remap(raw, { $each(, ){d@} }, 3))
end
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
return pack8('<dd', allowed, now) .. state
