package main

/*
#include "shim.h"
#include "conn.h"
#include "logring.h"
*/
import "C"

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"
	"unsafe"

	"github.com/radic-project/radic/observer"
	"github.com/radic-project/radic/observer/logring"
)

// Recovery's pessimistic log, the shim's half (see shim/c/logring.h and
// observer/logring). Go only sets the ring up and hands it to radicd; the
// data path appends and holds in C.

const (
	defaultLogRing = 8 << 20 // RADIC_LOG_RING: data bytes of the ring
	logFlushWait   = 100 * time.Millisecond
)

// logRegistration is POST /v1/logring's body (internal/radicd/logring.go).
type logRegistration struct {
	Path  string `json:"path"`
	Job   string `json:"job"`
	Lpid  string `json:"lpid"`
	Owner uint64 `json:"owner"`
	Pid   int    `json:"pid"`
}

// recoveryOn: RADIC_RECOVERY=1 (set by radic run unless --no-recovery).
func recoveryOn() bool { return os.Getenv("RADIC_RECOVERY") == "1" }

// setupLog makes the process's log ring and hands it to the node's radicd,
// which maps it and removes its name: afterwards the mapping is all either
// side holds (no fd of ours for the program to close). An error means
// recovery was asked for and cannot be given.
func (s *safeSockets) setupLog(daemon string) error {
	size := uint64(defaultLogRing)
	if v := os.Getenv("RADIC_LOG_RING"); v != "" {
		n, err := strconv.ParseUint(v, 0, 64)
		if err != nil || n < 1<<16 || n > 1<<30 || n&(n-1) != 0 {
			return fmt.Errorf("RADIC_LOG_RING=%q: want a power of two from 65536 to 2^30", v)
		}
		size = n
	}
	dir := os.Getenv("RADIC_LOG_DIR")
	if dir == "" {
		dir = "/dev/shm"
	}
	path := filepath.Join(dir, fmt.Sprintf("radic-log.%x.%s.%d", s.jobHash, s.lpidName, os.Getpid()))
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	owner := logring.Owner(s.jobHash, s.lpid)
	h, err := C.radic_log_create(cpath, C.uint64_t(size), C.uint64_t(owner), C.uint64_t(s.jobHash))
	if h == nil {
		return fmt.Errorf("make the log ring %s (%d bytes): %v", path, size, err)
	}
	body, _ := json.Marshal(logRegistration{Path: path, Job: s.job, Lpid: s.lpidName, Owner: owner, Pid: os.Getpid()})
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Post("http://"+daemon+"/v1/logring", "application/json", bytes.NewReader(body))
	if err == nil {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			err = fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(msg))
		}
	}
	os.Remove(path) // radicd has mapped it (or will never)
	if err != nil {
		return fmt.Errorf("hand the log ring to radicd at %s: %v", daemon, err)
	}
	unsafeAcks := os.Getenv("RADIC_TEST_ACK_BEFORE_LOG") == "1"
	if unsafeAcks {
		logf("RADIC_TEST_ACK_BEFORE_LOG=1: received bytes are acknowledged and sends leave before they are logged (a test of the tests: recovery is NOT safe)")
	}
	C.radic_log_enable(h, boolInt(unsafeAcks))
	debugf("log ring of %d bytes handed to radicd", size)
	if s.replay == nil {
		logIdentity()
	}
	return nil
}

// logIdentity logs what getpid and gethostname answer this process (its
// first run): re-executed, it is given the same (shim/c/identity.c). A
// restarted process logs nothing: its log holds its first run's.
func logIdentity() {
	var pid [8]byte
	binary.LittleEndian.PutUint64(pid[:], uint64(os.Getpid()))
	C.radic_log_value(C.RADIC_VALUE_GETPID, unsafe.Pointer(&pid[0]), C.size_t(len(pid)))
	if host, err := os.Hostname(); err == nil && host != "" && len(host) <= observer.MaxValue {
		b := []byte(host)
		C.radic_log_value(C.RADIC_VALUE_GETHOSTNAME, unsafe.Pointer(&b[0]), C.size_t(len(b)))
	}
}

// flushLogFor: before an acknowledgement, if the connection has delivered
// bytes that are not stable yet, ask radicd to drain and wait a little,
// so that a stream whose receiver never sends (nothing else would wake
// radicd) is acknowledged, and its sender's ring freed, all the same.
func (c *conn) flushLogFor() {
	if C.radic_logring == nil || C.radic_log_unsafe != 0 {
		return
	}
	if uint64(C.radic_conn_ackable(c.c)) < uint64(C.radic_conn_recvd(c.c)) {
		C.radic_log_flush(0, C.int(logFlushWait/time.Millisecond))
	}
}

// flushLogAtExit: what the process received is logged before it goes
// (its exit and last close markers depend on it).
func flushLogAtExit() {
	if C.radic_logring == nil || C.radic_log_unsafe != 0 {
		return
	}
	if C.radic_log_flush(0, 30000) == 0 {
		logf("exiting with received bytes radicd has not logged after 30s (%d of %d stable)",
			uint64(C.radic_log_stable()), uint64(C.radic_log_head()))
	}
}
