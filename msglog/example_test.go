package msglog_test

import (
	"errors"
	"fmt"
	"io"
	"log"
	"os"

	"github.com/radic-project/radic/msglog"
)

// A protector logs what an observer received, replays it after a restart,
// and drops it after a checkpoint.
func Example() {
	dir, _ := os.MkdirTemp("", "msglog-example")
	defer os.RemoveAll(dir)

	s, err := msglog.Open(dir, msglog.Options{Sync: msglog.SyncAlways, MaxBytes: 1 << 30})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	const proc, conn = 42, 7 << 1 // logical process 42, connection 7, inbound (low bit 0)
	for _, chunk := range []string{"hello ", "world", "!"} {
		info, _ := s.Stream(proc, conn)
		err := s.Append(msglog.Record{Kind: msglog.KindData, Owner: proc, Stream: conn, Offset: info.End, Payload: []byte(chunk)})
		if errors.Is(err, msglog.ErrFull) {
			log.Print("store full: hold the sender (back-pressure) and retry after a truncation")
		} else if err != nil {
			log.Fatal(err)
		}
	}

	// Replay from offset 3 (where the restarted process's checkpoint was).
	c := s.Read(proc, conn, 3)
	for {
		r, err := c.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%d: %q\n", r.Offset, r.Payload)
	}

	// A checkpoint at offset 11 makes the bytes before it unnecessary.
	if err := s.Truncate(proc, conn, 11); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%+v\n", s.Streams(proc))
	// Output:
	// 3: "lo "
	// 6: "world"
	// 11: "!"
	// [{Key:{Owner:42 Stream:14} Low:11 End:12}]
}
