/*
 * logring.h — the pessimistic log's ring, shared with the node's radicd.
 *
 * With recovery on (RADIC_RECOVERY=1), every receive on a managed
 * connection appends a record (the bytes, then the call's result: the
 * receive determinant) to one ring per process, in shared memory that the
 * node's radicd has mapped too. radicd ships what it finds to the
 * process's protectors and publishes how far the ring is stable. Before
 * anything leaves the process on a managed connection (a send, a close
 * marker), the shim waits until everything appended so far is stable.
 *
 * The layout is observer/logring's (the Go side's reader and converter);
 * the offsets are checked at compile time below and by a Go test.
 * Producers: the app's threads, any number (a fetch-and-add reserves
 * space, the copy runs unlocked, commits go in reservation order).
 * Consumer: radicd alone.
 */
#ifndef RADIC_LOGRING_H
#define RADIC_LOGRING_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define RADIC_LOG_MAGIC 0x47524c52u /* "RLRG" */
#define RADIC_LOG_VERSION 1
#define RADIC_LOG_HDR 4096
#define RADIC_LOG_REC_HDR 32

enum {
	RADIC_LOG_DATA = 1,
	RADIC_LOG_RECV = 2,
	RADIC_LOG_RECV_DATA = 3,
	RADIC_LOG_CONNECT = 4, /* offset: the logical peer, ip4 << 16 | port */
	RADIC_LOG_ACCEPT = 5,  /* offset: the logical port accepted on */
	RADIC_LOG_READY = 6,   /* conn: the call (enum below); offset: fds reported; payload: struct radic_log_ready each */
	RADIC_LOG_VALUE = 7,   /* conn: the call (enum below); payload: what it answered */
};

/* The call a RADIC_LOG_VALUE record answers (observer.ValueCall). */
enum { RADIC_VALUE_GETPID = 1, RADIC_VALUE_GETHOSTNAME = 2 };

/* The call a RADIC_LOG_READY record answers (observer.ReadyCall); a select
 * is logged as the poll the shim makes of it. */
enum { RADIC_READY_POLL = 1, RADIC_READY_EPOLL = 3 };

struct radic_log_hdr {
	uint32_t magic, version;
	uint64_t hdr_size;
	uint64_t data_size;
	uint64_t owner;
	uint64_t pid;
	uint64_t job;
	char pad0[64 - 48];
	uint64_t head; /* shim: committed bytes (release) */
	char pad1[128 - 72];
	uint64_t stable;           /* radicd: bytes on every protector */
	uint32_t stable_seq;       /* futex: bumped after each stable store */
	uint32_t producer_waiting; /* shim threads asleep on stable_seq */
	char pad2[192 - 144];
	uint32_t doorbell;         /* futex: the shim asks for a drain */
	uint32_t consumer_waiting; /* radicd sleeps on the doorbell */
	char pad3[256 - 200];
	char last_error[256]; /* radicd's reason for not advancing, for our log */
};

_Static_assert(offsetof(struct radic_log_hdr, head) == 64, "head");
_Static_assert(offsetof(struct radic_log_hdr, stable) == 128, "stable");
_Static_assert(offsetof(struct radic_log_hdr, stable_seq) == 136, "stable_seq");
_Static_assert(offsetof(struct radic_log_hdr, producer_waiting) == 140, "producer_waiting");
_Static_assert(offsetof(struct radic_log_hdr, doorbell) == 192, "doorbell");
_Static_assert(offsetof(struct radic_log_hdr, consumer_waiting) == 196, "consumer_waiting");
_Static_assert(offsetof(struct radic_log_hdr, last_error) == 256, "last_error");
_Static_assert(sizeof(struct radic_log_hdr) <= RADIC_LOG_HDR, "header size");

/* The process's ring, or NULL: recovery off, and the data path pays one
 * load and a predicted branch per receive and send. */
extern struct radic_log_hdr *radic_logring;
/* RADIC_TEST_ACK_BEFORE_LOG=1: receives are logged but nothing waits for
 * the log (sends, closes, acknowledgements): broken pessimism, for tests
 * that must fail with it. */
extern int radic_log_unsafe;

/* Appends one receive's bytes (len bytes of v, skip bytes in) that arrived
 * at stream offset off. final: the call returns with these bytes alone
 * (one RECV_DATA record); else a RECV follows (radic_log_result). Returns
 * the ring offset just past the record(s). */
uint64_t radic_log_data(uint64_t conn, const struct iovec *v, size_t n, size_t skip, size_t len,
			uint64_t off, int final);
/* Appends a receive's result (count, 0 end of stream, or -errno); recvd is
 * the connection's delivered count after the call. */
uint64_t radic_log_result(uint64_t conn, long result, uint64_t recvd);

/* Appends that managed connection conn was made (RADIC_LOG_CONNECT) or
 * accepted (RADIC_LOG_ACCEPT); arg as the enum says. hold: return only
 * once it is stable. A no-op with recovery off. */
void radic_log_conn(int type, uint64_t conn, uint64_t arg, int hold);

/* One fd a poll reported, in a RADIC_LOG_READY record. */
struct radic_log_ready {
	int32_t fd;
	uint16_t revents;
	uint16_t zero;
	uint64_t conn; /* 1 + the id of the managed connection fd is, or 0 */
};
_Static_assert(sizeof(struct radic_log_ready) == 16, "a READY record's entry");

/* Appends what a poll (call RADIC_READY_POLL) or epoll_wait (RADIC_READY_EPOLL)
 * over a set with managed fds returned: the n fds it reported, or err
 * (n == 0). A no-op with recovery off. */
void radic_log_ready(int call, const struct radic_log_ready *fds, size_t n, int err);

/* Appends that a connect to a node of the job (peer as RADIC_LOG_CONNECT's
 * offset) failed with err: a program that retries until its peer listens
 * must be given the same failures when it is re-executed. A no-op with
 * recovery off; no hold (the process's next send waits for it). */
void radic_log_connect_failed(uint64_t peer, int err);

/* Appends what a call (RADIC_VALUE_*) answered: the process's identity as
 * the program sees it, which a re-executed process must be given again.
 * A no-op with recovery off. */
void radic_log_value(int call, const void *v, size_t n);

/* Waits until everything appended so far is stable (slow path out of line). */
void radic_log_hold_slow(uint64_t head);
static inline void radic_log_hold(void)
{
	struct radic_log_hdr *h = radic_logring;
	if (__builtin_expect(h == NULL, 1) || radic_log_unsafe)
		return;
	uint64_t head = __atomic_load_n(&h->head, __ATOMIC_ACQUIRE);
	if (__builtin_expect(__atomic_load_n(&h->stable, __ATOMIC_ACQUIRE) < head, 0))
		radic_log_hold_slow(head);
}

/* For the Go side. */
struct radic_log_hdr *radic_log_create(const char *path, uint64_t data_size, uint64_t owner,
				       uint64_t job);
void radic_log_enable(struct radic_log_hdr *h, int unsafe_acks);
/* Asks radicd to drain and waits up to timeout_ms for stable >= target
 * (target 0: the current head). Returns 1 if it is. */
int radic_log_flush(uint64_t target, int timeout_ms);
uint64_t radic_log_stable(void);
uint64_t radic_log_head(void);

#endif
