
-- The counter algorithms' stored state (straight_fixed_window.lua,
-- straight_sliding_window.lua, straight_token_bucket.lua): one string of
-- packed numbers, as counter_state.lua keeps it.
local raw = rcall('GET', key)
