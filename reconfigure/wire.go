package reconfigure

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
)

// EnvDaemon names the environment variable that tells a rank where its
// node's radicd serves the location table: host:port, reachable from the
// rank's network namespace and still valid after the node is readdressed.
const EnvDaemon = "RADIC_DAEMON"

// The HTTP API of the location table, served by radicd on its --listen
// port (HTTP/1.1, JSON bodies):
//
//	GET    /v1/nodes                       200 NodesReply: every node of the cluster
//	POST   /v1/nodes/moved                 MoveRequest: a node announces its new address; 204
//	POST   /v1/listeners                   ListenerRequest: register a listener of this node, pushed to every daemon before the 204
//	DELETE /v1/listeners                   ListenerRequest: unregister it (pushed too); 204
//	POST   /v1/listeners?from=N            a registration of node N pushed by N's daemon (not pushed further); 204
//	DELETE /v1/listeners?from=N            an unregistration pushed by N's daemon; 204
//	GET    /v1/locate?job=J&addr=IP:PORT   200 LocateReply; &local=1: from this daemon's table only
//
// Malformed requests get 400 with a message naming the bad field.
const (
	PathNodes     = "/v1/nodes"
	PathMoved     = "/v1/nodes/moved"
	PathListeners = "/v1/listeners"
	PathLocate    = "/v1/locate"
)

// NodeInfo is one node in NodesReply.
type NodeInfo struct {
	ID      int    `json:"id"`
	Logical string `json:"logical"`
	Addr    string `json:"addr"`
	Gen     uint64 `json:"gen"`
	// Earlier current addresses, oldest first: a connection made just
	// before a move still comes from one of them.
	Earlier []string `json:"earlier,omitempty"`
}

// NodesReply is the body of GET /v1/nodes.
type NodesReply struct {
	Nodes []NodeInfo `json:"nodes"`
}

// Info converts a table node to its wire form.
func (n Node) Info() NodeInfo {
	return NodeInfo{ID: n.ID, Logical: n.Logical.String(), Addr: n.Addr.String(), Gen: n.Gen}
}

// MoveRequest is the body of POST /v1/nodes/moved: node ID is now at Addr,
// its generation Gen.
type MoveRequest struct {
	ID   int    `json:"id"`
	Addr string `json:"addr"`
	Gen  uint64 `json:"gen"`
}

// Parse validates a MoveRequest and returns its address.
func (m MoveRequest) Parse() (netip.Addr, error) {
	if m.ID < 0 {
		return netip.Addr{}, fmt.Errorf("field \"id\": %d is not a node id", m.ID)
	}
	if m.Addr == "" {
		return netip.Addr{}, errors.New(`missing field "addr"`)
	}
	a, err := netip.ParseAddr(m.Addr)
	if err != nil || a.IsUnspecified() {
		return netip.Addr{}, fmt.Errorf("field \"addr\": %q is not an IP address", m.Addr)
	}
	if m.Gen == 0 {
		return netip.Addr{}, errors.New(`missing field "gen" (a move has generation 1 or more)`)
	}
	return a.Unmap(), nil
}

// ListenerRequest is the body of POST and DELETE /v1/listeners.
type ListenerRequest struct {
	Job     string `json:"job"`
	Port    uint16 `json:"port"`
	LPID    string `json:"lpid"`
	CtlPort uint16 `json:"ctl_port"`
	// Node is the process's logical node, when it is not the node whose
	// daemon registers it: a rank that recovery restarted on another node
	// keeps listening on its logical node's addresses.
	Node *int `json:"node,omitempty"`
}

// Check validates a registration (all fields required) or, with
// unregister, an unregistration (job and port required; lpid, when given,
// must match the registered one).
func (r ListenerRequest) Check(unregister bool) error {
	switch {
	case r.Job == "":
		return errors.New(`missing field "job"`)
	case r.Port == 0:
		return errors.New(`missing field "port"`)
	case unregister:
		return nil
	case r.LPID == "":
		return errors.New(`missing field "lpid"`)
	case r.CtlPort == 0:
		return errors.New(`missing field "ctl_port"`)
	}
	return nil
}

// Listener is the registration as a table entry, made by (or pushed from)
// the daemon of node host.
func (r ListenerRequest) Listener(host int) Listener {
	l := Listener{Job: r.Job, Node: host, Port: r.Port, LPID: r.LPID, CtlPort: r.CtlPort}
	if r.Node != nil && *r.Node != host {
		l.Node, l.Moved, l.Host = *r.Node, true, host
	}
	return l
}

// LogicalNode is the node whose listener the request names: its Node, or
// host's.
func (r ListenerRequest) LogicalNode(host int) int {
	if r.Node != nil {
		return *r.Node
	}
	return host
}

// LocateReply is the body of GET /v1/locate. When Managed is false it is
// encoded as {"managed":false} and the other fields are zero.
type LocateReply struct {
	Managed bool   `json:"managed"`
	Node    int    `json:"node"`
	LPID    string `json:"lpid"`
	Addr    string `json:"addr"` // the node's current IP : the port asked for
	Ctl     string `json:"ctl"`  // the node's current IP : the listener's control port
	Gen     uint64 `json:"gen"`
	// Closed (with Managed false): a listener no more; LPID and Ctl name
	// the process that last listened there (Location.Closed).
	Closed bool `json:"closed,omitempty"`
	// Host (with Moved): the node the listener's process runs on now, whose
	// address Addr and Ctl are (Location.Moved).
	Moved bool `json:"moved,omitempty"`
	Host  int  `json:"host,omitempty"`
}

// MarshalJSON encodes an unmanaged answer as {"managed":false}.
func (r LocateReply) MarshalJSON() ([]byte, error) {
	if !r.Managed && !r.Closed {
		return []byte(`{"managed":false}`), nil
	}
	type plain LocateReply
	return json.Marshal(plain(r))
}

// Reply converts a Location to its wire form.
func (l Location) Reply() LocateReply {
	if l.Closed && !l.Managed {
		return LocateReply{Closed: true, Node: l.Node, LPID: l.LPID, Addr: l.Addr.String(), Ctl: l.Ctl.String(), Gen: l.Gen, Moved: l.Moved, Host: l.Host}
	}
	if !l.Managed {
		return LocateReply{}
	}
	return LocateReply{Managed: true, Node: l.Node, LPID: l.LPID, Addr: l.Addr.String(), Ctl: l.Ctl.String(), Gen: l.Gen, Moved: l.Moved, Host: l.Host}
}

// Location parses a managed reply back into a Location.
func (r LocateReply) Location() (Location, error) {
	if !r.Managed {
		return Location{}, nil
	}
	a, err := netip.ParseAddrPort(r.Addr)
	if err != nil {
		return Location{}, fmt.Errorf("locate reply: field \"addr\": %v", err)
	}
	c, err := netip.ParseAddrPort(r.Ctl)
	if err != nil {
		return Location{}, fmt.Errorf("locate reply: field \"ctl\": %v", err)
	}
	if r.LPID == "" || r.Node < 0 || c.Port() == 0 {
		return Location{}, fmt.Errorf("locate reply: incomplete managed answer %+v", r)
	}
	return Location{Managed: true, Node: r.Node, LPID: r.LPID, Addr: netip.AddrPortFrom(a.Addr().Unmap(), a.Port()),
		Ctl: netip.AddrPortFrom(c.Addr().Unmap(), c.Port()), Gen: r.Gen, Moved: r.Moved, Host: r.Host}, nil
}
