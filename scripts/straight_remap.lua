    -- The stored state laid out for the check's windows, in order, each
    -- with the fields stored for its length (the last window stored with
    -- it) or zeros, as load_state in counter_state.lua. Only for changed
    -- windows, so made only in the branch that runs it (the straight-line
    -- counter scripts insert it there).
    local function remap(raw, D, width)
      local stored = math.floor(string.len(raw) / (8 * width))
      local R = { unpack8('<' .. string.rep('d', stored * width), raw) }
      local out = {}
      for i = 1, table.getn(D) do
        local from = -1
        for j = 0, stored - 1 do
          if R[j * width + 1] == D[i] then from = j * width end
        end
        out[table.getn(out) + 1] = D[i]
        for f = 2, width do
          out[table.getn(out) + 1] = from >= 0 and R[from + f] or 0
        end
      end
      return pack8('<' .. string.rep('d', table.getn(out)), unpack(out))
    end
