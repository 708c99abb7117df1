
-- Sliding log, packed (straight-line): the same function as
-- sliding_log.lua and the memory store's sliding_log.rs, with a budget's
-- log in one string instead of a sorted set. A sorted set costs seven
-- commands per check, and Redis's Lua spends 5,000 to 10,000 instructions
-- on each; this layout reads and writes a few dozen bytes with GETRANGE
-- and SETRANGE, whatever the length of the log (BENCHMARKS.md).
--
-- The string: the entries (the log), sorted distinct microsecond
-- timestamps (the last one is the newest), then a trailer, all
-- little-endian doubles (struct's `d`: whole numbers, which a double holds
-- exactly up to 2^53): per window of the rule (shortest first) p, o: the
-- index of its first entry at `at`, and that entry (0: none, p = size + 1;
-- read into the window's pi and oi below);
-- then the five numbers every trailer ends with, whatever the rule:
--   size     the number of entries in the string;
--   at       the clock the window hints were worked out at (on an
--            injected clock, the latest they were checked on);
--   expires  when the key's TTL ends, on the scripts' clock;
--   start    the index (from 1) where the log starts: the entries before
--            it left the longest window and were dropped (as the memory
--            store pops them, on every check), and count no more whatever
--            the clock or the rule does next; they leave the string in
--            batches, when they are as many as the rest (and 64);
--   fp       the fingerprint of the windows the hints are for (their
--            number and lengths, hashed by the store: the last argument).
-- The trailer is as long as its rule needs ($TRAILER bytes here: every
-- byte a script reads or writes costs Redis about 11 instructions, as its
-- Lua hashes every string it makes). A log whose trailer is another
-- rule's is read by its last five numbers, and rewritten with this rule's
-- trailer (once per change of the rule's window count).
-- While the clock has not gone back since `at` and the windows are the
-- same, every entry before a window's h is out of that window for good,
-- and t tells in one comparison whether entries left it since: a check
-- reads the trailer (and the newest entry, or the 32 entries before the
-- trailer: below, in the same GETRANGE), and an allowed one appends with one SETRANGE over the old trailer. (The
-- fewer numbers a script packs and unpacks, the less Redis spends on it:
-- a few hundred instructions each.)
-- Otherwise each window's start is searched for from `start` (a 16-entry
-- read, then a binary search): no path reads the whole log, and only the
-- batched drop copies it (once per as many checks as it holds).
-- A user blocked (a rule with a block time, KEYS[2] its marker) is denied
-- until the block ends, and the log is not read.
if block > 0 then
  local blocked_until = tonumber(rcall('GET', $KEY2))
  if blocked_until and blocked_until > now then
    local wait = blocked_until - now
    $REPLY pack8('<dddd$each(){d}', 0, wait, wait, 1, $each(, ){0})$DONE
  end
end
-- The trailer and the 32 entries before it, where a shorter window's
-- start is found without another read while it is among them: if every
-- window is counted exactly (`exact` 1), or one has a limit of at most 32
-- (all its entries are among them; `exact` 2, as the store sends it then
-- for a check not counted exactly: one test here, not one per window).
-- Otherwise (`exact` 0) the trailer and the newest entry alone: a window
-- that cannot deny is not searched, one that can holds more than 32
-- entries, and 248 bytes fewer cost Redis about 2,700 instructions (6% of
-- a check; benches/HISTORY.md, round 18).
local read, from = $SHORT, '-$SHORT'
if exact > 0 then read, from = $READ, '-$READ' end
local tail = rcall('GETRANGE', key, from, '-1')
local length = #tail
-- The usual read, longer than this rule's trailer and in whole numbers:
-- the newest entry, the hints and the last five in one unpack, as this
-- rule's trailer has them (the last five are right whatever the rule, the
-- rest only if its fingerprint is this rule's), straight into the locals
-- that declare them. Any other read unpacks zeros here, and its numbers
-- are set below. (Assigned to locals declared before, the numbers would
-- cost Redis's Lua a move each, and their defaults a load each: about 3%
-- of a check; benches/HISTORY.md, round 54.)
local usual = length > $TRAILER and length % 8 == 0
local newest, $each(, ){p@, o@}, size, at, expires, start, sfp =
  unpack8('<d$each(){dd}ddddd', usual and tail or string.rep('\0', $SHORT),
    usual and length - $BEFORE or 1)
local base, trailer = 0, $TRAILER
if not usual then
  newest, $each(, ){p@, o@}, size, at, expires, start, sfp =
    0, $each(, ){1, 0}, 0, 0, 0, 1, 0
  if length >= 40 and length % 8 == 0 then
    size, at, expires, start, sfp = unpack8('<ddddd', tail, length - 39)
  end
end
if usual or (length >= 40 and length % 8 == 0) then
  if sfp == fp then
    -- This rule's own trailer, which this script wrote: its numbers are
    -- taken as they are (a value forged with the rule's fingerprint is
    -- trusted, as any other forgery below; the checks below cost a check
    -- about 1,000 instructions, round 46 in benches/HISTORY.md). Its window
    -- hints are still checked below: a window's hint left where it was
    -- (not searched) may fall before a start that moved on.
    base = size - (length - $TRAILER) / 8
  else
    -- Another rule's trailer, maybe of another length: found from the
    -- string's length (the hints are worked out again below).
    local full = length
    if full == read then full = rcall('STRLEN', key) end
    trailer = full - 8 * size
    newest = 0
    if #tail > trailer and trailer > 0 then
      newest = unpack8('<d', tail, #tail - trailer - 7)
    elseif size > 0 and trailer > 0 then
      -- (A short read, all of it a longer trailer: the newest entry.)
      local last = rcall('GETRANGE', key, full - trailer - 8, full - trailer - 1)
      if #last == 8 then newest = unpack8('<d', last) end
    end
    base = size - (#tail - trailer) / 8
    -- (A string shorter than the read holds exactly `size` entries.)
    -- (`% 1`: a count or index that is not a whole number, NaN or an
    -- infinity, none of which a script writes.)
    if size < 0 or base < 0 or start < 1 or start > size + 1
        or size % 1 ~= 0 or start % 1 ~= 0
        or (#tail < read and base ~= 0)
        or trailer < 56 or trailer > 120 or trailer % 16 ~= 8 then
      -- Not a log this script wrote: replaced by an empty one. (A value
      -- forged to look like one is trusted: whoever can write the store's
      -- keys can reset every budget anyway.)
      size, newest, at, expires, start, sfp, base, trailer = 0, 0, 0, 0, 1, 0, 0, $TRAILER
    end
  end
  if size == 0 then newest = 0 end
end
if trailer ~= $TRAILER then
  -- Another window count's log: rewritten whole with a trailer of this
  -- rule's length (its live entries copied once), which keeps its TTL.
  local live = ''
  if start <= size then
    live = rcall('GETRANGE', key, fmt('%d', 8 * start - 8),
      fmt('%d', 8 * size - 1))
  end
  if #live ~= 8 * (size - start + 1) then
    error('a sliding-log budget holds a value this script did not write (its key, which names the user, is left out)')
  end
  size, start, base, tail = size - start + 1, 1, 0, live
  -- (Its hints: every window starts where the log does, which holds on
  -- any clock, so its fingerprint is this rule's: the next check reads it
  -- as this rule's trailer. This check still works them out below.)
  local first = 0
  if size > 0 then first = unpack8('<d', live, 1) end
  rcall('SET', key, live .. pack8('<$each(){dd}ddddd',
    $each(, ){1, first}, size, at, expires, 1, fp), 'KEEPTTL')
end

$HELPERS

-- Hints for other windows, or from before a clock that went back: every
-- window starts where the log does, and is searched for from there; and
-- the TTL is set again at the next write (it may run on another clock, or
-- for a shorter longest window).
-- (`top`: the index after the newest entry, size + 1, made once.)
local top = size + 1
if sfp ~= fp or now < at or $each( or ){p@ < start or p@ > top} then
  if now < at then expires = 0 end
  local first = 0
  if start <= size then first = entry(start, base, tail, key) end
  $each(, ){p@, o@} = $each(, ){start, first}
end

-- Window i starts at index pi, its oldest entry is oi (nil: none) and it
-- counts ci: its hint, unless entries left it since (then a seek). The
-- longest window starts at `start` or after.
-- Unless every window's remaining is asked for (`exact`: the layer shows
-- them all), a shorter window that cannot deny the check even if none of
-- its entries left it (its hint's count and the cost within its limit)
-- is not searched yet (si): its count ci stays that upper bound, searched
-- below only if the check is denied or the window may be the one with
-- the fewest remaining (then its exact count is reported).
local skipped, moved, $each(, ){s@} = false, false
--$each
if p@ > size then
  o@ = nil
elseif o@ <= now - d@ then
  if $ISSHORTER and exact ~= 1 and top - p@ + cost <= n@ then
    s@, skipped = true, true
  else
    p@, o@ = seek(p@ + 1, now - d@, size, newest, base, tail, key)
    moved = true
  end
end
--$end
local $each(, ){c@} = $each(, ){top - p@}

-- A denying window's wait: until the need-th oldest entry of the window
-- leaves it, or its whole length for a cost above its limit.
local allowed, retry = 1, 0
--$each
if c@ + cost > n@ then
  allowed = 0
  local wait = d@
  if cost <= n@ then
    local oldest = o@
    if c@ + cost - n@ > 1 then oldest = entry(p@ + c@ + cost - n@ - 1, base, tail, key) end
    wait = oldest + d@ - now
  end
  if wait > retry then retry = wait end
end
--$end

-- A window not searched above is searched now if the check is denied
-- (a denial reports every window exactly) or if its remaining may be the
-- fewest: at most its limit less its upper bound, not above the fewest of
-- the windows counted exactly (the fewest only falls as more are counted,
-- so a window left unsearched stays above it). It can deny nothing: its
-- entries are at most its upper bound.
if skipped then
  -- (The longest window is never left unsearched: only a shorter one.)
  local fewest = n$N - c$N
--$eachshorter
  if not s@ and n@ - c@ < fewest then fewest = n@ - c@ end
--$end
--$eachshorter
  if s@ and (allowed == 0 or n@ - c@ <= fewest) then
    p@, o@ = seek(p@ + 1, now - d@, size, newest, base, tail, key)
    c@, moved = top - p@, true
    if n@ - c@ < fewest then fewest = n@ - c@ end
  end
--$end
end

-- The TTL ends when the newest entry leaves the longest window. It is set
-- later than that (by a quarter of that window, at least a second, at most
-- a minute), so most writes keep the TTL set before (while `expires` is at
-- least newest + that window): scripts/straight_log_ttl.lua sets `px`,
-- the PX to set, and `expires`, when it ends, on the scripts' clock. (With
-- an injected clock, `expires` is on that clock, and the TTL's pad covers
-- real time running ahead of it, as for every script.) It and
-- straight_log_packed.lua are written out where they run, not made
-- functions here: Redis's Lua makes a function's closure on every call of
-- the script (about 640 instructions each), and they run on rare paths.
local longest = d$N

if allowed == 1 and cost > 0 then
  local px
  local from, q = now, nil
  if now <= newest and size > 0 and p$N <= size then
    -- Every microsecond from now to the newest entry taken (a costly
    -- request, or a budget busier than one request per microsecond: the
    -- distinct entries from q, the first at or after now, are as many as
    -- those microseconds): the first free one follows the newest, and the
    -- request is appended.
    q = seek(p1, now - 1, size, newest, base, tail, key)
    if newest - now == size - q then from = newest + 1 end
  end
  if from > newest or size == 0 or p$N > size then
    -- Time moved past the newest entry (the usual case): the request's
    -- entries are now and the microseconds after it (or after the newest),
    -- appended.
--$each
    if c@ == 0 then o@ = from end
--$end
    newest = from + cost - 1
    if expires < newest + d$N then
      $TTL
    end
    local dead = p$N - 1
    if size > 0 and (dead < 64 or dead * 2 < size) and cost == 1 then
      -- Over the old trailer, the entry and the new trailer in one pack;
      -- the TTL moves only when it must. That pack is also the reply
      -- (the usual allowed check's): the store works out the remaining
      -- and the reset from it as the end of this script would (each
      -- window counts size + 1 - p@ entries, its oldest o@, at `now`),
      -- which spares Redis packing a reply and working it out, about 10%
      -- of a check's instructions (benches/HISTORY.md, round 51).
      local written = pack8('<d$each(){dd}ddddd',
        from, $each(, ){p@, o@}, top, now, expires, p$N, fp)
      rcall('SETRANGE', key, fmt('%d', 8 * size), written)
      if px then rcall('PEXPIRE', key, px) end
      $REPLY written$DONE
    else
      $PACKED
      local list = { }
      for i = 1, cost do list[i] = from + i - 1 end
      local added = packed(list)
      if size > 0 and (dead < 64 or dead * 2 < size) then
        rcall('SETRANGE', key, 8 * size, added ..
          pack8('<$each(){dd}ddddd',
            $each(, ){p@, o@}, size + cost, now, expires, p$N, fp))
      else
        -- A new log, or the batched drop of the entries before `start`:
        -- the string written whole (the live entries copied once).
        if not px then
          $TTL
        end
        local live = ''
        if p$N <= size then live = rcall('GETRANGE', key, 8 * dead, 8 * size - 1) end
        rcall('SET', key, live .. added .. pack8('<$each(){dd}ddddd',
          $each(, ){p@ - dead, o@}, size - dead + cost, now, expires, 1, fp),
          'PX', px)
        px = nil
      end
    end
  else
    -- Entries at or after now (a clock that went back, two requests in
    -- one microsecond, or a costly one): the request takes the first free
    -- microseconds at or after now (as push() in sliding_log.rs), merged
    -- into those entries (from q, the first of them), which are
    -- rewritten from there.
    $PACKED
    local list = { }
    if q <= base then
      local s = rcall('GETRANGE', key, 8 * q - 8, 8 * size - 1)
      if #s ~= 8 * (size - q + 1) then
        error('a sliding-log budget holds a value this script did not write (its key, which names the user, is left out)')
      end
      for i = 1, #s, 8 do list[#list + 1] = unpack8('<d', s, i) end
    else
      for i = q, size do list[#list + 1] = unpack8('<d', tail, 8 * (i - base) - 7) end
    end
    local out, j, t, left = { }, 1, now, cost
    while left > 0 do
      if list[j] == t then j = j + 1 else left = left - 1 end
      out[#out + 1] = t
      t = t + 1
    end
    while j <= #list do out[#out + 1] = list[j]; j = j + 1 end
    -- (Every window starts at or before q; one starting at q now starts
    -- with the first of the merged entries.)
--$each
    if p@ == q then o@ = out[1] end
--$end
    newest = out[#out]
    if expires < newest + d$N then
      $TTL
    end
    rcall('SETRANGE', key, 8 * (q - 1), packed(out) ..
      pack8('<$each(){dd}ddddd',
        $each(, ){p@, o@}, size + cost, now, expires, p$N, fp))
  end
  if px then rcall('PEXPIRE', key, px) end
--$each
  c@ = c@ + cost
--$end
elseif size > 0 and p$N > size then
  -- Denied (or allowed at no cost) when every entry left the log: no log.
  rcall('DEL', key)
elseif size > 0 and (expires < newest + d$N or moved) then
  -- Denied (or allowed at no cost) after entries left a window: where the
  -- log starts and the new hints, over the old trailer; and a longer TTL
  -- when the rule's longest window grew or the clock went back (never a
  -- shorter one: entries of a longer window may count again).
  local px
  if expires < newest + d$N then
    $TTL
    rcall('PEXPIRE', key, px)
  end
  rcall('SETRANGE', key, fmt('%d', 8 * size),
    pack8('<$each(){dd}ddddd',
      $each(, ){p@, o@ or 0}, size, now, expires, p$N, fp))
elseif size > 0 and ttl_pad > 0 and now > at then
  -- (An injected clock only: the clock this check read, so that a later
  -- one below it is seen as a clock that went back and sets the TTL again;
  -- Redis's own expiry runs on the server's clock.)
  rcall('SETRANGE', key, 8 * size + $ATOFFSET, pack8('<d', now))
end

-- A denial blocks the user for the block time or, at a cost of 1 or 0, the
-- wait, the longer (see prelude.lua's block_user).
if allowed == 0 and block > 0 then
  local wait, hold = math.max(block, retry), block
  if cost <= 1 then hold = wait end
  rcall('SET', $KEY2, fmt('%d', now + hold), 'PX',
    fmt('%d', math.max(math.ceil(hold / 1000), 1) + ttl_pad))
  $REPLY pack8('<dddd$each(){d}', 0, wait, wait, 1, $each(, ){0})$DONE
end

-- Remaining = limit - count, at least 0, and the constraining window (the
-- fewest; on a tie, the shorter: the user's windows alone, shortest first,
-- so the first), which resets when its oldest entry leaves it.
local least, reset = 9007199254740992, 0
--$each
local r@ = n@ - c@
if r@ < 0 then r@ = 0 end
if r@ < least then
  least, reset = r@, 0
  if c@ > 0 and o@ then reset = o@ + d@ - now end
end
--$end
if allowed == 1 then
  -- Allowed (no wait, not blocked) on a path other than the usual one
  -- (which answered above with what it wrote): reset and the remaining
  -- alone, three numbers fewer to pack (about 1.2k instructions); the
  -- store tells the three forms by their length.
  $REPLY pack8('<d$each(){d}', reset, $each(, ){r@})$DONE
end
$REPLY pack8('<dddd$each(){d}', allowed, retry, reset, 0, $each(, ){r@})$DONE
