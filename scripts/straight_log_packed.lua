-- (For straight_packed_log.lua's rare paths: `list` packed, 256 numbers per
-- struct.pack call at most.)
local function packed(list)
  local parts = { }
  for i = 1, #list, 256 do
    local last = math.min(i + 255, #list)
    parts[#parts + 1] = struct.pack('<' .. string.rep('d', last - i + 1), unpack(list, i, last))
  end
  return table.concat(parts)
end
