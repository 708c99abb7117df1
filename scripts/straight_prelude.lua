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

-- (ARGV[1] as prelude.lua reads it, without the two window counts; the
-- counters' without the block time too, which they never have. In a
-- script of checks sent together, the check's own key, its numbers (as
-- unpacked once for every check that has the same) and the batch's one
-- reading of the clock: see batched.lua.)
-- (The library functions the script calls, as locals: a global's
-- lookup and its field's cost Redis's Lua about 60 instructions per call,
-- a local none. Alone, made here; in a batch, once for the batch.)
$LIBS
local now, cost$BLOCKVAR, $each(, ){d@, n@}$ARGFP =
  $OPENARGS'<dd$BLOCKFMT$each(){dd}$ARGFMT'$CLOSEARGS
local ttl_pad = 10000 -- see prelude.lua
if now < 0 then
  $SERVERNOW
  ttl_pad = 0
end
local key = $KEY1

