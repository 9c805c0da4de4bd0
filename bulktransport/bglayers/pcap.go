package bglayers

import (
	"fmt"
	"io"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/pcapgo"

	"github.com/radic-project/radic/netsim"
)

// PcapWriter writes torus and collective packets to a pcap trace. It is
// not safe for concurrent use; radicd serializes writes through one
// goroutine or a mutex.
type PcapWriter struct{ w *pcapgo.Writer }

// NewPcapWriter writes the pcap file header (link type DLT_USER0).
func NewPcapWriter(w io.Writer) (*PcapWriter, error) {
	pw := pcapgo.NewWriter(w)
	if err := pw.WriteFileHeader(netsim.MaxTreePacket, LinkType); err != nil {
		return nil, fmt.Errorf("write pcap header: %w", err)
	}
	return &PcapWriter{pw}, nil
}

// WritePacket records one whole torus or collective packet seen at t.
func (p *PcapWriter) WritePacket(t time.Time, pkt []byte) error {
	return p.w.WritePacket(gopacket.CaptureInfo{Timestamp: t, CaptureLength: len(pkt), Length: len(pkt)}, pkt)
}

// Record is one captured packet.
type Record struct {
	At  time.Time
	Pkt []byte
}

// WritePcap writes a whole trace: the helper behind `radicd --pcap FILE`.
func WritePcap(w io.Writer, recs []Record) error {
	pw, err := NewPcapWriter(w)
	if err != nil {
		return err
	}
	for _, r := range recs {
		if err := pw.WritePacket(r.At, r.Pkt); err != nil {
			return fmt.Errorf("write pcap record: %w", err)
		}
	}
	return nil
}
