-- A straight-line check's numbers (ARGV[1] as prelude.lua reads it,
-- without the two window counts; the counters' without the block time
-- too, which they never have), and its clock: the numbers' first, or the
-- server's when that is negative (then minus the check's deadline on the
-- server's clock; 1 or less: none). A check alone reads its own; in a
-- batch, each run of checks that have the same numbers reads them once,
-- and the batch reads the server's clock once (batched.lua).
local now, cost$BLOCKVAR, $each(, ){d@, n@}$ARGFP =
  unpack8('<dd$BLOCKFMT$each(){dd}$ARGFMT', $ARGV)
local ttl_pad = 10000 -- see prelude.lua
if now < 0 then
  $SERVERNOW
  ttl_pad = 0
end
