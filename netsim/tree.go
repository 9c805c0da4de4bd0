package netsim

// Tree is the collective network's shape: a binary tree over the node ids,
// rooted at node 0, parent of i is (i-1)/2. Like the Blue Gene collective
// network it does broadcast and reduce in the switches, so a node sends one
// packet and receives one result however many nodes take part.
type Tree struct{ N int }

// Parent of id; ok is false at the root.
func (t Tree) Parent(id NodeID) (p NodeID, ok bool) {
	if id == 0 {
		return 0, false
	}
	return (id - 1) / 2, true
}

// Children of id, appended to buf.
func (t Tree) Children(id NodeID, buf []NodeID) []NodeID {
	for c := 2*uint64(id) + 1; c <= 2*uint64(id)+2 && c < uint64(t.N); c++ {
		buf = append(buf, NodeID(c))
	}
	return buf
}

// Depth is the number of links from id up to the root.
func (t Tree) Depth(id NodeID) int {
	d := 0
	for id != 0 {
		id = (id - 1) / 2
		d++
	}
	return d
}

// TreeSend is a collective packet for a neighbouring switch.
type TreeSend struct {
	To  NodeID
	Pkt []byte
}

// Switch is the pure collective-network switch of one node: it forwards
// broadcasts up to the root and down the tree, and combines reduce
// contributions from its subtree. It owns no clock: the collective network
// is reliable hardware, so there are no timers; a reduction whose
// contributions do not all arrive stays pending (Pending reports it).
type Switch struct {
	tree     Tree
	id       NodeID
	parent   NodeID
	isRoot   bool
	children []NodeID
	pending  map[uint32]*partial // by reduction seq
	sends    []TreeSend
	deliver  [][]byte
}

type partial struct {
	hdr     TreeHeader
	data    []byte
	waiting int // contributions still expected: own + one per child
}

// NewSwitch makes the switch of node id.
func NewSwitch(t Tree, id NodeID) *Switch {
	s := &Switch{tree: t, id: id}
	s.parent, s.isRoot = t.Parent(id)
	s.isRoot = !s.isRoot
	s.children = t.Children(id, nil)
	return s
}

// Pending is the number of reductions waiting for contributions.
func (s *Switch) Pending() int { return len(s.pending) }

// Ready drains what the switch wants sent and the packets this node
// delivers (whole collective packets; they alias nothing the switch keeps).
func (s *Switch) Ready() (sends []TreeSend, deliver [][]byte) {
	sends, deliver = s.sends, s.deliver
	s.sends, s.deliver = nil, nil
	return
}

// Inject is a packet this node puts on the collective network: a
// broadcast or its own contribution to a reduction.
func (s *Switch) Inject(pkt []byte) error {
	h, p, err := DecodeTree(pkt)
	if err != nil {
		return err
	}
	switch h.Class {
	case TreeBroadcast:
		if s.isRoot {
			s.down(pkt)
		} else {
			s.sends = append(s.sends, TreeSend{s.parent, pkt})
		}
	case TreeReduce:
		s.contribute(h, p)
	default:
		return ErrBadPacket
	}
	return nil
}

// Step handles a packet from neighbour `from`: from a child it travels up,
// from the parent it travels down.
func (s *Switch) Step(from NodeID, pkt []byte) error {
	h, p, err := DecodeTree(pkt)
	if err != nil {
		return err
	}
	fromParent := !s.isRoot && from == s.parent
	switch {
	case h.Class == TreeBroadcast && !fromParent:
		if s.isRoot {
			s.down(pkt)
		} else {
			s.sends = append(s.sends, TreeSend{s.parent, pkt})
		}
	case h.Class == TreeReduce && !fromParent:
		s.contribute(h, p)
	case fromParent && (h.Class == TreeBroadcast || h.Class == TreeResult):
		s.down(pkt)
	default:
		return ErrBadPacket
	}
	return nil
}

// down delivers pkt here and passes it to every child.
func (s *Switch) down(pkt []byte) {
	s.deliver = append(s.deliver, pkt)
	for _, c := range s.children {
		s.sends = append(s.sends, TreeSend{c, pkt})
	}
}

func (s *Switch) contribute(h TreeHeader, p []byte) {
	if s.pending == nil {
		s.pending = map[uint32]*partial{}
	}
	r := s.pending[h.Seq]
	if r == nil {
		r = &partial{hdr: h, data: append([]byte(nil), p...), waiting: 1 + len(s.children)}
		r.hdr.Count = 0
		s.pending[h.Seq] = r
	} else {
		Combine(h.Op, r.data, p)
		r.hdr.Src = min(r.hdr.Src, h.Src)
	}
	r.hdr.Count += max(h.Count, 1)
	r.waiting--
	if r.waiting > 0 {
		return
	}
	delete(s.pending, h.Seq)
	if len(s.pending) == 0 {
		s.pending = nil // an idle switch holds no map
	}
	if s.isRoot {
		r.hdr.Class = TreeResult
		s.down(AppendTree(nil, r.hdr, r.data))
		return
	}
	s.sends = append(s.sends, TreeSend{s.parent, AppendTree(nil, r.hdr, r.data)})
}
