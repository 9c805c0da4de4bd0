// Package bglayers makes every radic Blue Gene header a gopacket layer
// (decode and serialize) and writes pcap traces of torus and collective
// packets with pcapgo, for `radicd --pcap FILE` and for Wireshark with
// deploy/radic-bg.lua.
//
// A trace record is one whole torus or collective packet, link type
// DLT_USER0 (147); the first byte ('T' or 'C') tells which. Decode a
// record with gopacket.NewPacket(data, LayerTypeBG, gopacket.Default).
// The layers follow the wire formats of the protocol packages, whose
// decoders they call, so there is one definition of each format:
//
//	BG ─┬─ Torus ─┬─ proto deltat ─ DeltaT ─(first segment)─ TransportMsg ─┬─ BulkControl
//	    │         │                                                       └─ payload
//	    │         ├─ proto bulk ─── BulkData (rget, data, rnak)
//	    │         ├─ proto heartbeat ─ Heartbeat (the ring's datagrams)
//	    │         └─ proto frag ─── Frag ─ payload
//	    └─ Tree ─ payload
package bglayers

import (
	"encoding/binary"
	"fmt"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/radic-project/radic/bulktransport"
	"github.com/radic-project/radic/bulktransport/bulk"
	"github.com/radic-project/radic/bulktransport/deltat"
	"github.com/radic-project/radic/bulktransport/frag"
	"github.com/radic-project/radic/heartbeat"
	"github.com/radic-project/radic/netsim"
)

// LinkType of radic traces: DLT_USER0.
const LinkType = layers.LinkType(147)

// Layer types (numbers from the range gopacket leaves to applications).
var (
	LayerTypeBG           = gopacket.RegisterLayerType(7400, gopacket.LayerTypeMetadata{Name: "BG", Decoder: gopacket.DecodeFunc(decodeBG)})
	LayerTypeTorus        = gopacket.RegisterLayerType(7401, gopacket.LayerTypeMetadata{Name: "BGTorus", Decoder: gopacket.DecodeFunc(decodeTorus)})
	LayerTypeTree         = gopacket.RegisterLayerType(7402, gopacket.LayerTypeMetadata{Name: "BGTree", Decoder: gopacket.DecodeFunc(decodeTree)})
	LayerTypeFrag         = gopacket.RegisterLayerType(7403, gopacket.LayerTypeMetadata{Name: "BGFrag", Decoder: gopacket.DecodeFunc(decodeFrag)})
	LayerTypeDeltaT       = gopacket.RegisterLayerType(7404, gopacket.LayerTypeMetadata{Name: "DeltaT", Decoder: gopacket.DecodeFunc(decodeDeltaT)})
	LayerTypeTransportMsg = gopacket.RegisterLayerType(7405, gopacket.LayerTypeMetadata{Name: "TransportMsg", Decoder: gopacket.DecodeFunc(decodeTransportMsg)})
	LayerTypeBulkControl  = gopacket.RegisterLayerType(7406, gopacket.LayerTypeMetadata{Name: "BulkControl", Decoder: gopacket.DecodeFunc(decodeBulkControl)})
	LayerTypeBulkData     = gopacket.RegisterLayerType(7407, gopacket.LayerTypeMetadata{Name: "BulkData", Decoder: gopacket.DecodeFunc(decodeBulkData)})
	LayerTypeHeartbeat    = gopacket.RegisterLayerType(7408, gopacket.LayerTypeMetadata{Name: "Heartbeat", Decoder: gopacket.DecodeFunc(decodeHeartbeat)})
)

// decodeBG picks the torus or collective decoder by the magic byte.
func decodeBG(data []byte, p gopacket.PacketBuilder) error {
	if len(data) > 0 && data[0] == 'C' {
		return decodeTree(data, p)
	}
	return decodeTorus(data, p)
}

func decode(l interface {
	gopacket.DecodingLayer
	gopacket.Layer
}, data []byte, p gopacket.PacketBuilder) error {
	if err := l.DecodeFromBytes(data, p); err != nil {
		return err
	}
	p.AddLayer(l)
	return p.NextDecoder(l.NextLayerType())
}

// Torus is the torus packet header.
type Torus struct {
	layers.BaseLayer
	netsim.TorusHeader
}

func (l *Torus) LayerType() gopacket.LayerType             { return LayerTypeTorus }
func (l *Torus) CanDecode() gopacket.LayerClass            { return LayerTypeTorus }
func decodeTorus(d []byte, p gopacket.PacketBuilder) error { return decode(&Torus{}, d, p) }

// DecodeFromBytes decodes with netsim.DecodeTorus.
func (l *Torus) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	h, payload, err := netsim.DecodeTorus(data)
	if err != nil {
		df.SetTruncated()
		return err
	}
	l.TorusHeader = h
	l.BaseLayer = layers.BaseLayer{Contents: data[:netsim.TorusHeaderLen], Payload: payload}
	return nil
}

// NextLayerType follows the proto field.
func (l *Torus) NextLayerType() gopacket.LayerType {
	switch l.Proto {
	case netsim.ProtoDeltaT:
		return LayerTypeDeltaT
	case netsim.ProtoBulk:
		return LayerTypeBulkData
	case netsim.ProtoFrag:
		return LayerTypeFrag
	case netsim.ProtoHeartbeat:
		return LayerTypeHeartbeat
	}
	return gopacket.LayerTypePayload
}

// SerializeTo prepends the header; Length comes from the payload.
func (l *Torus) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	n := len(b.Bytes())
	if n > netsim.TorusPayload {
		return fmt.Errorf("bglayers: %d-byte torus payload", n)
	}
	h, err := b.PrependBytes(netsim.TorusHeaderLen)
	if err != nil {
		return err
	}
	copy(h, netsim.AppendTorus(make([]byte, 0, netsim.TorusHeaderLen), l.TorusHeader, nil))
	h[3] = byte(n)
	return nil
}

// Tree is the collective packet header.
type Tree struct {
	layers.BaseLayer
	netsim.TreeHeader
}

func (l *Tree) LayerType() gopacket.LayerType             { return LayerTypeTree }
func (l *Tree) CanDecode() gopacket.LayerClass            { return LayerTypeTree }
func (l *Tree) NextLayerType() gopacket.LayerType         { return gopacket.LayerTypePayload }
func decodeTree(d []byte, p gopacket.PacketBuilder) error { return decode(&Tree{}, d, p) }

// DecodeFromBytes decodes with netsim.DecodeTree.
func (l *Tree) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	h, payload, err := netsim.DecodeTree(data)
	if err != nil {
		df.SetTruncated()
		return err
	}
	l.TreeHeader = h
	l.BaseLayer = layers.BaseLayer{Contents: data[:netsim.TreeHeaderLen], Payload: payload}
	return nil
}

// SerializeTo prepends the header.
func (l *Tree) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	n := len(b.Bytes())
	if n > netsim.TreePayload {
		return fmt.Errorf("bglayers: %d-byte tree payload", n)
	}
	h, err := b.PrependBytes(netsim.TreeHeaderLen)
	if err != nil {
		return err
	}
	copy(h, netsim.AppendTree(make([]byte, 0, netsim.TreeHeaderLen), l.TreeHeader, nil))
	binary.BigEndian.PutUint16(h[4:], uint16(n))
	return nil
}

// Frag is a fragment header.
type Frag struct {
	layers.BaseLayer
	frag.Header
}

func (l *Frag) LayerType() gopacket.LayerType             { return LayerTypeFrag }
func (l *Frag) CanDecode() gopacket.LayerClass            { return LayerTypeFrag }
func (l *Frag) NextLayerType() gopacket.LayerType         { return gopacket.LayerTypePayload }
func decodeFrag(d []byte, p gopacket.PacketBuilder) error { return decode(&Frag{}, d, p) }

// DecodeFromBytes decodes with frag.Decode.
func (l *Frag) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	h, payload, err := frag.Decode(data)
	if err != nil {
		df.SetTruncated()
		return err
	}
	l.Header = h
	l.BaseLayer = layers.BaseLayer{Contents: data[:frag.HeaderLen], Payload: payload}
	return nil
}

// SerializeTo prepends the header.
func (l *Frag) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	h, err := b.PrependBytes(frag.HeaderLen)
	if err != nil {
		return err
	}
	binary.BigEndian.PutUint16(h, l.MsgID)
	binary.BigEndian.PutUint16(h[2:], l.Index)
	binary.BigEndian.PutUint32(h[4:], l.Total)
	return nil
}

// Heartbeat is one heartbeat-ring datagram (heartbeat.Message: a
// heartbeat, a probe or its answer, a notice), the whole torus payload.
type Heartbeat struct {
	layers.BaseLayer
	heartbeat.Message
}

func (l *Heartbeat) LayerType() gopacket.LayerType             { return LayerTypeHeartbeat }
func (l *Heartbeat) CanDecode() gopacket.LayerClass            { return LayerTypeHeartbeat }
func (l *Heartbeat) NextLayerType() gopacket.LayerType         { return gopacket.LayerTypeZero }
func decodeHeartbeat(d []byte, p gopacket.PacketBuilder) error { return decode(&Heartbeat{}, d, p) }

// DecodeFromBytes decodes with heartbeat.Decode.
func (l *Heartbeat) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	m, err := heartbeat.Decode(data)
	if err != nil {
		df.SetTruncated()
		return err
	}
	l.Message = m
	l.BaseLayer = layers.BaseLayer{Contents: data}
	return nil
}

// SerializeTo prepends the encoded message.
func (l *Heartbeat) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	enc := l.Append(nil)
	h, err := b.PrependBytes(len(enc))
	if err != nil {
		return err
	}
	copy(h, enc)
	return nil
}

// DeltaT is a delta-t header.
type DeltaT struct {
	layers.BaseLayer
	deltat.Header
}

func (l *DeltaT) LayerType() gopacket.LayerType             { return LayerTypeDeltaT }
func (l *DeltaT) CanDecode() gopacket.LayerClass            { return LayerTypeDeltaT }
func decodeDeltaT(d []byte, p gopacket.PacketBuilder) error { return decode(&DeltaT{}, d, p) }

// DecodeFromBytes decodes with deltat.Decode.
func (l *DeltaT) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	h, payload, err := deltat.Decode(data)
	if err != nil {
		df.SetTruncated()
		return err
	}
	l.Header = h
	l.BaseLayer = layers.BaseLayer{Contents: data[:deltat.HeaderLen], Payload: payload}
	return nil
}

// NextLayerType: the first segment of a message starts with the
// transport's kind byte; later segments are plain payload.
func (l *DeltaT) NextLayerType() gopacket.LayerType {
	if l.Flags&deltat.FlagBOM != 0 && len(l.Payload) > 0 {
		return LayerTypeTransportMsg
	}
	if len(l.Payload) == 0 {
		return gopacket.LayerTypeZero
	}
	return gopacket.LayerTypePayload
}

// SerializeTo prepends the header.
func (l *DeltaT) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	h, err := b.PrependBytes(deltat.HeaderLen)
	if err != nil {
		return err
	}
	copy(h, deltat.Append(make([]byte, 0, deltat.HeaderLen), l.Header, nil))
	return nil
}

// TransportMsg is the kind byte (and, for KindAppMeta, the 24 bytes of
// metadata) in front of every message the bulktransport Endpoint sends
// over delta-t.
type TransportMsg struct {
	layers.BaseLayer
	Kind uint8
	Meta []byte
}

func (l *TransportMsg) LayerType() gopacket.LayerType  { return LayerTypeTransportMsg }
func (l *TransportMsg) CanDecode() gopacket.LayerClass { return LayerTypeTransportMsg }
func decodeTransportMsg(d []byte, p gopacket.PacketBuilder) error {
	return decode(&TransportMsg{}, d, p)
}

// DecodeFromBytes parses the kind byte and the metadata.
func (l *TransportMsg) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if len(data) < 1 {
		df.SetTruncated()
		return fmt.Errorf("bglayers: empty transport message")
	}
	l.Kind, l.Meta = data[0], nil
	n := 1
	switch l.Kind {
	case bulktransport.KindAppMeta:
		if len(data) < 1+bulk.MetaLen {
			df.SetTruncated()
			return fmt.Errorf("bglayers: metadata truncated")
		}
		l.Meta = data[1 : 1+bulk.MetaLen]
		n += bulk.MetaLen
	case bulktransport.KindApp, bulktransport.KindBulk:
	default:
		return fmt.Errorf("bglayers: message kind %d", l.Kind)
	}
	l.BaseLayer = layers.BaseLayer{Contents: data[:n], Payload: data[n:]}
	return nil
}

// NextLayerType is BulkControl for bulk control messages.
func (l *TransportMsg) NextLayerType() gopacket.LayerType {
	if l.Kind == bulktransport.KindBulk {
		return LayerTypeBulkControl
	}
	return gopacket.LayerTypePayload
}

// SerializeTo prepends the kind byte and the metadata.
func (l *TransportMsg) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	h, err := b.PrependBytes(1 + len(l.Meta))
	if err != nil {
		return err
	}
	h[0] = l.Kind
	copy(h[1:], l.Meta)
	return nil
}

// BulkControl is a bulk control message: the 32-byte header and its word.
type BulkControl struct {
	layers.BaseLayer
	bulk.Control
}

func (l *BulkControl) LayerType() gopacket.LayerType     { return LayerTypeBulkControl }
func (l *BulkControl) CanDecode() gopacket.LayerClass    { return LayerTypeBulkControl }
func (l *BulkControl) NextLayerType() gopacket.LayerType { return gopacket.LayerTypeZero }
func decodeBulkControl(d []byte, p gopacket.PacketBuilder) error {
	return decode(&BulkControl{}, d, p)
}

// DecodeFromBytes decodes with bulk.DecodeControl.
func (l *BulkControl) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	c, err := bulk.DecodeControl(data)
	if err != nil {
		df.SetTruncated()
		return err
	}
	l.Control = c
	l.BaseLayer = layers.BaseLayer{Contents: data}
	return nil
}

// SerializeTo writes the message.
func (l *BulkControl) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	h, err := b.PrependBytes(bulk.ControlLen)
	if err != nil {
		return err
	}
	copy(h, bulk.AppendControl(make([]byte, 0, bulk.ControlLen), l.Control))
	return nil
}

// BulkData is a data-path packet: a remote get, data, or RNak.
type BulkData struct {
	layers.BaseLayer
	bulk.DataPath
}

func (l *BulkData) LayerType() gopacket.LayerType             { return LayerTypeBulkData }
func (l *BulkData) CanDecode() gopacket.LayerClass            { return LayerTypeBulkData }
func decodeBulkData(d []byte, p gopacket.PacketBuilder) error { return decode(&BulkData{}, d, p) }

// DecodeFromBytes decodes with bulk.DecodeDataPath.
func (l *BulkData) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	d, err := bulk.DecodeDataPath(data)
	if err != nil {
		df.SetTruncated()
		return err
	}
	l.DataPath = d
	n := len(data) - len(d.Data)
	l.BaseLayer = layers.BaseLayer{Contents: data[:n], Payload: d.Data}
	return nil
}

// NextLayerType is the data, if any.
func (l *BulkData) NextLayerType() gopacket.LayerType {
	if len(l.Payload) > 0 {
		return gopacket.LayerTypePayload
	}
	return gopacket.LayerTypeZero
}

// SerializeTo prepends the data-path header (the data is the payload
// already in b).
func (l *BulkData) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	var h []byte
	if l.Op == bulk.OpRGet {
		h = bulk.AppendRGet(nil, l.Tag, l.Offset, l.Length)
	} else {
		h = bulk.AppendDataHeader(nil, l.Op, l.Tag, l.Offset)
	}
	dst, err := b.PrependBytes(len(h))
	if err != nil {
		return err
	}
	copy(dst, h)
	return nil
}
