-- The straight-line scripts: one per algorithm and number of user windows
-- (1 to 5), for the common shape (no route-wide windows, no block time;
-- the sliding log's may have a block time, read from the third number and
-- kept under KEYS[2], as prelude.lua does).
-- They decide exactly as prelude.lua + the algorithm's script (and
-- counter_state.lua), on the same arguments (less the two window counts,
-- and the block time and fingerprint for the counters), keys and stored
-- state, but
-- with every number in a local and no loop, table or function on the usual
-- path: 44-47% fewer instructions per call for the counters (BENCHMARKS.md;
-- the sliding log's also packs its log in one string). The store
-- expands them from templates, scripts/straight_*.lua, once per window
-- count (src/store/template.rs says how).

-- (The library functions the script calls, as locals: a global's
-- lookup and its field's cost Redis's Lua about 60 instructions per call,
-- a local none. Alone, made here; in a batch, once for the batch.)
$LIBS
-- (The check's numbers and clock: scripts/straight_args.lua. Alone, read
-- here; in a batch, once for every check that has the same: see
-- batched.lua.)
$ARGS
local key = $KEY1
-- (Where the check answers, the templates mark the answer with the store's
-- REPLY and DONE variables: alone, `return` before it; in a batch, its
-- place in the replies before it and a `break` after it, out of the
-- check's `repeat ... until true` in batched.lua's loop. So an answer is
-- the last statement of its block, and never inside a loop of its own.)

