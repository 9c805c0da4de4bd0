package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"sync"
	"time"
)

// locator answers "is this address a radic listener of our job, and where
// is it now?" by asking the node's radicd (RADIC_DAEMON), which serves the
// location table. Addresses outside the cluster are answered at once from
// the node list, so a connection to anything else costs no lookup at all.
type locator struct {
	daemon string
	job    string
	node   int
	hc     *http.Client

	mu        sync.Mutex
	nodes     []nodeRecord
	fetchedAt time.Time
	selfAddr  netip.Addr // this node's logical address, once known (it never changes)
}

// nodeRecord is one node of the cluster as radicd's GET /v1/nodes gives it.
type nodeRecord struct {
	ID      int      `json:"id"`
	Logical string   `json:"logical"`
	Addr    string   `json:"addr"`
	Gen     int      `json:"gen"`
	Earlier []string `json:"earlier"` // addresses it had before
}

// location is GET /v1/locate's answer.
type location struct {
	Managed bool   `json:"managed"`
	Node    int    `json:"node"`
	Lpid    string `json:"lpid"`
	Addr    string `json:"addr"`
	Ctl     string `json:"ctl"`
	Gen     int    `json:"gen"`
	Closed  bool   `json:"closed"` // a listener no more: Lpid and Ctl name its last process
	Moved   bool   `json:"moved"`  // its process was restarted on another node: Addr and Ctl are there
}

func newLocator(daemon, job string, node int) *locator {
	return &locator{daemon: daemon, job: job, node: node,
		hc: &http.Client{Timeout: 2 * time.Second}}
}

func (l *locator) get(path string, q url.Values, v any) error {
	u := "http://" + l.daemon + path
	if q != nil {
		u += "?" + q.Encode()
	}
	resp, err := l.hc.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("radicd %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// refresh reloads the node list, at most once per interval.
func (l *locator) refresh(interval time.Duration) {
	l.mu.Lock()
	stale := time.Since(l.fetchedAt) >= interval
	if stale {
		l.fetchedAt = time.Now()
	}
	l.mu.Unlock()
	if !stale {
		return
	}
	var r struct {
		Nodes []nodeRecord `json:"nodes"`
	}
	if err := l.get("/v1/nodes", nil, &r); err != nil {
		logf("cannot read the node list from radicd at %s: %v", l.daemon, err)
		return
	}
	l.mu.Lock()
	l.nodes = r.Nodes
	l.mu.Unlock()
}

// nodeOf finds the node that has ip as its logical or current address,
// or had it before (a connection made just before a move comes from there).
func (l *locator) nodeOf(ip netip.Addr) (nodeRecord, bool) {
	for pass := 0; pass < 2; pass++ {
		l.mu.Lock()
		for _, earlier := range []bool{false, true} { // a node's address now beats one's history
			for _, n := range l.nodes {
				if n.Logical == ip.String() || n.Addr == ip.String() || (earlier && slices.Contains(n.Earlier, ip.String())) {
					l.mu.Unlock()
					return n, true
				}
			}
		}
		l.mu.Unlock()
		l.refresh(50 * time.Millisecond) // a node may have moved since
	}
	return nodeRecord{}, false
}

// logicalOf is node id's logical address (the unspecified address if the
// node list does not have it).
func (l *locator) logicalOf(id int) netip.Addr {
	l.refresh(time.Minute)
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, n := range l.nodes {
		if a, err := netip.ParseAddr(n.Logical); n.ID == id && err == nil {
			return a
		}
	}
	return netip.IPv4Unspecified()
}

// current is the node whose (logical, current or earlier) address is ip,
// from a node list at most maxAge old, with its logical and current
// addresses parsed.
func (l *locator) current(ip netip.Addr, maxAge time.Duration) (logical, cur netip.Addr, ok bool) {
	l.refresh(maxAge)
	n, ok := l.nodeOf(ip)
	if !ok {
		return netip.Addr{}, netip.Addr{}, false
	}
	logical, err1 := netip.ParseAddr(n.Logical)
	cur, err2 := netip.ParseAddr(n.Addr)
	return logical, cur, err1 == nil && err2 == nil
}

// movedFrom reports whether the node whose address is ip has given up
// addr for another, by a node list at most maxAge old (a stale list can
// miss a move, never invent one).
func (l *locator) movedFrom(ip, addr netip.Addr, maxAge time.Duration) bool {
	l.refresh(maxAge)
	n, ok := l.nodeOf(ip)
	return ok && n.Addr != addr.String() && slices.Contains(n.Earlier, addr.String())
}

// logical maps an address of some node (old or current) to its logical one.
func (l *locator) logical(ip netip.Addr) netip.Addr {
	if n, ok := l.nodeOf(ip); ok {
		if a, err := netip.ParseAddr(n.Logical); err == nil {
			return a
		}
	}
	return ip
}

// self is this node's logical address. It is learnt once, by the node's
// id, and kept: a logical address never changes, whatever the node's
// current address is, so no lag in the node list can make it wrong (an
// address read off a socket would be the node's physical one).
func (l *locator) self() (netip.Addr, bool) {
	l.mu.Lock()
	a := l.selfAddr
	l.mu.Unlock()
	if a.IsValid() {
		return a, true
	}
	for pass := 0; pass < 2; pass++ {
		l.refresh(time.Hour)
		l.mu.Lock()
		for _, n := range l.nodes {
			if p, err := netip.ParseAddr(n.Logical); err == nil && n.ID == l.node {
				l.selfAddr = p
				l.mu.Unlock()
				return p, true
			}
		}
		l.fetchedAt = time.Time{} // not in the list we have: read it again
		l.mu.Unlock()
	}
	return netip.Addr{}, false
}

// locate says whether ap is a radic listener of this job, and where it and
// its process's control port are now.
func (l *locator) locate(ap netip.AddrPort) (location, bool) {
	if _, ok := l.nodeOf(ap.Addr()); !ok {
		return location{}, false
	}
	loc, err := l.lookup(ap)
	if err != nil {
		logf("location lookup of %s failed (%v): treating it as plain TCP", ap, err)
		return location{}, false
	}
	return loc, loc.Managed
}

// lookupAny is lookup that also answers for a closed listener, from this
// daemon's table (which every registration reaches, and which answers
// while the listener's node is down), quietly: for a reconnect, which
// knows the peer is managed.
func (l *locator) lookupAny(ap netip.AddrPort) (location, error) {
	loc, err := l.lookup(ap)
	if err == nil && loc.Managed {
		return loc, nil
	}
	var local location
	if err2 := l.get("/v1/locate", url.Values{"job": {l.job}, "addr": {ap.String()}, "local": {"1"}}, &local); err2 != nil {
		return location{}, errors.Join(err, err2)
	}
	return local, nil
}

// lookup asks the daemon where the listener ap is now.
func (l *locator) lookup(ap netip.AddrPort) (location, error) {
	var loc location
	err := l.get("/v1/locate", url.Values{"job": {l.job}, "addr": {ap.String()}}, &loc)
	return loc, err
}

// locateAny is locate that also answers for a listener that has been
// closed (from this daemon's table, which every registration reaches): a
// restarted process replaying its connect resumes with the process that
// listened there, which may have closed its listener long ago.
func (l *locator) locateAny(ap netip.AddrPort) (location, bool) {
	if loc, ok := l.locate(ap); ok {
		return loc, true
	}
	var loc location
	q := url.Values{"job": {l.job}, "addr": {ap.String()}, "local": {"1"}}
	if err := l.get("/v1/locate", q, &loc); err != nil {
		return location{}, false
	}
	return loc, loc.Managed || loc.Closed
}
