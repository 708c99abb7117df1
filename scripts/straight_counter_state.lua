
-- The counter algorithms' stored state (straight_fixed_window.lua,
-- straight_sliding_window.lua, straight_token_bucket.lua): one string of
-- packed numbers, as counter_state.lua keeps it.
local raw = rcall('GET', key)
-- The numbers each window keeps (named by the algorithm's script, the
-- first the window's length): a state of this rule's length is unpacked
-- straight into the locals that declare them; none, into zeros.
-- (Assigned to locals declared before, each number would cost Redis's Lua
-- a move, and its default a load: benches/HISTORY.md, round 54.) A state
-- of other windows is laid out again for these (straight_remap.lua).
local usual = raw and #raw == $BYTES
local $each(, ){$STATENAMES} =
  unpack8('<$each(){$STATEFMT}', usual and raw or string.rep('\0', $BYTES))
if raw and (not usual or $each( or ){$STATEFIRST ~= d@}) then
$REMAP
  $each(, ){$STATENAMES} =
    unpack8('<$each(){$STATEFMT}', remap(raw, { $each(, ){d@} }, $STATEWIDTH))
end
