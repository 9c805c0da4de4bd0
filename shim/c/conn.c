/*
 * conn.c — the data path of safe sockets.
 *
 * Everything a managed read, write or wait needs is here, in C: the byte
 * counts, the retransmit ring, and hiding a broken socket from poll, select
 * and epoll. Go is entered only when something changes: a socket fails, the
 * ring is full, or enough has been delivered that the peer should hear of it.
 *
 * While a connection is BROKEN the app's fds still name the old, shut-down
 * socket. Reads wait (or EAGAIN), writes go to the ring, and waiting calls
 * see the connection's wake eventfd instead, which becomes readable when the
 * Go side has swapped a working socket in (or given up).
 */
#include "shim.h"
#include "conn.h"
#include "logring.h"

#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

struct radic_conn *radic_conns[RADIC_FD_MAX];
int radic_unready;
unsigned radic_breaks;

static inline int load_state(struct radic_conn *c)
{
	return __atomic_load_n(&c->state, __ATOMIC_ACQUIRE);
}

static inline uint64_t load64(uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

static size_t iov_total(const struct iovec *v, size_t n)
{
	size_t t = 0;
	for (size_t i = 0; i < n; i++)
		t += v[i].iov_len;
	return t;
}

/* Fills out (up to max entries) with the part of v that starts skip bytes in
 * and is at most len long; returns the entry count. */
static int iov_slice(const struct iovec *v, size_t n, size_t skip, size_t len, struct iovec *out,
		     int max)
{
	int k = 0;
	for (size_t i = 0; i < n && len > 0 && k < max; i++) {
		size_t l = v[i].iov_len;
		if (skip >= l) {
			skip -= l;
			continue;
		}
		size_t take = l - skip < len ? l - skip : len;
		out[k].iov_base = (char *)v[i].iov_base + skip;
		out[k].iov_len = take;
		k++;
		len -= take;
		skip = 0;
	}
	return k;
}

/* ---- the retransmit ring --------------------------------------------------- */

/* Ring memory: mapped, and in huge pages where the kernel gives them on
 * request, since the copy streams through megabytes of it. */
static unsigned char *ring_alloc(uint64_t cap)
{
	void *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	if (cap >= (2u << 20))
		madvise(p, cap, MADV_HUGEPAGE);
	return p;
}

static void ring_free(unsigned char *r, uint64_t cap)
{
	if (r != NULL)
		munmap(r, cap);
}

/* Makes room for need bytes past acked; returns 0 or -1 (ENOMEM). */
static int ring_reserve(struct radic_conn *c, uint64_t need)
{
	if (need <= c->cap)
		return 0;
	uint64_t cap = c->cap ? c->cap : RADIC_RING_MIN;
	while (cap < need)
		cap <<= 1;
	unsigned char *r = ring_alloc(cap);
	if (r == NULL)
		return -1;
	/* Copy what may still be needed: [acked, sent) at its new positions. */
	uint64_t from = load64(&c->acked);
	for (uint64_t x = from; x < c->sent;) {
		uint64_t o = x & (c->cap - 1), n = c->cap - o;
		if (n > c->sent - x)
			n = c->sent - x;
		uint64_t p = x & (cap - 1), m = cap - p;
		if (n > m)
			n = m;
		memcpy(r + p, c->ring + o, n);
		x += n;
	}
	ring_free(c->ring, c->cap);
	c->ring = r;
	c->cap = cap;
	return 0;
}

/*
 * The ring is written once and read back only if a connection breaks, so
 * its copy bypasses the cache (non-temporal stores): it neither evicts the
 * app's data nor pays to read the ring's lines in before writing them.
 */
static void ring_copy(unsigned char *dst, const unsigned char *src, size_t n)
{
#if defined(__x86_64__)
	if (n >= 4096) {
		size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
		memcpy(dst, src, head);
		dst += head;
		src += head;
		n -= head;
		size_t i = 0;
		for (; i + 64 <= n; i += 64) {
			__m128i a = _mm_loadu_si128((const __m128i *)(src + i));
			__m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
			__m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
			__m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
			_mm_stream_si128((__m128i *)(dst + i), a);
			_mm_stream_si128((__m128i *)(dst + i + 16), b);
			_mm_stream_si128((__m128i *)(dst + i + 32), c);
			_mm_stream_si128((__m128i *)(dst + i + 48), d);
		}
		_mm_sfence();
		memcpy(dst + i, src + i, n - i);
		return;
	}
#endif
	memcpy(dst, src, n);
}

/* Copies len bytes of v (skipping skip) into the ring at offset c->sent. */
static void ring_put(struct radic_conn *c, const struct iovec *v, size_t n, size_t skip,
		     size_t len)
{
	uint64_t at = c->sent;
	for (size_t i = 0; i < n && len > 0; i++) {
		size_t l = v[i].iov_len;
		if (skip >= l) {
			skip -= l;
			continue;
		}
		const unsigned char *p = (const unsigned char *)v[i].iov_base + skip;
		size_t take = l - skip < len ? l - skip : len;
		skip = 0;
		len -= take;
		while (take > 0) {
			uint64_t o = at & (c->cap - 1), room = c->cap - o;
			size_t k = take < room ? take : (size_t)room;
			ring_copy(c->ring + o, p, k);
			p += k;
			at += k;
			take -= k;
		}
	}
}

/* ---- the copier -------------------------------------------------------------
 *
 * A large write's copy into the ring runs on a helper thread while the
 * writing thread is in the kernel sending the same bytes: both only read the
 * app's buffer, and the writer no longer pays for the copy in line. One job
 * at a time; a writer that finds the copier busy, or finds its job not yet
 * started when its send returns, copies itself.
 */
#define RADIC_COPY_ASYNC (128u << 10)

enum { JOB_POSTED, JOB_TAKEN, JOB_DONE };

struct copy_job {
	struct radic_conn *c;
	const struct iovec *v;
	size_t n, skip, len;
	int state; /* a futex word */
};

static pthread_mutex_t copier_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t copier_cv = PTHREAD_COND_INITIALIZER;
static struct copy_job *copier_job;
static pthread_once_t copier_once = PTHREAD_ONCE_INIT;
static int copier_running;

static void *copier_main(void *arg)
{
	(void)arg;
	for (;;) {
		pthread_mutex_lock(&copier_mu);
		while (copier_job == NULL)
			pthread_cond_wait(&copier_cv, &copier_mu);
		struct copy_job *j = copier_job;
		copier_job = NULL;
		int posted = JOB_POSTED;
		int mine = __atomic_compare_exchange_n(&j->state, &posted, JOB_TAKEN, 0,
						       __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
		pthread_mutex_unlock(&copier_mu);
		if (!mine)
			continue; /* the writer took it back */
		ring_put(j->c, j->v, j->n, j->skip, j->len);
		__atomic_store_n(&j->state, JOB_DONE, __ATOMIC_RELEASE);
		syscall(SYS_futex, &j->state, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
	}
	return NULL;
}

static void copier_start(void)
{
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old); /* no app signal handler runs on it */
	pthread_t t;
	if (pthread_create(&t, NULL, copier_main, NULL) == 0) {
		pthread_detach(t);
		copier_running = 1;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* Hands the copy to the copier if it is free; 0 if the caller must copy. */
static int copy_post(struct copy_job *j)
{
	if (j->len < RADIC_COPY_ASYNC)
		return 0;
	pthread_once(&copier_once, copier_start);
	if (!copier_running)
		return 0;
	pthread_mutex_lock(&copier_mu);
	int free = copier_job == NULL;
	if (free) {
		j->state = JOB_POSTED;
		copier_job = j;
		pthread_cond_signal(&copier_cv);
	}
	pthread_mutex_unlock(&copier_mu);
	return free;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ volatile("yield");
#endif
}

/* The send is done: make sure the copy is too. */
static void copy_finish(struct copy_job *j)
{
	int posted = JOB_POSTED;
	if (__atomic_compare_exchange_n(&j->state, &posted, JOB_TAKEN, 0, __ATOMIC_ACQ_REL,
					__ATOMIC_ACQUIRE)) {
		pthread_mutex_lock(&copier_mu); /* not started: take it back */
		if (copier_job == j)
			copier_job = NULL;
		pthread_mutex_unlock(&copier_mu);
		ring_put(j->c, j->v, j->n, j->skip, j->len);
		return;
	}
	for (int spin = 0; __atomic_load_n(&j->state, __ATOMIC_ACQUIRE) != JOB_DONE; spin++) {
		if (spin < 200)
			cpu_relax();
		else
			syscall(SYS_futex, &j->state, FUTEX_WAIT_PRIVATE, JOB_TAKEN, NULL, NULL, 0);
	}
}

/* ---- waiting ------------------------------------------------------------------ */

/* Blocks until the connection leaves BROKEN. The wake fd is drained by Go
 * before it marks a connection BROKEN and written when it leaves, and no
 * waiter ever reads it, so no wakeup is lost. */
static void wait_unbroken(struct radic_conn *c)
{
	while (load_state(c) == RADIC_CONN_BROKEN && load64(&c->peer_end) != load64(&c->recvd)) {
		struct pollfd p = {.fd = c->wake_fd, .events = POLLIN};
		REAL(poll)(&p, 1, 200); /* the timeout notices a close marker */
	}
}

/* Hands a failure to Go, which marks the connection BROKEN (or decides the
 * EOF was a proper end). Returns 1 when Go says the stream has ended. */
static int report(struct radic_conn *c, uint32_t gen, int err, int eof, int nonblock)
{
	if (!radic_go_allowed())
		return 0;
	radic_in_shim = 1;
	int r = radic_go.broken(c, gen, err, eof, nonblock);
	radic_in_shim = 0;
	return r;
}

static void ask_room(struct radic_conn *c)
{
	if (!radic_go_allowed()) {
		struct pollfd p = {.fd = -1};
		REAL(poll)(&p, 0, 10);
		return;
	}
	radic_in_shim = 1;
	radic_go.wait_room(c);
	radic_in_shim = 0;
}

/* ---- send ------------------------------------------------------------------- */

#define RADIC_IOV_MAX 64

ssize_t radic_conn_send(struct radic_conn *c, int fd, const struct msghdr *m, int flags)
{
	size_t total = iov_total(m->msg_iov, m->msg_iovlen), done = 0;
	int nb = c->nonblock || (flags & MSG_DONTWAIT), err = 0;
	if (total == 0)
		return 0;
	/* Pessimism: nothing leaves while bytes this process received are not
	 * yet on its protectors (what we send may depend on them). */
	radic_log_hold();
	pthread_mutex_lock(&c->wlock);
	for (;;) {
		int st = load_state(c);
		if (st == RADIC_CONN_FAILED || c->wr_shut) {
			err = c->wr_shut || c->fail_err == 0 ? EPIPE : c->fail_err;
			break;
		}
		uint64_t used = c->sent - load64(&c->acked);
		if (used >= RADIC_RING_MAX) {
			if (nb) {
				err = EAGAIN;
				break;
			}
			pthread_mutex_unlock(&c->wlock);
			ask_room(c);
			pthread_mutex_lock(&c->wlock);
			continue;
		}
		size_t want = total - done;
		if (want > RADIC_RING_MAX - used)
			want = RADIC_RING_MAX - used;
		if (ring_reserve(c, used + want) < 0) {
			err = ENOBUFS;
			break;
		}
		ssize_t r = (ssize_t)want;
		if (st == RADIC_CONN_UP && c->wire == c->sent) {
			struct iovec v[RADIC_IOV_MAX];
			struct msghdr t = *m;
			t.msg_iov = v;
			t.msg_iovlen = (size_t)iov_slice(m->msg_iov, m->msg_iovlen, done, want, v,
							 RADIC_IOV_MAX);
			uint32_t gen = c->gen;
			/* The copy of what this send may take runs beside it. */
			struct copy_job job = {c, m->msg_iov, m->msg_iovlen, done, want, 0};
			int async = copy_post(&job);
			r = REAL(sendmsg)(fd, &t, flags | MSG_NOSIGNAL);
			if (async)
				copy_finish(&job);
			if (r < 0) {
				int e = errno;
				if (e == EAGAIN || e == EINTR || e == ENOBUFS || e == ENOMEM) {
					err = e;
					break;
				}
				/* The socket failed: Go marks the connection BROKEN and
				 * the bytes go to the ring on the next turn. */
				pthread_mutex_unlock(&c->wlock);
				report(c, gen, e, 0, nb);
				pthread_mutex_lock(&c->wlock);
				continue;
			}
			c->wire += (uint64_t)r;
			if (!async)
				ring_put(c, m->msg_iov, m->msg_iovlen, done, (size_t)r);
		} else {
			/* A resume is pumping the ring: queue behind it. */
			ring_put(c, m->msg_iov, m->msg_iovlen, done, (size_t)r);
		}
		__atomic_store_n(&c->sent, c->sent + (uint64_t)r, __ATOMIC_RELEASE);
		done += (size_t)r;
		if (done == total || nb)
			break;
	}
	pthread_mutex_unlock(&c->wlock);
	if (done > 0)
		return (ssize_t)done;
	if (err == EPIPE && !(flags & MSG_NOSIGNAL))
		raise(SIGPIPE);
	errno = err;
	return -1;
}

/* ---- receive --------------------------------------------------------------- */

ssize_t radic_conn_recv(struct radic_conn *c, int fd, struct msghdr *m, int flags)
{
	size_t total = iov_total(m->msg_iov, m->msg_iovlen), done = 0;
	int nb = c->nonblock || (flags & MSG_DONTWAIT), err = 0;
	int peek = flags & MSG_PEEK;
	int waitall = (flags & MSG_WAITALL) && !nb && !peek;
	int ack = 0, need_det = 0;
	struct radic_log_hdr *lg = peek ? NULL : radic_logring;
	pthread_mutex_lock(&c->rlock);
	for (;;) {
		int st = load_state(c);
		if (load64(&c->peer_end) == c->recvd)
			break; /* the peer closed, and everything it sent is read */
		if (st == RADIC_CONN_FAILED) {
			err = c->fail_err;
			break;
		}
		if (st == RADIC_CONN_BROKEN) {
			if (nb) {
				err = EAGAIN;
				break;
			}
			pthread_mutex_unlock(&c->rlock);
			wait_unbroken(c);
			pthread_mutex_lock(&c->rlock);
			continue;
		}
		struct iovec v[RADIC_IOV_MAX];
		struct msghdr t = *m;
		if (done > 0) {
			t.msg_iov = v;
			t.msg_iovlen = (size_t)iov_slice(m->msg_iov, m->msg_iovlen, done,
							 total - done, v, RADIC_IOV_MAX);
		}
		uint32_t gen = c->gen;
		ssize_t r = REAL(recvmsg)(fd, &t, flags);
		if (r > 0) {
			/* What the kernel wrote back: TCP names no sender. */
			m->msg_flags = t.msg_flags;
			m->msg_namelen = t.msg_namelen;
			m->msg_controllen = t.msg_controllen;
			if (RADIC_UNLIKELY(lg != NULL)) {
				/* Logged before recvd moves: an acknowledgement that
				 * sees the new recvd sees this record's log_end. */
				int only = done == 0 && (!waitall || (size_t)r == total);
				uint64_t end = radic_log_data(c->id, m->msg_iov, m->msg_iovlen, done,
							      (size_t)r, c->recvd, only);
				need_det |= !only;
				__atomic_store_n(&c->log_end, end, __ATOMIC_RELEASE);
			}
			if (!peek) {
				__atomic_store_n(&c->recvd, c->recvd + (uint64_t)r, __ATOMIC_RELEASE);
				if (c->recvd >= c->ack_due) {
					c->ack_due = c->recvd + RADIC_ACK_EVERY;
					ack = 1;
				}
			}
			done += (size_t)r;
			if (!waitall || done == total)
				break;
			continue;
		}
		if (r == 0 && total > 0) {
			/* End of stream without the peer's close marker: a failure,
			 * unless the marker is only late. */
			pthread_mutex_unlock(&c->rlock);
			int ended = report(c, gen, 0, 1, nb);
			pthread_mutex_lock(&c->rlock);
			if (ended || load64(&c->peer_end) == c->recvd)
				break;
			if (nb && load_state(c) == RADIC_CONN_UP) {
				err = EAGAIN;
				break;
			}
			continue;
		}
		if (r == 0)
			break;
		int e = errno;
		if (e == EAGAIN || e == EINTR || e == ENOMEM) {
			err = e;
			break;
		}
		pthread_mutex_unlock(&c->rlock);
		report(c, gen, e, 0, nb);
		pthread_mutex_lock(&c->rlock);
	}
	if (RADIC_UNLIKELY(lg != NULL) && (need_det || done == 0)) {
		/* The call's result is a determinant: a count whose bytes were
		 * logged in pieces, an end of stream, or an errno. */
		long res = done > 0 ? (long)done : -(long)err;
		__atomic_store_n(&c->log_end, radic_log_result(c->id, res, c->recvd), __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&c->rlock);
	if (ack && radic_go_allowed()) {
		radic_in_shim = 1;
		radic_go.ack_due(c);
		radic_in_shim = 0;
	}
	if (done > 0 || err == 0)
		return (ssize_t)done;
	errno = err;
	return -1;
}

/* ---- poll and select ------------------------------------------------------- */

#define RADIC_POLL_STACK 256

/*
 * The socket of an UP connection says end of stream or error (POLLRDHUP,
 * POLLHUP, POLLERR). That is readiness only if the stream really ended:
 * the peer's close marker, or bytes still to read before the end. Else it
 * is a failure nobody has seen yet (the peer broke first, and its
 * shutdown's FIN got through; a reset): told "readable", the app would
 * read, the read would find the end, break the connection and, once it is
 * resumed, block on the new socket for bytes that may never come (iperf3
 * reading its control connection, which speaks only at the end of a
 * test). So the failure is reported here, as the read would have, and the
 * caller polls again. Returns 1 when the readiness was not true. Called
 * with the connection held, so no swap can change the socket under fd.
 */
static int false_end(struct radic_conn *c, int fd)
{
	if (load64(&c->peer_end) == load64(&c->recvd))
		return 0;
	char b;
	ssize_t r = REAL(recv)(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
	if (r > 0)
		return 0;
	int e = errno;
	if (r < 0 && (e == EAGAIN || e == EINTR))
		return 0;
	uint32_t gen = c->gen;
	if (r == 0)
		return report(c, gen, 0, 1, 0) == 0; /* 1: the marker came, a proper end */
	report(c, gen, e, 0, 1);
	return 1;
}

/*
 * poll(2) over a set with managed fds: every poll, ppoll, select and
 * pselect of the job's on a safe socket. A BROKEN connection is replaced
 * by its wake fd (readable once it is resumed, then the whole set is
 * polled again); a FAILED one reports an error at once; an UP one's end
 * of stream or error is checked (false_end).
 *
 * A connection that was UP when the set was made can break while the poll
 * waits on its socket: the break's shutdown makes that socket "readable"
 * (and writable, hung up), which is not true of the connection. Such an
 * answer is never returned; the set is polled again, the broken
 * connection on its wake fd. Connections break one after another (each
 * has its own control channel), so the wait that the first break sends
 * here is the one most later breaks land in: iperf3, told so that its
 * control connection was readable, read it with a blocking read that
 * waited for ever on the resumed socket (TestWaitAcrossBreaks).
 */
int radic_conn_poll(struct pollfd *fds, nfds_t n, int timeout_ms, const sigset_t *mask)
{
	struct pollfd stack[RADIC_POLL_STACK], *p = stack;
	if (n > RADIC_POLL_STACK && (p = malloc(n * sizeof *p)) == NULL) {
		errno = ENOMEM;
		return -1;
	}
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int r;
	for (;;) {
		int failed = 0, swapped = 0;
		/* Read before the states below (radic_conn_break bumps it after
		 * marking a connection BROKEN, before its shutdown): a break
		 * that they miss moves it. */
		unsigned b0 = __atomic_load_n(&radic_breaks, __ATOMIC_SEQ_CST);
		for (nfds_t i = 0; i < n; i++) {
			p[i] = fds[i];
			struct radic_conn *c = radic_is_managed(fds[i].fd) ? radic_conn_of(fds[i].fd) : NULL;
			int st = RADIC_CONN_UP;
			if (c) {
				radic_conn_hold(c);
				st = __atomic_load_n(&c->state, __ATOMIC_SEQ_CST);
				if (st != RADIC_CONN_UP)
					radic_conn_unhold(c); /* its socket is not polled */
			}
			if (st == RADIC_CONN_UP && c) {
				p[i].events |= POLLRDHUP; /* an end is looked at (false_end) */
			} else if (st == RADIC_CONN_BROKEN) {
				p[i].fd = c->wake_fd;
				p[i].events = POLLIN;
				swapped = 1;
			} else if (st == RADIC_CONN_FAILED) {
				p[i].fd = -1;
				failed++;
			}
		}
		int tmo = failed ? 0 : timeout_ms;
		sigset_t old;
		if (mask)
			pthread_sigmask(SIG_SETMASK, mask, &old);
		r = REAL(poll)(p, n, tmo);
		if (mask)
			pthread_sigmask(SIG_SETMASK, &old, NULL);
		int ended = 0;
		for (nfds_t i = 0; i < n; i++) {
			struct radic_conn *c = radic_is_managed(fds[i].fd) ? radic_conn_of(fds[i].fd) : NULL;
			if (c && p[i].fd == fds[i].fd) {
				if (r > 0 && (p[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) &&
				    false_end(c, fds[i].fd))
					ended = 1;
				radic_conn_unhold(c);
			}
		}
		if (r < 0)
			break;
		int stale = ended || __atomic_load_n(&radic_breaks, __ATOMIC_SEQ_CST) != b0;
		int woke = 0;
		r = 0;
		for (nfds_t i = 0; i < n; i++) {
			struct radic_conn *c = radic_is_managed(fds[i].fd) ? radic_conn_of(fds[i].fd) : NULL;
			short ev = p[i].revents;
			if (c && p[i].fd == c->wake_fd && fds[i].fd != c->wake_fd) {
				woke |= ev != 0;
				ev = 0;
			} else if (c && p[i].fd == -1 && fds[i].fd >= 0) {
				ev = (fds[i].events & (POLLIN | POLLOUT)) | POLLERR | POLLHUP;
			} else if (c) {
				ev &= fds[i].events | POLLERR | POLLHUP | POLLNVAL;
			}
			fds[i].revents = ev;
			r += ev != 0;
		}
		if (!stale && (r > 0 || !woke || !swapped))
			break;
		/* A broken connection came back, or one broke under the poll:
		 * poll again for what is left. A stale answer is not returned
		 * even when the time is up: one more look, without waiting. */
		if (timeout_ms >= 0) {
			struct timespec t1;
			clock_gettime(CLOCK_MONOTONIC, &t1);
			long el = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
			if (el >= timeout_ms && !stale)
				break;
			timeout_ms = el >= timeout_ms ? 0 : timeout_ms - (int)el;
			t0 = t1;
		}
	}
	if (p != stack)
		free(p);
	return r;
}

/* ---- epoll ------------------------------------------------------------------ */

/*
 * The app's epoll registrations of a managed fd are remembered, so that the
 * Go side can move them: onto the wake fd while the connection is BROKEN (a
 * shut-down socket would report ready forever), and onto the new socket
 * after a swap (epoll forgets a file replaced under an fd number).
 */
int radic_conn_epoll_ctl(struct radic_conn *c, int epfd, int op, int fd, struct epoll_event *ev)
{
	pthread_mutex_lock(&c->eplock);
	/* Registrations sit on the socket only while the connection is UP. */
	int target = load_state(c) == RADIC_CONN_UP ? fd : c->wake_fd;
	struct epoll_event e;
	if (ev)
		e = *ev;
	int r = REAL(epoll_ctl)(epfd, op, target, ev ? &e : NULL);
	if (r == 0) {
		int i;
		for (i = 0; i < c->nep && c->ep[i].epfd != epfd; i++)
			;
		if (op == EPOLL_CTL_DEL) {
			if (i < c->nep)
				c->ep[i] = c->ep[--c->nep];
		} else if (i < c->nep) {
			c->ep[i].ev = *ev;
		} else if (c->nep < RADIC_EP_MAX) {
			c->ep[c->nep].epfd = epfd;
			c->ep[c->nep].ev = *ev;
			c->nep++;
		} else {
			radic_logf("fd %d is in more than %d epoll sets; set %d will not follow a reconnection",
				   fd, RADIC_EP_MAX, epfd);
		}
	}
	pthread_mutex_unlock(&c->eplock);
	return r;
}

/* Moves every registration from one file to another (both may be sockets
 * or the wake fd). */
static void ep_move(struct radic_conn *c, int from, int to)
{
	for (int i = 0; i < c->nep; i++) {
		struct epoll_event e = c->ep[i].ev;
		if (from >= 0)
			REAL(epoll_ctl)(c->ep[i].epfd, EPOLL_CTL_DEL, from, NULL);
		if (REAL(epoll_ctl)(c->ep[i].epfd, EPOLL_CTL_ADD, to, &e) < 0 && errno != EEXIST)
			radic_logf("cannot re-register fd %d in epoll set %d: %s", to, c->ep[i].epfd,
				   strerror(errno));
	}
}

/* ---- small things ----------------------------------------------------------- */

void radic_conn_fcntl_flags(struct radic_conn *c, int flags)
{
	__atomic_store_n(&c->nonblock, (flags & O_NONBLOCK) != 0, __ATOMIC_RELAXED);
}

/* getsockname/getpeername: the logical address, whatever socket is under. */
int radic_conn_name(struct radic_conn *c, int peer, struct sockaddr *addr, socklen_t *len)
{
	const struct sockaddr_in *a = peer ? &c->paddr : &c->laddr;
	if (a->sin_family != AF_INET)
		return -1; /* not known: ask the kernel */
	if (addr == NULL || len == NULL) {
		errno = EFAULT;
		return -2;
	}
	socklen_t n = *len < sizeof *a ? *len : sizeof *a;
	memcpy(addr, a, n);
	*len = sizeof *a;
	return 0;
}

/* ---- the Go side's handles ------------------------------------------------- */

struct radic_conn *radic_conn_new(int fd, uint64_t id, int nonblock)
{
	struct radic_conn *c = calloc(1, sizeof *c);
	if (c == NULL)
		return NULL;
	c->wake_fd = eventfd(1, EFD_CLOEXEC | EFD_NONBLOCK);
	if (c->wake_fd < 0) {
		free(c);
		return NULL;
	}
	pthread_mutex_init(&c->wlock, NULL);
	pthread_mutex_init(&c->rlock, NULL);
	pthread_mutex_init(&c->eplock, NULL);
	c->id = id;
	c->nonblock = nonblock;
	c->ack_due = RADIC_ACK_EVERY;
	c->peer_end = UINT64_MAX;
	radic_conn_attach(c, fd);
	return c;
}

/* fd (the app's, or a dup of it) now names c. */
void radic_conn_attach(struct radic_conn *c, int fd)
{
	if ((unsigned)fd >= RADIC_FD_MAX)
		return;
	__atomic_store_n(&radic_conns[fd], c, __ATOMIC_RELEASE);
	radic_fd_set(fd, RADIC_FD_MANAGED);
}

void radic_conn_detach(int fd)
{
	if ((unsigned)fd < RADIC_FD_MAX)
		__atomic_store_n(&radic_conns[fd], NULL, __ATOMIC_RELEASE);
}

/* The connection is over (closed, everything acknowledged): its ring goes.
 * The small state block stays, since a thread racing the app's close may
 * still look at it. */
void radic_conn_release(struct radic_conn *c)
{
	pthread_mutex_lock(&c->wlock);
	ring_free(c->ring, c->cap);
	c->ring = NULL;
	c->cap = 0;
	c->wr_shut = 1;
	pthread_mutex_unlock(&c->wlock);
}

static void set_state(struct radic_conn *c, int from, int to)
{
	if (from == RADIC_CONN_UP && to != RADIC_CONN_UP)
		__atomic_add_fetch(&radic_unready, 1, __ATOMIC_SEQ_CST); /* pairs with radic_conn_hold */
	if (from != RADIC_CONN_UP && to == RADIC_CONN_UP)
		__atomic_sub_fetch(&radic_unready, 1, __ATOMIC_RELAXED);
	__atomic_store_n(&c->state, to, __ATOMIC_RELEASE);
}

/*
 * Marks the connection BROKEN if it is still on socket gen, and kicks every
 * thread out of the kernel on that socket (fd names it). Returns 1 if this
 * call broke it. Go holds its own lock around state changes.
 */
int radic_conn_break(struct radic_conn *c, uint32_t gen, int fd)
{
	if (c->gen != gen || load_state(c) != RADIC_CONN_UP)
		return 0;
	uint64_t v;
	while (REAL(read)(c->wake_fd, &v, sizeof v) > 0)
		;
	pthread_mutex_lock(&c->eplock);
	set_state(c, RADIC_CONN_UP, RADIC_CONN_BROKEN);
	ep_move(c, fd, c->wake_fd);
	pthread_mutex_unlock(&c->eplock);
	/* The shutdown below makes the old socket look readable to a poll or
	 * select already waiting on it: the waiting wrappers see the counter
	 * move and redo their answer. */
	__atomic_add_fetch(&radic_breaks, 1, __ATOMIC_SEQ_CST);
	REAL(shutdown)(fd, SHUT_RDWR);
	return 1;
}

/* After it returns, no thread is inside a read or write of the connection
 * that started before the barrier: recvd is final while BROKEN. */
void radic_conn_barrier(struct radic_conn *c)
{
	pthread_mutex_lock(&c->rlock);
	pthread_mutex_unlock(&c->rlock);
	pthread_mutex_lock(&c->wlock);
	pthread_mutex_unlock(&c->wlock);
}

/*
 * Waits until no poll or select holds the connection's old socket.
 *
 * The break's shutdown woke every such wait, but one that has not looked
 * again yet must not find another socket under the fd: the kernel's poll
 * and select read the fds anew on every look, yet stay queued only on the
 * files of their first one, so the wait would sleep through the new
 * socket's data (a standalone test: 200 of 200 polls did, until their
 * timeout). Once the holders are out, those that come back see the
 * connection BROKEN and wait on its wake fd instead.
 *
 * A wait that the shutdown cannot end (a select on exceptional conditions
 * only) is given up on after a second.
 */
static void await_pollers(struct radic_conn *c)
{
	for (int i = 0; __atomic_load_n(&c->pollers, __ATOMIC_SEQ_CST) > 0; i++) {
		if (i == 2000) {
			radic_logf("connection %llu: a wait on its old socket did not end; swapping anyway",
				   (unsigned long long)c->id);
			return;
		}
		struct timespec ts = {0, 500 * 1000};
		nanosleep(&ts, NULL);
	}
}

/*
 * Puts sock under every fd of the connection, restores the app's flags and
 * epoll registrations, and resumes sending at resume_at (the peer's
 * delivered offset). sock is left open (the caller closes it). Returns 0,
 * or -1 with errno.
 */
int radic_conn_swap(struct radic_conn *c, int sock, const int *fds, int nfds, uint64_t resume_at)
{
	await_pollers(c);
	pthread_mutex_lock(&c->wlock);
	pthread_mutex_lock(&c->rlock);
	pthread_mutex_lock(&c->eplock);
	int r = 0;
	for (int i = 0; i < nfds && r == 0; i++) {
		int cloexec = REAL(fcntl)(fds[i], F_GETFD) & FD_CLOEXEC;
		if (REAL(dup3)(sock, fds[i], cloexec ? O_CLOEXEC : 0) < 0)
			r = -1;
	}
	if (r == 0) {
		int fl = REAL(fcntl)(sock, F_GETFL);
		fl = c->nonblock ? fl | O_NONBLOCK : fl & ~O_NONBLOCK;
		REAL(fcntl)(sock, F_SETFL, fl);
		if (nfds > 0)
			ep_move(c, c->wake_fd, fds[0]);
		if (resume_at > c->sent)
			resume_at = c->sent;
		/* The peer's delivered offset frees the ring only without
		 * recovery: with it, only the peer's acks (what it has logged)
		 * do, since a restarted peer resumes from its log's end. */
		if (radic_logring == NULL && resume_at > load64(&c->acked))
			__atomic_store_n(&c->acked, resume_at, __ATOMIC_RELEASE);
		c->wire = resume_at;
		c->gen++;
		set_state(c, load_state(c), RADIC_CONN_UP);
		uint64_t one = 1;
		(void)!REAL(write)(c->wake_fd, &one, sizeof one);
	}
	int e = errno;
	pthread_mutex_unlock(&c->eplock);
	pthread_mutex_unlock(&c->rlock);
	pthread_mutex_unlock(&c->wlock);
	errno = e;
	return r;
}

/*
 * Sends [wire, sent) of the ring on fd (the current socket), without
 * blocking the app for long: the lock is held for one non-blocking write at
 * a time. Returns 0 when all is sent, -1 with errno on a socket error, 1 if
 * it timed out or the connection is not UP.
 */
int radic_conn_pump(struct radic_conn *c, int fd, int timeout_ms)
{
	for (;;) {
		pthread_mutex_lock(&c->wlock);
		if (load_state(c) != RADIC_CONN_UP) {
			pthread_mutex_unlock(&c->wlock);
			return 1;
		}
		if (c->wire == c->sent) {
			pthread_mutex_unlock(&c->wlock);
			return 0;
		}
		uint64_t o = c->wire & (c->cap - 1), n = c->cap - o;
		if (n > c->sent - c->wire)
			n = c->sent - c->wire;
		ssize_t r = REAL(send)(fd, c->ring + o, n, MSG_DONTWAIT | MSG_NOSIGNAL);
		int e = errno;
		if (r > 0)
			c->wire += (uint64_t)r;
		pthread_mutex_unlock(&c->wlock);
		if (r < 0 && e != EAGAIN && e != EINTR) {
			errno = e;
			return -1;
		}
		if (r < 0 && e == EAGAIN) {
			struct pollfd p = {.fd = fd, .events = POLLOUT};
			if (REAL(poll)(&p, 1, timeout_ms) == 0)
				return 1;
		}
	}
}

/* Gives up: every call on the connection gets err from now on (0: EOF). */
void radic_conn_fail(struct radic_conn *c, int err, int fd)
{
	pthread_mutex_lock(&c->eplock);
	c->fail_err = err;
	int st = load_state(c);
	if (st == RADIC_CONN_UP)
		ep_move(c, fd, c->wake_fd); /* the socket may be silent: the wake fd is not */
	set_state(c, st, RADIC_CONN_FAILED);
	uint64_t one = 1;
	(void)!REAL(write)(c->wake_fd, &one, sizeof one);
	pthread_mutex_unlock(&c->eplock);
}

/* The peer will read no more (it closed): everything counts as delivered. */
void radic_conn_ack_all(struct radic_conn *c)
{
	pthread_mutex_lock(&c->wlock);
	__atomic_store_n(&c->acked, c->sent, __ATOMIC_RELEASE);
	if (c->wire < c->sent)
		c->wire = c->sent;
	pthread_mutex_unlock(&c->wlock);
}

void radic_conn_set_peer_end(struct radic_conn *c, uint64_t v)
{
	__atomic_store_n(&c->peer_end, v, __ATOMIC_RELEASE);
}

void radic_conn_set_acked(struct radic_conn *c, uint64_t v)
{
	uint64_t cur = load64(&c->acked);
	while (v > cur && !__atomic_compare_exchange_n(&c->acked, &cur, v, 0, __ATOMIC_RELEASE,
						       __ATOMIC_ACQUIRE))
		;
}

uint64_t radic_conn_recvd(struct radic_conn *c) { return load64(&c->recvd); }

/*
 * What the control plane may acknowledge: with recovery, only bytes that
 * are stable in the log, min(delivered, logged). recvd is read before
 * log_end (the data path stores them in the other order), so a stable
 * ring up to log_end covers every byte up to recvd; otherwise the last
 * value found covered is kept. Lock-free: a reader may be in the kernel
 * holding rlock.
 */
uint64_t radic_conn_ackable(struct radic_conn *c)
{
	uint64_t r = load64(&c->recvd);
	if (radic_logring == NULL || radic_log_unsafe)
		return r;
	uint64_t end = load64(&c->log_end);
	if (radic_log_stable() < end)
		return load64(&c->log_acked);
	uint64_t cur = load64(&c->log_acked);
	while (r > cur && !__atomic_compare_exchange_n(&c->log_acked, &cur, r, 0, __ATOMIC_RELEASE,
						       __ATOMIC_ACQUIRE))
		;
	return r > cur ? r : cur;
}

/* Lock-free: a writer may be blocked in the kernel holding wlock. */
uint64_t radic_conn_sent(struct radic_conn *c) { return load64(&c->sent); }


uint64_t radic_conn_acked(struct radic_conn *c) { return load64(&c->acked); }

uint64_t radic_conn_peer_end(struct radic_conn *c) { return load64(&c->peer_end); }

int radic_conn_state(struct radic_conn *c) { return load_state(c); }

/* The app shut its sending side: no more writes; returns the final offset. */
uint64_t radic_conn_shut_wr(struct radic_conn *c)
{
	pthread_mutex_lock(&c->wlock);
	c->wr_shut = 1;
	uint64_t s = c->sent;
	pthread_mutex_unlock(&c->wlock);
	return s;
}

/* Addresses in network byte order, ports in host order. */
void radic_conn_set_names(struct radic_conn *c, uint32_t lip, uint16_t lport, uint32_t pip,
			  uint16_t pport)
{
	c->laddr = (struct sockaddr_in){
		.sin_family = AF_INET, .sin_port = htons(lport), .sin_addr = {lip}};
	c->paddr = (struct sockaddr_in){
		.sin_family = AF_INET, .sin_port = htons(pport), .sin_addr = {pip}};
}
