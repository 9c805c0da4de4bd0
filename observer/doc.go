// Package observer is the RADIC observer: per managed process it owns the
// safe sockets, ships critical data (received bytes, determinants) to the
// process's protector and drives replay after a restart (DESIGN.md
// contracts 5, 6 and 8).
//
// What is here so far are the pure cores, with no sockets, clocks or
// goroutines: the determinant format, the replay cursor ([Replay]) and the
// divergence check ([StreamHash], [Summary], [OutputCheck]). The edges
// that feed them (the shim's calls, radicd's log shipping and the resume
// handshake) are not written yet; "Edges" below says what they must call.
//
// # Streams in the log
//
// A process's critical data lives in package msglog under Owner = its
// logical process id, in streams whose Stream id is
//
//	Stream = conn id (any value but 2^64-1)   the bytes the owner RECEIVED on
//	                                          logical connection conn (KindData)
//	Stream = DeterminantStream = 2^64-1       the owner's determinants, in call
//	                                          order (KindDeterminant)
//
// No direction bit is needed: logging is receiver-based, so a process only
// ever logs what it received; the other direction of a connection is its
// peer's receive stream, under the peer's Owner. A logical connection id
// is the shim's full 64 bits (initiator's lpid << 32 | connect number), so
// no bit of it can be taken for a tag; the single value 2^64-1 (lpid
// 0xffffffff's 2^32-1th connect) is reserved, and [DataKey] and the
// determinant encoder refuse it ([ErrReservedConn]) rather than mix streams.
// The scheme assumes one end of a connection per process (a process
// connected to itself would have two receive streams with one id).
//
// # Determinant format (version 1)
//
// The determinant stream is a byte stream (msglog may cut and merge its
// records anywhere); each determinant is self-delimiting:
//
//	tag     1 byte: version (1) << 4 | kind; 0x00 never decodes
//	fields  by kind, unsigned LEB128 varints (minimal: the encoding is
//	        canonical), in this order:
//
//	kind 1 recv     conn, errno, n          n bytes returned (0: end of stream), or errno
//	kind 2 send     conn, errno, n          n bytes accepted, or errno (EAGAIN, EPIPE)
//	kind 3 connect  conn, errno, peer       one attempt: conn made, or errno
//	kind 4 accept   port, conn, errno       the logical connection returned, or errno
//	kind 5 ready    call(1 byte), errno, count, count × {fd, events}
//	kind 6 value    call(1 byte), ref, length, length bytes
//
//	peer   family byte (0 none, 4, 6), then 4 or 16 address bytes and a
//	       big-endian uint16 port (absent for family 0); a logical address
//	ready call: 1 poll (and ppoll), 2 select (and pselect), 3 epoll_wait
//	value call: 1 getpid, 2 gethostname, 3 getsockname, 4 getpeername,
//	       5 getsockopt(SO_ERROR); ref is the connection asked about, or 0
//
// A receive of 300 bytes on connection 5 is 11 05 00 ac 02 (5 bytes); a
// typical one, on connection 3:1 (a 5-byte varint), 8 or 9 bytes. Limits:
// errno ≤ 4095, n ≤ 0x7ffff000 (MAX_RW_COUNT), ready sets ≤ 65536 entries,
// values ≤ 4096 bytes, so one determinant is at most [MaxDeterminantLen].
// Unused fields of a kind must be zero. [DecodeDeterminant] returns io.EOF
// on empty input, a *[FormatError] wrapping io.ErrUnexpectedEOF that names
// the field for a short prefix, and a *FormatError wrapping [ErrFormat]
// naming the bad field (version, kind, conn, n, errno, length, ...)
// otherwise. A newer format takes a new version nibble; every determinant
// carries it, so a stream truncated at a checkpoint still says its version.
//
// # Replay model
//
// A restarted process (the exec backend: re-executed from its launch
// record) makes the same calls as its original run as long as it gets the
// same answers. [NewReplay] takes the determinant stream, an [Opener] for
// the data streams (a *msglog.Cursor is a [Source]) and a [Checkpoint]
// (zero for exec). Each call of the process goes to the matching method —
// Recv, Send, Connect, Accept, Ready, Value — which checks it against the
// next determinant and returns it:
//
//	call matches      the logged answer (Recv: exactly the logged count of
//	                  bytes, read from the data stream; EAGAIN and EOF too)
//	call differs      *PathError (ErrDiverged): process, determinant number
//	                  and stream offset, the call made and the one logged
//	log lacks bytes   an error matching ErrIncomplete (pessimism broken)
//	log exhausted     ErrLive: this and later calls run live; Live() gives,
//	                  per connection, Delivered (bytes the app got), Logged
//	                  (the peer resumes sending here; [Delivered, Logged)
//	                  are served from the log first) and Sent, and the
//	                  determinant offset where the live run appends.
//
// A retried connect replays every attempt (each is a determinant). An
// accept names the logical connection to return, whatever arrives first.
// A connection the Opener does not log (inside the checkpoint group) gets
// counts only: the edge reads that many bytes from its regenerating peer.
//
// # Divergence check
//
// The hash of a byte stream at offset x, [Hash], is CRC-32C of bytes
// [0, x) in the high 32 bits and CRC-32 (IEEE) of them in the low 32: two
// different polynomials make a 64-bit check, each CRC is its own running
// state (so the hash at any offset continues to any later one, whatever
// the send boundaries were), and both run in hardware (about 12 GB/s for
// the pair on a 2-core EPYC VM, BenchmarkStreamHash). CRCs catch every
// change of up to 32 bits and random changes with probability 1-2^-64;
// they are not proof against an adversary, which is not the threat here.
//
// The RECEIVER of each direction keeps a [StreamHash]: the hash at its
// end and at every multiple of the block size (default 64 KiB: 8 bytes of
// memory per 64 KiB). When the sender restarts, the receiver sends it a
// [Summary]. The restarted sender passes its regenerated bytes through an
// [OutputCheck]: bytes below the summary's End are hashed, compared at each
// block boundary and at End, and dropped; bytes past End are returned to
// be sent. A mismatch is an *[OutputError] (ErrDiverged) naming the
// process, the connection and the block [From, To) holding the first
// differing byte; ending the output before End is one too (Close).
//
// Summary layout (little-endian; 40 bytes + 8 per point):
//
//	0       4    5          6          8     16    24      32     36       40
//	+-------+----+----------+----------+-----+-----+-------+------+--------+--------------+
//	|"RDHS" | 1  | log2(blk)| reserved | end | sum | first | count| reserved| count × hash |
//	+-------+----+----------+----------+-----+-----+-------+------+--------+--------------+
//
// Point i is the hash at offset (first+i)·block; all points are ≤ end.
// [DecodeSummary] reports errors as DecodeDeterminant does.
//
// # Edges
//
// The exec backend's replay (ARCHITECTURE.md, "Replay") uses
// [ReceivesFrom] ([SplitReceives] for records): it replays receives per connection in C, checks sends
// with one CRC-32C digest at the peer's offset, and does not use [Replay]
// or [Summary] yet. What follows is the full plan.
//
// The shim / observer host, in the original run, for each call on a managed
// connection or visible value: build the Determinant with the call's answer
// and append it (with AppendDeterminant) to the determinant stream, after
// the received bytes of a recv are appended to the connection's data
// stream, and before any send that depends on them leaves (pessimism).
// Every send on a managed connection is logged (partial counts and EAGAIN
// are determinants). It also feeds each received direction's StreamHash.
//
// At restart (protector/radicd): open the store's cursors, build the
// Replay; route every call to it until ErrLive; give each connection's
// sends to an OutputCheck built from its peer's Summary (obtained in the
// resume handshake) and transmit only the fresh bytes; on ErrLive resume
// each connection at Live's offsets; on ErrDiverged stop the job, count
// radic_divergences_total and log the error. The shim must keep its own
// fds out of the application's fd numbers so ready sets replay as logged.
//
// Not covered yet: MSG_PEEK receives, the interest sets of poll/select
// (only the call and its answer are checked), signals and timers, and a
// CRIU checkpoint's sender hash seed (NewOutputCheck takes it; nothing
// stores it yet).
package observer
