package reconfigure

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
)

// Node is one node of the cluster in the table.
type Node struct {
	ID      int
	Logical netip.Addr // the node's first address; never changes
	Addr    netip.Addr // its current address
	Gen     uint64     // how many times it moved (0: still at Logical)
}

// Listener is a radic listener of a job: a socket of a managed process
// listening on Port of Node's addresses. Node is the process's logical
// node; once recovery restarted it on another node (Moved), it listens
// on Host's addresses, and its logical address leads there.
type Listener struct {
	Job     string
	Node    int
	Port    uint16
	LPID    string // logical process id of the listening process
	CtlPort uint16 // port of that process's control (resume) listener
	Moved   bool   // the process runs on Host, not on Node
	Host    int    // with Moved: the node it runs on
}

// Location answers [Table.Locate].
type Location struct {
	Managed bool           // (job, node, port) is a registered radic listener
	Node    int            // the node the address belongs to
	LPID    string         // the listener's process (Managed only)
	Addr    netip.AddrPort // where the listener is now (the node's current address, or its host's) : the port asked for
	Ctl     netip.AddrPort // the same address : CtlPort (Managed or Closed)
	Gen     uint64         // the node's generation
	// Moved: the listener's process was restarted on node Host, whose
	// address Addr and Ctl are (the node's own may be gone for good).
	Moved bool
	Host  int
	// Closed: not a listener now, but it was one, and LPID and Ctl name
	// the process that last listened there. A restarted process that
	// replays its connect to a listener its peer has since closed resumes
	// the connection with that process.
	Closed bool
}

// maxHistory bounds the earlier addresses kept per node.
const maxHistory = 8

// Errors of the table's methods.
var (
	ErrUnknownNode = errors.New("reconfigure: unknown node")
	ErrBadAddr     = errors.New("reconfigure: not a usable address")
	ErrBadListener = errors.New("reconfigure: bad listener")
)

type nodeEntry struct {
	Node
	history []netip.Addr // earlier current addresses, oldest first
}

type listenerKey struct {
	job  string
	node int
	port uint16
}

// Table is the location table. The zero value is empty and ready; its
// methods are safe for concurrent use.
type Table struct {
	mu sync.RWMutex
	// +checklocks:mu
	nodes map[int]*nodeEntry
	// +checklocks:mu
	listeners map[listenerKey]Listener
	// +checklocks:mu
	closed map[listenerKey]Listener // unregistered listeners, by their last process
}

// NewTable returns an empty table.
func NewTable() *Table { return &Table{} }

// normal returns a's IPv4 form when it is an IPv4-mapped IPv6 address.
func normal(a netip.Addr) netip.Addr { return a.Unmap() }

// +checklocks:t.mu
func (t *Table) init() {
	if t.nodes == nil {
		t.nodes = map[int]*nodeEntry{}
		t.listeners = map[listenerKey]Listener{}
		t.closed = map[listenerKey]Listener{}
	}
}

// AddNode adds node id with its logical address, at generation 0 (its
// current address is the logical one). Adding a node again with the same
// logical address changes nothing; with another one it is an error.
func (t *Table) AddNode(id int, logical netip.Addr) error {
	logical = normal(logical)
	if !logical.IsValid() || logical.IsUnspecified() {
		return fmt.Errorf("%w: node %d logical address %v", ErrBadAddr, id, logical)
	}
	if id < 0 {
		return fmt.Errorf("%w: id %d", ErrUnknownNode, id)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.init()
	if e, ok := t.nodes[id]; ok {
		if e.Logical != logical {
			return fmt.Errorf("reconfigure: node %d already has the logical address %v, not %v", id, e.Logical, logical)
		}
		return nil
	}
	t.nodes[id] = &nodeEntry{Node: Node{ID: id, Logical: logical, Addr: logical}}
	return nil
}

// Move sets node id's current address at generation gen. It reports
// whether the table changed: an update whose generation is not above the
// known one is stale and ignored (moved is false, err nil).
func (t *Table) Move(id int, addr netip.Addr, gen uint64) (moved bool, err error) {
	addr = normal(addr)
	if !addr.IsValid() || addr.IsUnspecified() {
		return false, fmt.Errorf("%w: node %d address %v", ErrBadAddr, id, addr)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.init()
	e, ok := t.nodes[id]
	if !ok {
		return false, fmt.Errorf("%w: %d", ErrUnknownNode, id)
	}
	if gen <= e.Gen {
		return false, nil
	}
	if e.Addr != addr {
		e.history = slices.DeleteFunc(e.history, func(a netip.Addr) bool { return a == addr || a == e.Addr })
		e.history = append(e.history, e.Addr)
		if len(e.history) > maxHistory {
			e.history = e.history[len(e.history)-maxHistory:]
		}
	}
	e.Addr, e.Gen = addr, gen
	return true, nil
}

// Earlier returns the addresses node id had before its current one,
// oldest first (at most maxHistory).
func (t *Table) Earlier(id int) []netip.Addr {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if e, ok := t.nodes[id]; ok {
		return slices.Clone(e.history)
	}
	return nil
}

// Node returns node id.
func (t *Table) Node(id int) (Node, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if e, ok := t.nodes[id]; ok {
		return e.Node, true
	}
	return Node{}, false
}

// Nodes returns every node, in id order.
func (t *Table) Nodes() []Node {
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := make([]Node, 0, len(t.nodes))
	for _, e := range t.nodes {
		out = append(out, e.Node)
	}
	slices.SortFunc(out, func(a, b Node) int { return a.ID - b.ID })
	return out
}

// match kinds, in the order NodeByAddr prefers them.
const (
	byCurrent = iota
	byLogical
	byHistory
	kinds
)

// +checklocks:t.mu
func (t *Table) find(ip netip.Addr, order [kinds]int) (*nodeEntry, bool) {
	ip = normal(ip)
	if !ip.IsValid() {
		return nil, false
	}
	var best *nodeEntry
	bestRank := kinds
	for _, e := range t.nodes {
		rank := kinds
		switch {
		case e.Addr == ip:
			rank = order[byCurrent]
		case e.Logical == ip:
			rank = order[byLogical]
		case slices.Contains(e.history, ip):
			rank = order[byHistory]
		}
		if rank < bestRank || (rank == bestRank && best != nil && e.ID < best.ID) {
			best, bestRank = e, rank
		}
	}
	return best, best != nil
}

var (
	wireOrder = [kinds]int{byCurrent: 0, byLogical: 1, byHistory: 2}
	appOrder  = [kinds]int{byLogical: 0, byCurrent: 1, byHistory: 2}
)

// NodeByAddr returns the node ip belongs to: its current address, else its
// logical address, else an address it had before.
func (t *Table) NodeByAddr(ip netip.Addr) (Node, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if e, ok := t.find(ip, wireOrder); ok {
		return e.Node, true
	}
	return Node{}, false
}

// Register adds or replaces the listener (l.Job, l.Node, l.Port). It
// reports whether the table changed.
func (t *Table) Register(l Listener) (changed bool, err error) {
	if err := l.check(); err != nil {
		return false, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.init()
	if _, ok := t.nodes[l.Node]; !ok {
		return false, fmt.Errorf("%w: %d", ErrUnknownNode, l.Node)
	}
	if _, ok := t.nodes[l.Host]; l.Moved && !ok {
		return false, fmt.Errorf("%w: host %d", ErrUnknownNode, l.Host)
	}
	k := listenerKey{l.Job, l.Node, l.Port}
	if old, ok := t.listeners[k]; ok && old == l {
		return false, nil
	}
	t.listeners[k] = l
	delete(t.closed, k)
	return true, nil
}

func (l Listener) check() error {
	switch {
	case l.Job == "":
		return fmt.Errorf("%w: no job", ErrBadListener)
	case l.Port == 0:
		return fmt.Errorf("%w: no port", ErrBadListener)
	case l.LPID == "":
		return fmt.Errorf("%w: no lpid", ErrBadListener)
	case l.CtlPort == 0:
		return fmt.Errorf("%w: no control port", ErrBadListener)
	}
	return nil
}

// Unregister removes the listener (job, node, port). When lpid is not
// empty, only a registration by that process is removed, so that a late
// unregistration by an earlier process does not remove its successor's. It
// reports whether the table changed.
func (t *Table) Unregister(job string, node int, port uint16, lpid string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := listenerKey{job, node, port}
	old, ok := t.listeners[k]
	if !ok || (lpid != "" && old.LPID != lpid) {
		return false
	}
	delete(t.listeners, k)
	t.closed[k] = old
	return true
}

// Listeners returns every registered listener, ordered by job, node, port.
func (t *Table) Listeners() []Listener {
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := make([]Listener, 0, len(t.listeners))
	for _, l := range t.listeners {
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b Listener) int {
		switch {
		case a.Job != b.Job:
			if a.Job < b.Job {
				return -1
			}
			return 1
		case a.Node != b.Node:
			return a.Node - b.Node
		}
		return int(a.Port) - int(b.Port)
	})
	return out
}

// Locate resolves a destination an application asked for: addr's IP may be
// a node's logical address (preferred), its current address or an earlier
// one. found says whether the IP belongs to a node at all; loc.Managed
// whether (job, that node, addr's port) is a registered radic listener.
// For a found node, loc.Node, loc.Addr (current address, same port) and
// loc.Gen are set even when it is not managed.
func (t *Table) Locate(job string, addr netip.AddrPort) (loc Location, found bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	e, ok := t.find(addr.Addr(), appOrder)
	if !ok {
		return Location{}, false
	}
	loc = Location{Node: e.ID, Addr: netip.AddrPortFrom(e.Addr, addr.Port()), Gen: e.Gen}
	k := listenerKey{job, e.ID, addr.Port()}
	l, ok := t.listeners[k]
	if ok {
		loc.Managed = true
	} else if l, ok = t.closed[k]; ok {
		loc.Closed = true
	} else {
		return loc, true
	}
	at := e.Addr
	if h, ok := t.nodes[l.Host]; l.Moved && ok {
		at = h.Addr
		loc.Moved, loc.Host = true, l.Host
		loc.Addr = netip.AddrPortFrom(at, addr.Port())
	}
	loc.LPID = l.LPID
	loc.Ctl = netip.AddrPortFrom(at, l.CtlPort)
	return loc, true
}
