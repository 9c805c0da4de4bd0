/*
 * conn.h — a safe socket's state and its data path.
 *
 * One struct radic_conn per managed (logical) connection, in the process's
 * own memory, so that a checkpoint of the process carries it whole. The app's
 * fd numbers stay the same for the connection's life; underneath, the TCP
 * socket they refer to is replaced after a failure (dup2 by the Go side).
 *
 * Byte accounting, per direction, in absolute 64-bit offsets:
 *
 *	send:    acked <= wire <= sent
 *	         [acked, sent) is in the retransmit ring; [wire, sent) has not
 *	         been handed to the current socket yet (a resume is pumping it)
 *	receive: recvd = bytes delivered to the app
 *
 * Locks: wlock covers the send side, rlock the receive side, eplock the
 * epoll registrations. acked, recvd, state and peer_end are also read (and
 * acked, state, peer_end written) by the Go side with atomics.
 */
#ifndef RADIC_CONN_H
#define RADIC_CONN_H

#include <pthread.h>
#include <netinet/in.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/socket.h>

enum radic_conn_state {
	RADIC_CONN_UP = 0,     /* the socket works: data flows directly */
	RADIC_CONN_BROKEN = 1, /* failed, resuming: reads wait, writes are kept */
	RADIC_CONN_FAILED = 2  /* given up: calls get fail_err */
};

/* The retransmit ring grows from RADIC_RING_MIN to RADIC_RING_MAX bytes; the
 * receiver acknowledges every RADIC_ACK_EVERY delivered bytes, so a writer
 * blocks on the ring only when far more is in flight than the kernel's own
 * buffers hold. */
#define RADIC_RING_MIN (64u << 10)
#define RADIC_RING_MAX (16u << 20)
#define RADIC_ACK_EVERY (4u << 20)
#define RADIC_EP_MAX 8

struct radic_epreg {
	int epfd;
	struct epoll_event ev; /* what the app registered */
	/* A one-shot registration the set reported is out of the kernel's
	 * set until the app re-arms it (EPOLL_CTL_MOD), so that moving
	 * registrations (a reconnection, the end of a replay) cannot re-arm
	 * it behind the app's back. armed_at: radic_ep_arms when the app
	 * last armed it (ADD or MOD). */
	int parked;
	uint64_t armed_at;
};

struct radic_conn {
	pthread_mutex_t wlock, rlock, eplock;
	int state;    /* enum radic_conn_state, atomic */
	int fail_err; /* errno the app gets once FAILED (0: end of stream) */
	int wake_fd;  /* eventfd: readable except while BROKEN */
	int nonblock; /* the app's O_NONBLOCK */
	int wr_shut;  /* the app shut its sending side */
	int peer_gone; /* the peer process finished: sends are dropped (radic_conn_peer_gone) */
	uint32_t gen; /* which socket: bumped at every swap */
	uint64_t id;  /* the logical connection id */

	unsigned char *ring;
	uint64_t cap; /* ring size, a power of two; 0 before the first write */
	uint64_t sent; /* atomic for Go's reads */
	uint64_t wire;
	uint64_t acked; /* atomic */

	uint64_t recvd;    /* atomic */
	uint64_t ack_due;  /* ask Go to acknowledge once recvd passes this */
	uint64_t peer_end; /* atomic: the peer's close marker, or UINT64_MAX */

	/* Recovery (logring.h): the log ring's offset just past this
	 * connection's last record, stored before recvd moves past its bytes;
	 * and the most that was found stable and acknowledged (atomic). */
	uint64_t log_end;
	uint64_t log_acked;

	struct sockaddr_in laddr, paddr; /* the logical addresses the app sees */
	int nep;
	struct radic_epreg ep[RADIC_EP_MAX];

	/* Threads in a poll or select with this connection's socket in the
	 * kernel's wait (atomic): a swap waits for them to leave (see
	 * radic_conn_swap). */
	int pollers;

	/* A non-blocking send found the retransmit ring full (atomic): epoll
	 * registrations leave out EPOLLOUT until acknowledgements free room
	 * (ep_room_wait in conn.c). */
	int room_wait;

	/* Replay (a restarted process, ARCHITECTURE.md "Replay"). rx_hash is
	 * the CRC-32C of the bytes delivered, [0, recvd), kept with recovery
	 * on, for the resume handshake's digest. rp is the log of what this
	 * connection received in the process's earlier run: receives take
	 * their bytes and counts from it until it is exhausted (under
	 * rlock). replay_end is where the peer resumes sending (the log's
	 * end). tx_replay: this connection's sends regenerate bytes the peer
	 * may have; skip_to and skip_hash (under wlock) are what the peer
	 * said it received: sends below skip_to are hashed into tx_hash and
	 * dropped, and the hash compared when sent reaches skip_to. */
	uint32_t rx_hash;
	int tx_replay;
	struct radic_replay *rp;
	uint64_t replay_end;
	uint64_t skip_to;
	uint32_t skip_hash, tx_hash;
	/* The peer's digest from the handshake, taken up by the swap (until
	 * then the send path must not start dropping: what it drops is not
	 * in the ring the swap hashes). */
	uint64_t verify_at;
	uint32_t verify_hash;
	int verify_set;
	int ep_fd;      /* an fd of the connection, for moving epoll registrations */
};

/* One connection's log, for replay (owned by the connection once
 * attached; freed when exhausted). */
struct radic_replay {
	unsigned char *data; /* the bytes received, [0, len), in a radic_big_alloc of cap */
	uint64_t len, pos, cap;
	int64_t *res; /* each receive's result: count, 0 end of stream, -errno */
	uint64_t nres, idx;
};

/* Hands C the logged polls to replay (RADIC_LOG_READY), flattened: per
 * poll its errno, its count of reported fds, then for each its fd,
 * revents, and 1 + its connection's id (0: none) as low and high halves.
 * Returns -1 if out of memory. */
int radic_replay_polls(const uint32_t *v, uint64_t n);

/* Connections whose replay is not exhausted, and the logged polls (atomic). */
extern int radic_replaying;

/* CRC-32C (Castagnoli), hardware where the CPU has it. */
uint32_t radic_crc32c(uint32_t crc, const void *p, size_t n);

extern struct radic_conn *radic_conns[];
extern int radic_unready;       /* conns not UP: waiting calls must look closer */
extern unsigned radic_breaks;   /* bumped at every break: a wait that spans one redoes its answer */

static inline struct radic_conn *radic_conn_of(int fd)
{
	return (unsigned)fd < (1u << 16) ? __atomic_load_n(&radic_conns[fd], __ATOMIC_ACQUIRE)
					 : NULL;
}

/*
 * A waiting call that hands a connection's fd itself to the kernel's poll
 * or select holds the connection around that call. Hold first, then check
 * that the connection is UP (radic_unready, or its state, read after the
 * hold): a break that the check misses is then sure to see the hold.
 */
static inline void radic_conn_hold(struct radic_conn *c)
{
	__atomic_add_fetch(&c->pollers, 1, __ATOMIC_SEQ_CST);
}

static inline void radic_conn_unhold(struct radic_conn *c)
{
	__atomic_sub_fetch(&c->pollers, 1, __ATOMIC_RELEASE);
}

/* The data path (conn.c). */
ssize_t radic_conn_send(struct radic_conn *c, int fd, const struct msghdr *m, int flags);
ssize_t radic_conn_recv(struct radic_conn *c, int fd, struct msghdr *m, int flags);
int radic_conn_poll(struct pollfd *fds, nfds_t n, int timeout_ms, const sigset_t *mask);
int radic_conn_epoll_ctl(struct radic_conn *c, int epfd, int op, int fd, struct epoll_event *ev);
/* With recovery on: notes a plain fd's registration in an epoll set, so that
 * a logged epoll_wait can say which fd an event was for. */
void radic_epoll_note(int epfd, int op, int fd, const struct epoll_event *ev);
/* An epoll_wait over a set watching a safe socket, with recovery on: answered
 * from the log while it has waits, else made (epoll_pwait2 when tmo is set,
 * timeout_ms its rounding up; else epoll_pwait) and logged. */
int radic_conn_epoll_wait(int epfd, struct epoll_event *evs, int max, int timeout_ms,
			  const struct timespec *tmo, const sigset_t *mask);
void radic_conn_fcntl_flags(struct radic_conn *c, int flags);
int radic_conn_name(struct radic_conn *c, int peer, struct sockaddr *addr, socklen_t *len);

/* Big buffers: mapped, in huge pages where the kernel gives them. */
void *radic_big_alloc(uint64_t n);
void radic_big_free(void *p, uint64_t n);

/* For the Go side. */
struct radic_conn *radic_conn_new(int fd, uint64_t id, int nonblock);
void radic_conn_attach(struct radic_conn *c, int fd);
void radic_conn_detach(int fd);
void radic_conn_release(struct radic_conn *c);
int radic_conn_break(struct radic_conn *c, uint32_t gen, int fd);
void radic_conn_barrier(struct radic_conn *c);
int radic_conn_swap(struct radic_conn *c, int sock, const int *fds, int nfds, uint64_t resume_at);
/* Replay: attaches a connection's log. The results are copied; the data
 * too, unless owned is not 0: then data is a radic_big_alloc of owned
 * bytes (len of them used) that the connection takes over (and frees). */
int radic_conn_replay(struct radic_conn *c, void *data, uint64_t len, uint64_t owned, const int64_t *res,
		      uint64_t nres);
/* Replay: the peer received [0, at) of our stream, with CRC-32C hash. */
void radic_conn_set_verify(struct radic_conn *c, uint64_t at, uint32_t hash);
/* Where the peer resumes sending to us: max(recvd, the replayed log's end). */
uint64_t radic_conn_resume_point(struct radic_conn *c);
uint32_t radic_conn_rx_hash(struct radic_conn *c);
int radic_conn_pump(struct radic_conn *c, int fd, int timeout_ms);
void radic_conn_fail(struct radic_conn *c, int err, int fd);
void radic_conn_ack_all(struct radic_conn *c);
void radic_conn_set_peer_end(struct radic_conn *c, uint64_t v);
void radic_conn_peer_gone(struct radic_conn *c, uint64_t end, int fd);
void radic_conn_set_acked(struct radic_conn *c, uint64_t v);
uint64_t radic_conn_recvd(struct radic_conn *c);
uint64_t radic_conn_ackable(struct radic_conn *c);
uint64_t radic_conn_sent(struct radic_conn *c);
uint64_t radic_conn_acked(struct radic_conn *c);
uint64_t radic_conn_peer_end(struct radic_conn *c);
int radic_conn_state(struct radic_conn *c);
uint64_t radic_conn_shut_wr(struct radic_conn *c);
void radic_conn_set_names(struct radic_conn *c, uint32_t lip, uint16_t lport, uint32_t pip,
			  uint16_t pport);

/* Go's side of the data path is exported from Go (see safe.go):
 * radic_go_broken, radic_go_wait_room, radic_go_ack_due, called through
 * radic_go (shim.h). */

#endif
