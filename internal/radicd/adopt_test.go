package radicd

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/radic-project/radic/msglog"
	"github.com/radic-project/radic/msglog/record"
)

func encodeRecords(rs ...record.Record) []byte {
	var b []byte
	for i := range rs {
		b = record.AppendRecord(b, &rs[i])
	}
	return b
}

// A pulled stream is stored whole through recordBatch, across batches;
// a body cut anywhere, or with a damaged record, is an error and never a
// shorter stream.
func TestReadRecordsIntoStore(t *testing.T) {
	var rs []record.Record
	var off uint64
	for i := range 40 {
		p := bytes.Repeat([]byte{byte(i)}, 300<<10) // 40 x 300 KiB: three batches
		rs = append(rs, record.Record{Kind: record.KindData, Owner: 9, Stream: 1, Offset: off, Payload: p})
		off += uint64(len(p))
	}
	body := encodeRecords(rs...)
	st, err := msglog.Open(t.TempDir(), msglog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	b := newRecordBatch(st)
	if err := readRecords(bytes.NewReader(body), b.add); err != nil {
		t.Fatalf("readRecords = %v", err)
	}
	if err := b.flush(); err != nil || b.stored != len(rs) {
		t.Fatalf("stored %d of %d records, %v", b.stored, len(rs), err)
	}
	c := st.Read(9, 1, 0)
	for i := 0; ; i++ {
		r, err := c.Next()
		if err == io.EOF {
			if i != len(rs) {
				t.Fatalf("%d records read back, want %d", i, len(rs))
			}
			break
		}
		if err != nil || !bytes.Equal(r.Payload, rs[i].Payload) || r.Offset != rs[i].Offset {
			t.Fatalf("record %d read back differs (%v)", i, err)
		}
	}

	for _, cut := range []int{1, record.HeaderLen - 1, record.HeaderLen + 5, len(body) - 1} {
		err := readRecords(bytes.NewReader(body[:cut]), func(record.Record) error { return nil })
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("a body cut at %d of %d: %v, want io.ErrUnexpectedEOF", cut, len(body), err)
		}
	}
	bad := bytes.Clone(body)
	bad[record.HeaderLen+10]++
	var corrupt *record.CorruptError
	if err := readRecords(bytes.NewReader(bad), func(record.Record) error { return nil }); !errors.As(err, &corrupt) {
		t.Errorf("a damaged payload: %v, want a CorruptError", err)
	}
}
