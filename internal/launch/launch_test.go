package launch

import (
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/radic-project/radic/msglog/record"
)

func good() Record {
	return Record{Version: Version, Job: "c-3", Rank: 1, Size: 2, Node: 4, Path: "/bin/true",
		Argv: []string{"true"}, Env: []string{"A=1"}, Cwd: "/tmp"}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Record)
		want string // "" = valid
	}{
		{"good", func(*Record) {}, ""},
		{"version", func(r *Record) { r.Version = 9 }, "version 9"},
		{"job", func(r *Record) { r.Job = "a/b" }, `job id "a/b"`},
		{"no job", func(r *Record) { r.Job = "" }, "job id"},
		{"rank", func(r *Record) { r.Rank = 2 }, "rank 2 of size 2"},
		{"argv", func(r *Record) { r.Argv = nil }, "no program"},
		{"cwd", func(r *Record) { r.Cwd = "rel" }, "not absolute"},
	} {
		r := good()
		tc.edit(&r)
		err := r.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: Validate() = %v; want nil", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: Validate() = %v; want an error saying %q", tc.name, err, tc.want)
		}
	}
}

// A record stored by Encode decodes to itself, under the owner and stream
// the package doc names; one under the wrong stream is refused.
func TestStoreEncoding(t *testing.T) {
	r := good()
	rec, err := Encode(&r)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Kind != record.KindLaunch || rec.Owner != StoreOwner || rec.Stream != StreamOf("c-3", 1) || rec.Offset != 0 {
		t.Fatalf("Encode: kind %v owner %#x stream %#x offset %d", rec.Kind, rec.Owner, rec.Stream, rec.Offset)
	}
	// Through the wire format and back.
	b := record.AppendRecord(nil, &rec)
	back, _, err := record.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(back)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(&r, got); d != "" {
		t.Errorf("Decode(Encode(r)) (-want +got):\n%s", d)
	}
	back.Stream = StreamOf("c-3", 0)
	if _, err := Decode(back); err == nil {
		t.Errorf("Decode of rank 1's record under rank 0's stream succeeded")
	}
	if StreamOf("c-3", 1) == StreamOf("c-31", 0) || StreamOf("c-3", 11) == StreamOf("c-31", 1) {
		t.Errorf("StreamOf does not separate job from rank")
	}
}

func TestExit(t *testing.T) {
	for _, tc := range []struct {
		ws     syscall.WaitStatus
		status int
		text   string
	}{
		{0, 0, "exited with status 0"},
		{3 << 8, 3, "exited with status 3"},
		{syscall.WaitStatus(syscall.SIGKILL), 137, "was killed by signal 9 (killed)"},
		{syscall.WaitStatus(syscall.SIGTERM), 143, "was killed by signal 15 (terminated)"},
	} {
		e := ExitOf(tc.ws)
		if e.Status() != tc.status || e.String() != tc.text {
			t.Errorf("ExitOf(%#x) = %d %q; want %d %q", uint32(tc.ws), e.Status(), e.String(), tc.status, tc.text)
		}
	}
}
