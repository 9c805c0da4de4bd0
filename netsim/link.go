package netsim

import "fmt"

// Link is one node's attachment to both networks. A Sim port (in memory,
// virtual time) and udplink.Node (UDP between processes, real time) both
// implement it, so a protocol driver written against it runs on either.
type Link interface {
	// Send puts a whole torus packet whose source is this node on the
	// torus. The link owns pkt afterwards.
	Send(pkt []byte) error
	// SendTree puts a collective packet (a broadcast or this node's
	// reduce contribution) on the collective network at this node.
	SendTree(pkt []byte) error
}

var _ Link = simPort{}

// Port is node id's Link on the simulated machine.
func (s *Sim) Port(id NodeID) Link { return simPort{s, id} }

type simPort struct {
	s  *Sim
	id NodeID
}

func (p simPort) Send(pkt []byte) error {
	h, _, err := DecodeTorus(pkt)
	if err != nil {
		return err
	}
	if p.s.cfg.Shape.ID(h.Src) != p.id {
		return fmt.Errorf("%w: node %d sends a packet from %v", ErrBadPacket, p.id, h.Src)
	}
	return p.s.Send(pkt)
}

func (p simPort) SendTree(pkt []byte) error { return p.s.SendTree(p.id, pkt) }
