package radicd

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/radic-project/radic/internal/launch"
)

// shimLogFile is where a recovery rank's shim writes its lines, or "":
// the file its launch environment names when radicd named it (a restarted
// rank's replay-*.log, set by prepareReplay), else one in the state dir.
// Its stderr then holds the application's lines alone: a restarted
// instance regenerates those, and radic run compares them with what the
// first instance delivered (with the shim's lines in it, a rank restarted
// after its shim had said anything was taken for a divergent one). A file
// the user named, or no state dir, is left alone.
func (d *Daemon) shimLogFile(rec *launch.Record) string {
	if d.cfg.StateDir == "" || envValue(rec.Env, "RADIC_RECOVERY") != "1" {
		return ""
	}
	if f := envValue(rec.Env, "RADIC_LOG_FILE"); f != "" {
		if filepath.Dir(f) == filepath.Clean(d.cfg.StateDir) {
			return f
		}
		return ""
	}
	return filepath.Join(d.cfg.StateDir, fmt.Sprintf("shim-%s-%d.log", rec.Job, rec.Rank))
}

// logTime is the time a shim's log file line starts with (core.c).
var logTime = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z `)

func stripLogTime(line []byte) []byte {
	if m := logTime.FindIndex(line); m != nil {
		return line[m[1]:]
	}
	return line
}

// shimLogPoll is how often a shim's log file is read for new lines.
const shimLogPoll = 100 * time.Millisecond

// tailShimLog forwards what the rank's shim (and its children's) append to
// file as the rank's launch.Radic stream, line by line and as the shim
// writes them to stderr (without the time the file's lines start with),
// until the rank has exited and the file is read to its end.
func (p *rankProc) tailShimLog(file string) {
	defer p.shim.Close()
	var f *os.File
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	buf := make([]byte, 64<<10)
	var line []byte // a line read in part
	for {
		exited := false
		select {
		case <-p.done:
			exited = true
		default:
		}
		if f == nil {
			f, _ = os.Open(file) // none until the shim's first line
		}
		for f != nil {
			n, err := f.Read(buf)
			for b := buf[:n]; len(b) > 0; {
				i := bytes.IndexByte(b, '\n')
				if i < 0 {
					line = append(line, b...)
					break
				}
				line = append(line, b[:i+1]...)
				b = b[i+1:]
				if _, werr := p.shim.Write(p.ctx, stripLogTime(line)); werr != nil {
					return
				}
				line = line[:0]
			}
			if n == 0 || err != nil {
				break
			}
		}
		if exited {
			if len(line) > 0 {
				_, _ = p.shim.Write(p.ctx, stripLogTime(line))
			}
			return
		}
		select {
		case <-p.done:
		case <-time.After(shimLogPoll):
		case <-p.ctx.Done():
			return
		}
	}
}
