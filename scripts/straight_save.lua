  -- Saves `state` (for each straight-line counter script). Its TTL runs
  -- until `expires`, when its last window has ended: whole milliseconds,
  -- rounded up, at least 1, written with %d (Redis would write a Lua
  -- number with %.17g, which costs it about 700 instructions more). When
  -- the stored state's windows ended at that very time (`before`: the same
  -- fixed windows, or a bucket's TAT rounded to the same second), the TTL
  -- it was saved with still holds, and KEEPTTL spares Redis the expiry
  -- update (4.4k of the 11k instructions of SET ... PX). Only on the
  -- server's clock: an injected clock's TTLs are padded and run on another
  -- clock. A stored state of the same length (the usual case: the same
  -- number of windows) is overwritten in place, which keeps the TTL too and
  -- costs Redis about 1.5k instructions less than SET ... KEEPTTL; one of
  -- another length is replaced whole (SETRANGE would leave its tail).
  if expires == before and ttl_pad == 0 then
    if raw and #raw == #state then
      rcall('SETRANGE', key, '0', state)
    else
      rcall('SET', key, state, 'KEEPTTL')
    end
  else
    local ms = expires - now - 1
    ms = (ms - ms % 1000) / 1000 + 1
    if ms < 1 then ms = 1 end
    rcall('SET', key, state, 'PX', fmt('%d', ms + ttl_pad))
  end
