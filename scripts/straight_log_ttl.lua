-- (straight_packed_log.lua's TTL, written out where it moves: see there.
-- `px` for PEXPIRE, `expires` on the scripts' clock.)
local slack = (longest - longest % 4) / 4
if slack < 1000000 then slack = 1000000 elseif slack > 60000000 then slack = 60000000 end
local ms = newest + longest + slack - now - 1
ms = (ms - ms % 1000) / 1000 + 1
if ms < 1 then ms = 1 end
px, expires = ms + ttl_pad, now + ms * 1000
