-- radic-bg.lua: Wireshark dissector for radic's Blue Gene network emulation
-- (netsim torus and collective packets, and the bulktransport layers on
-- them: frag, delta-t, the transport's message kind, bulk control and the
-- bulk data path). The wire formats are documented in
-- bulktransport/PROTOCOL.md; the Go decoders are the reference.
--
-- Traces come from `radicd --pcap FILE` (bulktransport/bglayers), link type
-- DLT_USER0 (147). Use:
--   wireshark -X lua_script:deploy/radic-bg.lua trace.pcap
--   tshark -X lua_script:deploy/radic-bg.lua -r trace.pcap -V

local bg = Proto("radic_bg", "radic Blue Gene emulation")

local protos = { [0] = "raw", [1] = "frag", [2] = "deltat", [3] = "bulk", [4] = "heartbeat" }
local classes = { [1] = "broadcast", [2] = "reduce", [3] = "result" }
local ops = { [0] = "none", [1] = "add", [2] = "max", [3] = "min", [4] = "or", [5] = "xor" }
local kinds = { [1] = "app", [2] = "app+meta", [3] = "bulk-control" }
local bulkops = { [1] = "get", [2] = "nak", [3] = "ack", [4] = "cancel", [5] = "rget", [6] = "data", [7] = "rnak" }

-- Torus: 16-byte header, up to 240 bytes of payload.
local torus = Proto("radic_torus", "radic BG torus")
torus.fields.proto = ProtoField.uint8("radic_torus.proto", "Protocol", base.DEC, protos, 0x0f)
-- The route nibble: 0 dimension order; 8 (alt) plus one bit per dimension
-- going minus (1 x, 2 y, 4 z) for the alternate route.
torus.fields.route = ProtoField.uint8("radic_torus.route", "Route", base.HEX, nil, 0xf0)
torus.fields.hops = ProtoField.uint8("radic_torus.hops", "Hops")
torus.fields.len = ProtoField.uint8("radic_torus.len", "Payload length")
torus.fields.src = ProtoField.string("radic_torus.src", "Source")
torus.fields.dst = ProtoField.string("radic_torus.dst", "Destination")
for _, n in ipairs({ "src_x", "src_y", "src_z", "dst_x", "dst_y", "dst_z" }) do
  torus.fields[n] = ProtoField.uint16("radic_torus." .. n, n)
end

-- Collective network: 16-byte header, up to 256 bytes of payload.
local tree = Proto("radic_tree", "radic BG collective")
tree.fields.proto = ProtoField.uint8("radic_tree.proto", "Protocol", base.DEC, protos)
tree.fields.class = ProtoField.uint8("radic_tree.class", "Class", base.DEC, classes)
tree.fields.op = ProtoField.uint8("radic_tree.op", "Reduce op", base.DEC, ops)
tree.fields.len = ProtoField.uint16("radic_tree.len", "Payload length")
tree.fields.src = ProtoField.uint32("radic_tree.src", "Source node")
tree.fields.seq = ProtoField.uint32("radic_tree.seq", "Sequence")
tree.fields.count = ProtoField.uint16("radic_tree.count", "Contributions")

-- Fragmentation: msgid, index, total.
local frag = Proto("radic_frag", "radic fragment")
frag.fields.msgid = ProtoField.uint16("radic_frag.msgid", "Message id")
frag.fields.index = ProtoField.uint16("radic_frag.index", "Fragment")
frag.fields.total = ProtoField.uint32("radic_frag.total", "Datagram length")

-- Delta-t: flags, window, seq, ack.
local deltat = Proto("radic_deltat", "radic delta-t")
deltat.fields.flags = ProtoField.uint8("radic_deltat.flags", "Flags", base.HEX)
deltat.fields.drf = ProtoField.bool("radic_deltat.drf", "Data run (DRF)", 8, nil, 0x01)
deltat.fields.eom = ProtoField.bool("radic_deltat.eom", "End of message", 8, nil, 0x02)
deltat.fields.ack_flag = ProtoField.bool("radic_deltat.ack_flag", "Ack", 8, nil, 0x04)
deltat.fields.data = ProtoField.bool("radic_deltat.data", "Data", 8, nil, 0x08)
deltat.fields.bom = ProtoField.bool("radic_deltat.bom", "Begin of message", 8, nil, 0x10)
deltat.fields.window = ProtoField.uint16("radic_deltat.window", "Window")
deltat.fields.seq = ProtoField.uint32("radic_deltat.seq", "Sequence")
deltat.fields.ack = ProtoField.uint32("radic_deltat.ack", "Ack")

-- The transport's message kind at the start of every delta-t message.
local msg = Proto("radic_msg", "radic transport message")
msg.fields.kind = ProtoField.uint8("radic_msg.kind", "Kind", base.DEC, kinds)
msg.fields.meta = ProtoField.bytes("radic_msg.meta", "Metadata")

-- Bulk messaging: 32-byte header (src, dst, op, param, 24 bytes of
-- application data) plus a word, and the data path.
local bulk = Proto("radic_bulk", "radic bulk messaging")
bulk.fields.src = ProtoField.uint16("radic_bulk.src", "Source node")
bulk.fields.dst = ProtoField.uint16("radic_bulk.dst", "Destination node")
bulk.fields.op = ProtoField.uint8("radic_bulk.op", "Operation", base.DEC, bulkops)
bulk.fields.tag = ProtoField.uint24("radic_bulk.tag", "Tag (parameter)")
bulk.fields.meta = ProtoField.bytes("radic_bulk.meta", "Application data")
bulk.fields.word = ProtoField.uint32("radic_bulk.word", "Length / reason")
bulk.fields.offset = ProtoField.uint32("radic_bulk.offset", "Offset")
bulk.fields.length = ProtoField.uint32("radic_bulk.length", "Length")
bulk.fields.data = ProtoField.bytes("radic_bulk.data", "Data")

local function coord(tvb, off)
  return string.format("(%d,%d,%d)", tvb(off, 2):uint(), tvb(off + 2, 2):uint(), tvb(off + 4, 2):uint())
end

local function dissect_bulkctl(tvb, pinfo, root)
  if tvb:len() < 36 then return end
  local t = root:add(bulk, tvb(0, 36))
  t:add(bulk.fields.src, tvb(0, 2))
  t:add(bulk.fields.dst, tvb(2, 2))
  t:add(bulk.fields.op, tvb(4, 1))
  t:add(bulk.fields.tag, tvb(5, 3))
  t:add(bulk.fields.meta, tvb(8, 24))
  t:add(bulk.fields.word, tvb(32, 4))
  pinfo.cols.info:append(string.format(" bulk %s tag %d", bulkops[tvb(4, 1):uint()] or "?", tvb(5, 3):uint()))
end

local function dissect_bulkdata(tvb, pinfo, root)
  if tvb:len() < 8 then return end
  local op = tvb(0, 1):uint()
  local t = root:add(bulk, tvb())
  t:add(bulk.fields.op, tvb(0, 1))
  t:add(bulk.fields.tag, tvb(1, 3))
  t:add(bulk.fields.offset, tvb(4, 4))
  if op == 5 and tvb:len() >= 12 then
    t:add(bulk.fields.length, tvb(8, 4))
  elseif op == 6 and tvb:len() > 8 then
    t:add(bulk.fields.data, tvb(8))
  end
  pinfo.cols.info:append(string.format(" bulk %s tag %d off %d", bulkops[op] or "?", tvb(1, 3):uint(), tvb(4, 4):uint()))
end

local function dissect_deltat(tvb, pinfo, root)
  if tvb:len() < 12 then return end
  local flags = tvb(0, 1):uint()
  local t = root:add(deltat, tvb(0, 12))
  local ft = t:add(deltat.fields.flags, tvb(0, 1))
  for _, f in ipairs({ deltat.fields.drf, deltat.fields.eom, deltat.fields.ack_flag, deltat.fields.data, deltat.fields.bom }) do
    ft:add(f, tvb(0, 1))
  end
  -- seq is valid with DATA, ack and window with ACK.
  if bit32.band(flags, 0x08) ~= 0 then t:add(deltat.fields.seq, tvb(4, 4)) end
  if bit32.band(flags, 0x04) ~= 0 then
    t:add(deltat.fields.window, tvb(2, 2))
    t:add(deltat.fields.ack, tvb(8, 4))
  end
  if bit32.band(flags, 0x08) ~= 0 then
    pinfo.cols.info:append(string.format(" delta-t seq %d", tvb(4, 4):uint()))
  end
  if bit32.band(flags, 0x04) ~= 0 then
    pinfo.cols.info:append(string.format(" ack %d", tvb(8, 4):uint()))
  end
  if bit32.band(flags, 0x10) ~= 0 and tvb:len() > 12 then
    local kind = tvb(12, 1):uint()
    local n = 1
    if kind == 2 then n = 25 end
    local m = root:add(msg, tvb(12, math.min(n, tvb:len() - 12)))
    m:add(msg.fields.kind, tvb(12, 1))
    if kind == 2 and tvb:len() >= 37 then m:add(msg.fields.meta, tvb(13, 24)) end
    if kind == 3 then dissect_bulkctl(tvb(13):tvb(), pinfo, root) end
  end
end

-- Heartbeat ring datagrams (heartbeat/wire.go): 55-byte header, then
-- 14 bytes per membership entry.
local hbtypes = { [1] = "heartbeat", [2] = "probe", [3] = "probe-ack", [4] = "probe-req", [5] = "probe-resp", [6] = "notice" }
local hb = Proto("radic_hb", "radic heartbeat ring")
hb.fields.type = ProtoField.uint8("radic_hb.type", "Type", base.DEC, hbtypes)
hb.fields.from = ProtoField.uint32("radic_hb.from", "From node")
hb.fields.to = ProtoField.uint32("radic_hb.to", "To node")
hb.fields.inc = ProtoField.uint64("radic_hb.inc", "Sender incarnation")
hb.fields.seq = ProtoField.uint64("radic_hb.seq", "Sequence")
hb.fields.target = ProtoField.uint32("radic_hb.target", "Target node")
hb.fields.origin = ProtoField.uint32("radic_hb.origin", "Origin node")
hb.fields.nonce = ProtoField.uint64("radic_hb.nonce", "Nonce")
hb.fields.flags = ProtoField.uint8("radic_hb.flags", "Flags", base.HEX)
hb.fields.view = ProtoField.uint16("radic_hb.view", "Membership entries")

local function dissect_heartbeat(tvb, pinfo, root)
  if tvb:len() < 55 or tvb(0, 2):string() ~= "RH" then return end
  local t = root:add(hb, tvb(0, 55))
  t:add(hb.fields.type, tvb(3, 1))
  t:add(hb.fields.from, tvb(4, 4))
  t:add(hb.fields.to, tvb(8, 4))
  t:add(hb.fields.inc, tvb(12, 8))
  t:add(hb.fields.seq, tvb(20, 8))
  t:add(hb.fields.target, tvb(28, 4))
  t:add(hb.fields.origin, tvb(40, 4))
  t:add(hb.fields.nonce, tvb(44, 8))
  t:add(hb.fields.flags, tvb(52, 1))
  t:add(hb.fields.view, tvb(53, 2))
  pinfo.cols.info:append(string.format(" %s %d -> %d", hbtypes[tvb(3, 1):uint()] or "?", tvb(4, 4):uint(), tvb(8, 4):uint()))
end

local function dissect_torus(tvb, pinfo, root)
  local t = root:add(torus, tvb(0, 16))
  local proto = bit32.band(tvb(1, 1):uint(), 0x0f)
  t:add(torus.fields.proto, tvb(1, 1))
  t:add(torus.fields.route, tvb(1, 1))
  t:add(torus.fields.hops, tvb(2, 1))
  t:add(torus.fields.len, tvb(3, 1))
  t:add(torus.fields.src, tvb(4, 6), coord(tvb, 4))
  t:add(torus.fields.dst, tvb(10, 6), coord(tvb, 10))
  local names = { "src_x", "src_y", "src_z", "dst_x", "dst_y", "dst_z" }
  for i, n in ipairs(names) do t:add(torus.fields[n], tvb(4 + 2 * (i - 1), 2)) end
  pinfo.cols.src = coord(tvb, 4)
  pinfo.cols.dst = coord(tvb, 10)
  pinfo.cols.protocol = "BG torus"
  pinfo.cols.info = protos[proto] or "?"
  if tvb:len() <= 16 then return end
  local p = tvb(16):tvb()
  if proto == 1 and p:len() >= 8 then
    local f = root:add(frag, p(0, 8))
    f:add(frag.fields.msgid, p(0, 2))
    f:add(frag.fields.index, p(2, 2))
    f:add(frag.fields.total, p(4, 4))
    pinfo.cols.info:append(string.format(" msgid %d frag %d of %d bytes", p(0, 2):uint(), p(2, 2):uint(), p(4, 4):uint()))
  elseif proto == 2 then
    dissect_deltat(p, pinfo, root)
  elseif proto == 3 then
    dissect_bulkdata(p, pinfo, root)
  elseif proto == 4 then
    dissect_heartbeat(p, pinfo, root)
  end
end

local function dissect_tree(tvb, pinfo, root)
  local t = root:add(tree, tvb(0, 16))
  t:add(tree.fields.proto, tvb(1, 1))
  t:add(tree.fields.class, tvb(2, 1))
  t:add(tree.fields.op, tvb(3, 1))
  t:add(tree.fields.len, tvb(4, 2))
  t:add(tree.fields.src, tvb(6, 4))
  t:add(tree.fields.seq, tvb(10, 4))
  t:add(tree.fields.count, tvb(14, 2))
  pinfo.cols.protocol = "BG tree"
  pinfo.cols.info = string.format("%s seq %d", classes[tvb(2, 1):uint()] or "?", tvb(10, 4):uint())
end

function bg.dissector(tvb, pinfo, root)
  if tvb:len() < 16 then return 0 end
  local magic = tvb(0, 1):uint()
  if magic == 0x54 then
    dissect_torus(tvb, pinfo, root)
  elseif magic == 0x43 then
    dissect_tree(tvb, pinfo, root)
  else
    return 0
  end
  return tvb:len()
end

local encaps = wtap_encaps or wtap
DissectorTable.get("wtap_encap"):add(encaps.USER0, bg)
