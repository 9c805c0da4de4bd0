/* stream: bulk two-way byte streams between ranks, checked byte by byte.
 * It is the safe-socket test load: a delay is fine, a wrong, lost, extra or
 * duplicated byte, an error or an early end-of-file is not.
 *
 * Rank 0 listens on its RADIC_PEERS entry; every other rank opens --conns
 * connections to it. On every connection both directions stream at once:
 * each side writes --bytes bytes of a pseudo-random stream, in writes of
 * random sizes (1 B to 256 KiB), then shuts its sending side down
 * (shutdown SHUT_WR); it reads the other direction, checks every byte
 * against the expected stream, and expects end-of-file right after the
 * last one. Only then is the connection closed.
 *
 * Connection numbers: connection c (0 <= c < K) of rank r is number
 * (r-1)*K + c. Direction 0 runs from the connecting rank to rank 0,
 * direction 1 back. Byte o of a direction's stream is byte o%8 (little
 * end first) of splitmix64(key, o/8), where
 *   key = mix64(mix64(seed ^ STREAM_SALT) + (2*conn + dir) * GOLDEN)
 *   splitmix64(key, i) = mix64(key + (i+1) * GOLDEN)
 * (mix64 is splitmix64's finalizer, common.c). The digest a rank prints is
 * FNV-1a over, for each of its connections in number order, the connection
 * number and the FNV-1a hash of the bytes it received on it (each as 8
 * bytes, little end first). It depends only on --seed, --conns, --bytes and
 * the rank count: not on --mode, the write sizes, timing or the network.
 *
 * Modes: poll (default; one thread, non-blocking sockets, send/recv), epoll
 * (one thread, level-triggered epoll, non-blocking writev/readv), epoll-et
 * (edge-triggered: each direction goes on until EAGAIN after an edge),
 * epoll-oneshot (EPOLLONESHOT: a connection re-arms only after one more
 * epoll_wait has gone by, and a report for a disarmed registration is an
 * error) and blocking (a sender and a receiver thread per connection,
 * blocking write/read).
 *
 * --listen and --connect run one side of a two-process stream without
 * RADIC_PEERS: --listen ADDR acts as rank 0 (one peer), --connect ADDR as
 * rank 1. With --server-first the accepting side speaks first: it writes
 * an 8-byte greeting on each connection before reading anything, and the
 * connecting side writes nothing before it has read it.
 *
 *   stream [--conns K] [--bytes N] [--mode MODE] [--seed S]
 *          [--rate R] [--progress SEC] [--server-first] [--max-idle-out N]
 *          [--listen IP:PORT | --connect IP:PORT]
 *
 * Sizes and rates take K, M and G suffixes (KiB, MiB, GiB). --rate caps
 * what a rank sends, per direction, summed over its connections (bytes per
 * second; default: no cap); a rank that fell behind its rate (a stall)
 * catches up at full speed.
 *
 * Output: progress on stderr every --progress seconds (default 1; 0: none),
 * "stream: rank R: X/Y MiB received, S/Y MiB sent"; at the end one line on
 * stdout, "stream ok rank R conns K bytes N digest HEX".
 *
 * Exit status: 0 success; 1 setup failure (environment, connection setup);
 * 2 usage; 3 wrong data ("stream: MISMATCH conn C dir D at offset O: got
 * 0x.. want 0x..", also for bytes past the end); 4 a connection failed or
 * ended early ("stream: conn C: <error> after O bytes"), or epoll reported
 * a disarmed one-shot registration.
 */
#include "common.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define GOLDEN 0x9e3779b97f4a7c15ULL
#define STREAM_SALT 0x53545245414d0001ULL
#define MAXCHUNK (256 * 1024)
#define GREETING "STREAM!\n"

enum { MODE_POLL, MODE_EPOLL, MODE_EPOLL_ET, MODE_EPOLL_ONESHOT, MODE_BLOCKING };
enum { EXIT_SETUP = 1, EXIT_USAGE = 2, EXIT_MISMATCH = 3, EXIT_CONN = 4 };

struct conn {
	int fd;
	uint32_t id;
	int txdir, rxdir;
	uint64_t txkey, rxkey;
	uint64_t txrng, rxrng; /* write and read size generators */
	uint64_t sent;         /* bytes written */
	uint64_t rcvd;         /* bytes read and checked */
	uint64_t hash;         /* FNV-1a of the bytes read */
	unsigned char *txbuf;  /* the write in progress: [txpos, txend) left */
	size_t txpos, txend;
	int txshut, rxeof, closed;
	uint32_t events; /* epoll: the interest registered (UINT32_MAX: none yet) */
	int rxready, txready; /* epoll-et: an edge came, EAGAIN has not */
	int armed, cooldown;  /* epoll-oneshot: armed; waits to sit out disarmed */
	uint64_t idle_out;    /* epoll: writable reports a write answered EAGAIN */
};

static uint64_t nbytes = 1ULL << 30;
static uint64_t seed = 1;
static double rate; /* bytes/s per connection; 0: no cap */
static double progress_every = 1;
static int mode = MODE_POLL;
static int server_first;
static int role_rank;
static uint64_t max_idle_out; /* epoll: --max-idle-out (0: no limit) */
static double t_start;

static struct conn *conns;
static int nconns;

/* ---- the streams ---- */

static uint64_t stream_key(uint32_t conn, int dir)
{
	return mix64(mix64(seed ^ STREAM_SALT) + ((uint64_t)conn * 2 + (uint64_t)dir) * GOLDEN);
}

static uint64_t stream_word(uint64_t key, uint64_t i)
{
	return mix64(key + (i + 1) * GOLDEN);
}

/* Fills p with bytes [off, off+n) of the stream of key. */
static void gen(uint64_t key, uint64_t off, unsigned char *p, size_t n)
{
	size_t k = 0;
	while (k < n && ((off + k) & 7)) {
		p[k] = (unsigned char)(stream_word(key, (off + k) >> 3) >> (8 * ((off + k) & 7)));
		k++;
	}
	for (; k + 8 <= n; k += 8) {
		uint64_t w = stream_word(key, (off + k) >> 3);
		int b;
		for (b = 0; b < 8; b++)
			p[k + (size_t)b] = (unsigned char)(w >> (8 * b));
	}
	for (; k < n; k++)
		p[k] = (unsigned char)(stream_word(key, (off + k) >> 3) >> (8 * ((off + k) & 7)));
}

/* The next value of a splitmix64 sequence. */
static uint64_t next_rand(uint64_t *state)
{
	*state += GOLDEN;
	return mix64(*state);
}

/* A size from 1 to 256 KiB, log-uniform so that small and large ones both
 * come often: 2^k with k uniform in 0..18, then uniform in 1..2^k. */
static size_t next_size(uint64_t *state)
{
	uint64_t x = next_rand(state);
	unsigned k = (unsigned)(x % 19);
	return 1 + (size_t)((x >> 8) & ((1ULL << k) - 1));
}

/* ---- messages ---- */

/* Writes one line to stderr with a single write(): a line never mixes with
 * another thread's or the preloaded library's. */
static void vsay(const char *fmt, va_list ap)
{
	char buf[1024];
	int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
	if (n < 0)
		return;
	if ((size_t)n > sizeof buf - 2)
		n = (int)sizeof buf - 2;
	buf[n++] = '\n';
	while (write(2, buf, (size_t)n) < 0 && errno == EINTR)
		;
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsay(fmt, ap);
	va_end(ap);
}

/* ---- failures ---- */

static int failing;
static pthread_mutex_t fail_mu = PTHREAD_MUTEX_INITIALIZER;

/* Prints one failure line and exits; a second failing thread waits for the
 * first one's exit instead of printing too. */
static void fail_exit(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
static void fail_exit(int code, const char *fmt, ...)
{
	va_list ap;
	pthread_mutex_lock(&fail_mu);
	if (failing)
		for (;;)
			pause();
	failing = 1;
	fflush(stdout);
	va_start(ap, fmt);
	vsay(fmt, ap);
	va_end(ap);
	exit(code);
}

static void conn_fail(const struct conn *c, const char *what, int err, uint64_t at) __attribute__((noreturn));
static void conn_fail(const struct conn *c, const char *what, int err, uint64_t at)
{
	fail_exit(EXIT_CONN, "stream: conn %u: %s: %s after %" PRIu64 " bytes", c->id, what, strerror(err), at);
}

/* Checks n received bytes at offset c->rcvd against the stream; scratch
 * holds at least n bytes. */
static void check(struct conn *c, const unsigned char *p, size_t n, unsigned char *scratch)
{
	size_t i;
	gen(c->rxkey, c->rcvd, scratch, n);
	if (memcmp(p, scratch, n) == 0)
		return;
	for (i = 0; i < n && p[i] == scratch[i]; i++)
		;
	fail_exit(EXIT_MISMATCH, "stream: MISMATCH conn %u dir %d at offset %" PRIu64 ": got 0x%02x want 0x%02x", c->id,
		  c->rxdir, c->rcvd + i, p[i], scratch[i]);
}

/* Accounts for n bytes read into p: checks them, hashes them. Bytes past
 * the end of the stream are a mismatch too (duplicated data). */
static void consumed(struct conn *c, const unsigned char *p, size_t n, unsigned char *scratch)
{
	size_t ok = n;
	if (c->rcvd + n > nbytes)
		ok = (size_t)(nbytes - c->rcvd);
	check(c, p, ok, scratch);
	if (ok < n)
		fail_exit(EXIT_MISMATCH, "stream: MISMATCH conn %u dir %d at offset %" PRIu64 ": got 0x%02x want end-of-file (%zu bytes too many)",
			  c->id, c->rxdir, nbytes, p[ok], n - ok);
	c->hash = fnv1a(c->hash, p, n);
	__atomic_store_n(&c->rcvd, c->rcvd + n, __ATOMIC_RELAXED);
}

/* ---- rate ---- */

/* The time at which c may start a new write (0: now). */
static double tx_wake(const struct conn *c)
{
	double at;
	if (rate <= 0 || c->sent < MAXCHUNK)
		return 0;
	at = t_start + (double)(c->sent - MAXCHUNK) / rate;
	return at > now_s() ? at : 0;
}

/* ---- one thread, non-blocking (poll, epoll) ---- */

static unsigned char *rxbuf, *scratch;

static int epoll_mode(void)
{
	return mode == MODE_EPOLL || mode == MODE_EPOLL_ET || mode == MODE_EPOLL_ONESHOT;
}

/* One write on c: starts a new chunk when the last one is done. Returns
 * after the write (partial or not: 1) or EAGAIN (0). */
static int tx_step(struct conn *c)
{
	ssize_t w;
	if (c->txpos == c->txend) {
		size_t n = next_size(&c->txrng);
		if (n > nbytes - c->sent)
			n = (size_t)(nbytes - c->sent);
		gen(c->txkey, c->sent, c->txbuf, n);
		c->txpos = 0;
		c->txend = n;
	}
	if (c->txend > c->txpos) {
		size_t len = c->txend - c->txpos;
		if (epoll_mode()) {
			/* Two pieces, split at a random point. */
			size_t cut = (size_t)(next_rand(&c->txrng) % (len + 1));
			struct iovec iov[2] = {{c->txbuf + c->txpos, cut}, {c->txbuf + c->txpos + cut, len - cut}};
			w = writev(c->fd, iov, 2);
		} else {
			w = send(c->fd, c->txbuf + c->txpos, len, MSG_NOSIGNAL);
		}
		if (w < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			if (errno == EINTR)
				return 1;
			conn_fail(c, "write", errno, c->sent);
		}
		c->txpos += (size_t)w;
		__atomic_store_n(&c->sent, c->sent + (uint64_t)w, __ATOMIC_RELAXED);
	}
	if (c->sent == nbytes && c->txpos == c->txend) {
		if (shutdown(c->fd, SHUT_WR) < 0)
			conn_fail(c, "shutdown", errno, c->sent);
		c->txshut = 1;
	}
	return 1;
}

/* One read on c: 1 if it read bytes, 0 on EAGAIN or end-of-file. */
static int rx_step(struct conn *c)
{
	size_t n = next_size(&c->rxrng);
	ssize_t r;
	if (epoll_mode()) {
		size_t cut = (size_t)(next_rand(&c->rxrng) % (n + 1));
		struct iovec iov[2] = {{rxbuf, cut}, {rxbuf + cut, n - cut}};
		r = readv(c->fd, iov, 2);
	} else {
		r = recv(c->fd, rxbuf, n, 0);
	}
	if (r < 0) {
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return 0;
		if (errno == EINTR)
			return 1;
		conn_fail(c, "read", errno, c->rcvd);
	}
	if (r == 0) {
		if (c->rcvd < nbytes)
			fail_exit(EXIT_CONN, "stream: conn %u: unexpected end-of-file after %" PRIu64 " bytes (want %" PRIu64 ")",
				  c->id, c->rcvd, nbytes);
		c->rxeof = 1;
		return 0;
	}
	consumed(c, rxbuf, (size_t)r, scratch);
	return 1;
}

static void progress(int force);

static void finish_conn(struct conn *c, int epfd, int *active)
{
	if (c->closed || !c->txshut || !c->rxeof)
		return;
	if (epfd >= 0 && epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL) < 0)
		die("epoll_ctl DEL: %s", strerror(errno));
	close(c->fd);
	c->closed = 1;
	(*active)--;
}

/* What c waits for now, as poll events; *wake is lowered to when a
 * throttled sender may go on. */
static short wanted(const struct conn *c, double *wake)
{
	short ev = 0;
	if (!c->rxeof)
		ev |= POLLIN;
	if (!c->txshut) {
		double at = c->txpos == c->txend ? tx_wake(c) : 0;
		if (at == 0)
			ev |= POLLOUT;
		else if (at < *wake)
			*wake = at;
	}
	return ev;
}

static int timeout_ms(double wake)
{
	double d = wake - now_s();
	if (d <= 0)
		return 0;
	return (int)(d * 1000) + 1;
}

static double next_progress;

static void run_poll(void)
{
	struct pollfd *pfd = calloc((size_t)nconns, sizeof *pfd);
	int *idx = calloc((size_t)nconns, sizeof *idx);
	int active = nconns, i;
	if (!pfd || !idx)
		die("out of memory");
	while (active > 0) {
		double wake = next_progress > 0 ? next_progress : now_s() + 3600;
		int n = 0, k;
		for (i = 0; i < nconns; i++) {
			struct conn *c = &conns[i];
			if (c->closed)
				continue;
			pfd[n].fd = c->fd;
			pfd[n].events = wanted(c, &wake);
			pfd[n].revents = 0;
			idx[n++] = i;
		}
		k = poll(pfd, (nfds_t)n, timeout_ms(wake));
		if (k < 0 && errno != EINTR)
			die("poll: %s", strerror(errno));
		for (i = 0; k > 0 && i < n; i++) {
			struct conn *c = &conns[idx[i]];
			short re = pfd[i].revents;
			if (re & POLLNVAL)
				die("poll: conn %u: fd %d is not open", c->id, c->fd);
			if ((re & (POLLIN | POLLERR | POLLHUP)) && !c->rxeof)
				rx_step(c);
			/* An error or hang-up goes to the writer too, throttled
			 * or not: the write reports it. */
			if (!c->txshut && (((re & POLLOUT) && (pfd[i].events & POLLOUT)) || (re & (POLLERR | POLLHUP))))
				tx_step(c);
			finish_conn(c, -1, &active);
		}
		progress(0);
	}
	free(pfd);
	free(idx);
}

/* ---- epoll: what the three epoll modes share ---- */

static int ep_create(void)
{
	int epfd = epoll_create1(EPOLL_CLOEXEC);
	if (epfd < 0)
		die("epoll_create1: %s", strerror(errno));
	return epfd;
}

/* Registers connection i for want (plus flags), or changes its interest. */
static void ep_interest(int epfd, int i, uint32_t want, uint32_t flags)
{
	struct conn *c = &conns[i];
	struct epoll_event e = {.events = want | flags, .data.u32 = (uint32_t)i};
	if (epoll_ctl(epfd, c->events == UINT32_MAX ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, c->fd, &e) < 0)
		die("epoll_ctl: %s", strerror(errno));
	c->events = want;
}

/* Waits until wake at most; 0 on EINTR. */
static int ep_wait(int epfd, struct epoll_event *evs, int max, double wake)
{
	int k = epoll_wait(epfd, evs, max, timeout_ms(wake));
	if (k < 0 && errno != EINTR)
		die("epoll_wait: %s", strerror(errno));
	return k < 0 ? 0 : k;
}

static void run_epoll(void)
{
	struct epoll_event evs[64];
	int epfd = ep_create(), active = nconns, i;
	while (active > 0) {
		double wake = next_progress > 0 ? next_progress : now_s() + 3600;
		int k;
		/* Keep each connection's interest what it waits for now
		 * (level-triggered: a throttled sender must not ask for
		 * EPOLLOUT, or epoll_wait would spin). */
		for (i = 0; i < nconns; i++) {
			struct conn *c = &conns[i];
			short ev;
			uint32_t want;
			if (c->closed)
				continue;
			ev = wanted(c, &wake);
			want = (ev & POLLIN ? EPOLLIN : 0) | (ev & POLLOUT ? EPOLLOUT : 0);
			if (c->events != want)
				ep_interest(epfd, i, want, 0);
		}
		k = ep_wait(epfd, evs, 64, wake);
		for (i = 0; i < k; i++) {
			struct conn *c = &conns[evs[i].data.u32];
			uint32_t re = evs[i].events;
			if (c->closed)
				continue;
			if ((re & (EPOLLIN | EPOLLERR | EPOLLHUP)) && !c->rxeof)
				rx_step(c);
			if (!c->txshut && (((re & EPOLLOUT) && (c->events & EPOLLOUT)) || (re & (EPOLLERR | EPOLLHUP))) &&
			    !tx_step(c) && (re & EPOLLOUT) && max_idle_out > 0 && ++c->idle_out > max_idle_out)
				fail_exit(EXIT_CONN, "stream: conn %u: epoll_wait said writable %" PRIu64 " times when a write took nothing (EAGAIN): a level-triggered writer spins",
					  c->id, c->idle_out);
			finish_conn(c, epfd, &active);
		}
		progress(0);
	}
	close(epfd);
}

/* Reads c until EAGAIN or end-of-file; returns 0 then. */
static int drain_rx(struct conn *c)
{
	while (!c->rxeof && rx_step(c))
		;
	return 0;
}

/* Writes c until EAGAIN (0) or, for a throttled sender, until its wake
 * time (1: there is more to write then; *wake is lowered to it). */
static int drain_tx(struct conn *c, double *wake)
{
	while (!c->txshut) {
		double at = c->txpos == c->txend ? tx_wake(c) : 0;
		if (at > 0) {
			if (at < *wake)
				*wake = at;
			return 1;
		}
		if (!tx_step(c))
			return 0;
	}
	return 0;
}

/* Edge-triggered: each connection is registered once for both directions;
 * an edge means "try again", so each direction then goes on until EAGAIN
 * (or, for a throttled sender, until its wake time). */
static void run_epoll_et(void)
{
	struct epoll_event evs[64];
	int epfd = ep_create(), active = nconns, i;
	for (i = 0; i < nconns; i++) {
		ep_interest(epfd, i, EPOLLIN | EPOLLOUT, EPOLLET);
		conns[i].rxready = conns[i].txready = 1;
	}
	while (active > 0) {
		double wake = next_progress > 0 ? next_progress : now_s() + 3600;
		int k;
		for (i = 0; i < nconns; i++) {
			struct conn *c = &conns[i];
			if (c->closed)
				continue;
			if (c->rxready)
				c->rxready = drain_rx(c);
			if (c->txready)
				c->txready = drain_tx(c, &wake);
			finish_conn(c, epfd, &active);
		}
		if (active == 0)
			break;
		k = ep_wait(epfd, evs, 64, wake);
		for (i = 0; i < k; i++) {
			struct conn *c = &conns[evs[i].data.u32];
			uint32_t re = evs[i].events;
			if (re & (EPOLLIN | EPOLLERR | EPOLLHUP))
				c->rxready = 1;
			if (re & (EPOLLOUT | EPOLLERR | EPOLLHUP))
				c->txready = 1;
		}
		progress(0);
	}
	close(epfd);
}

/* One-shot: a report disarms its registration until the program re-arms it
 * (EPOLL_CTL_MOD); each report is served as an edge is (until EAGAIN). A
 * connection re-arms only after one more epoll_wait has gone by, so
 * registrations sit disarmed much of the time, and a report for one is an
 * error: whatever lies under the program (a preloaded library moving
 * registrations across a reconnection or a replay, say) must not re-arm
 * them behind its back. */
static void run_epoll_oneshot(void)
{
	struct epoll_event evs[64];
	int epfd = ep_create(), active = nconns, i;
	while (active > 0) {
		double wake = next_progress > 0 ? next_progress : now_s() + 3600;
		int k, cooling = 0;
		for (i = 0; i < nconns; i++) {
			struct conn *c = &conns[i];
			uint32_t want;
			if (c->closed)
				continue;
			/* Writable whether throttled or not: a socket that can
			 * take bytes is ready, so a registration re-armed behind
			 * the program's back is reported at its next wait. */
			want = (c->rxeof ? 0 : EPOLLIN) | (c->txshut ? 0 : EPOLLOUT);
			if (c->cooldown > 0) {
				cooling = 1;
				continue;
			}
			if (c->armed && c->events == want)
				continue;
			ep_interest(epfd, i, want, EPOLLONESHOT);
			c->armed = 1;
		}
		/* A wait with connections cooling only looks, or, when the
		 * stream is rate-capped and has time to spare, naps 1 ms:
		 * registrations then sit disarmed most of the time. */
		if (cooling)
			wake = rate > 0 ? now_s() + 0.001 : 0;
		k = ep_wait(epfd, evs, 64, wake);
		for (i = 0; i < nconns; i++)
			if (conns[i].cooldown > 0)
				conns[i].cooldown--;
		for (i = 0; i < k; i++) {
			struct conn *c = &conns[evs[i].data.u32];
			uint32_t re = evs[i].events;
			if (!c->armed)
				fail_exit(EXIT_CONN, "stream: conn %u: epoll_wait reported it (events 0x%x) while its EPOLLONESHOT registration was disarmed",
					  c->id, re);
			c->armed = 0;
			c->cooldown = 1;
			if (re & (EPOLLIN | EPOLLERR | EPOLLHUP))
				drain_rx(c);
			if (((re & EPOLLOUT) && (c->events & EPOLLOUT)) || (re & (EPOLLERR | EPOLLHUP)))
				drain_tx(c, &wake);
			finish_conn(c, epfd, &active);
		}
		progress(0);
	}
	close(epfd);
}

/* ---- blocking: two threads per connection ---- */

static int threads_done;

static void *sender(void *arg)
{
	struct conn *c = arg;
	while (c->sent < nbytes) {
		size_t n = next_size(&c->txrng), off = 0;
		double at = tx_wake(c);
		if (at > 0) {
			double d = at - now_s();
			if (d > 0) {
				struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
				nanosleep(&ts, NULL);
			}
		}
		if (n > nbytes - c->sent)
			n = (size_t)(nbytes - c->sent);
		gen(c->txkey, c->sent, c->txbuf, n);
		while (off < n) {
			ssize_t w = write(c->fd, c->txbuf + off, n - off);
			if (w < 0 && errno == EINTR)
				continue;
			if (w < 0)
				conn_fail(c, "write", errno, c->sent);
			off += (size_t)w;
			__atomic_store_n(&c->sent, c->sent + (uint64_t)w, __ATOMIC_RELAXED);
		}
	}
	if (shutdown(c->fd, SHUT_WR) < 0)
		conn_fail(c, "shutdown", errno, c->sent);
	__atomic_add_fetch(&threads_done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void *receiver(void *arg)
{
	struct conn *c = arg;
	unsigned char *buf = malloc(MAXCHUNK), *exp = malloc(MAXCHUNK);
	if (!buf || !exp)
		die("out of memory");
	for (;;) {
		size_t n = next_size(&c->rxrng);
		ssize_t r = read(c->fd, buf, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			conn_fail(c, "read", errno, c->rcvd);
		if (r == 0) {
			if (c->rcvd < nbytes)
				fail_exit(EXIT_CONN, "stream: conn %u: unexpected end-of-file after %" PRIu64 " bytes (want %" PRIu64 ")",
					  c->id, c->rcvd, nbytes);
			break;
		}
		consumed(c, buf, (size_t)r, exp);
	}
	c->rxeof = 1;
	free(buf);
	free(exp);
	__atomic_add_fetch(&threads_done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void run_blocking(void)
{
	pthread_t *th = calloc((size_t)nconns * 2, sizeof *th);
	pthread_attr_t attr;
	int i;
	if (!th)
		die("out of memory");
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 256 * 1024);
	for (i = 0; i < nconns; i++) {
		int e;
		if ((e = pthread_create(&th[2 * i], &attr, sender, &conns[i])) != 0 ||
		    (e = pthread_create(&th[2 * i + 1], &attr, receiver, &conns[i])) != 0)
			die("pthread_create: %s", strerror(e));
	}
	while (__atomic_load_n(&threads_done, __ATOMIC_ACQUIRE) < 2 * nconns) {
		struct timespec ts = {0, 20 * 1000 * 1000};
		nanosleep(&ts, NULL);
		progress(0);
	}
	for (i = 0; i < 2 * nconns; i++)
		pthread_join(th[i], NULL);
	for (i = 0; i < nconns; i++)
		close(conns[i].fd);
	pthread_attr_destroy(&attr);
	free(th);
}

/* ---- progress ---- */

static void progress(int force)
{
	uint64_t r = 0, s = 0;
	double now, total;
	int i;
	if (progress_every <= 0 && !force)
		return;
	now = now_s();
	if (!force && now < next_progress)
		return;
	next_progress = now + progress_every;
	for (i = 0; i < nconns; i++) {
		r += __atomic_load_n(&conns[i].rcvd, __ATOMIC_RELAXED);
		s += __atomic_load_n(&conns[i].sent, __ATOMIC_RELAXED);
	}
	total = (double)nbytes * nconns / 1048576.0;
	say("stream: rank %d: %.1f/%.1f MiB received, %.1f/%.1f MiB sent", role_rank, (double)r / 1048576.0,
		total, (double)s / 1048576.0, total);
}

/* ---- set-up ---- */

static uint64_t parse_size(const char *s, const char *flag)
{
	char *end;
	unsigned long long v;
	uint64_t mul = 1;
	errno = 0;
	if (*s < '0' || *s > '9')
		goto bad;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		goto bad;
	switch (*end) {
	case 'k':
	case 'K':
		mul = 1ULL << 10;
		break;
	case 'm':
	case 'M':
		mul = 1ULL << 20;
		break;
	case 'g':
	case 'G':
		mul = 1ULL << 30;
		break;
	}
	if (mul > 1) {
		end++;
		if (*end == 'i')
			end++;
		if (*end == 'B')
			end++;
	}
	if (*end || v > UINT64_MAX / mul)
		goto bad;
	return v * mul;
bad:
	fprintf(stderr, "stream: %s %s: want a number of bytes, optionally with a K, M or G suffix (e.g. 256M)\n", flag, s);
	exit(EXIT_USAGE);
}

static void parse_hostport(const char *s, const char *flag, struct sockaddr_in *sa)
{
	char buf[64], *colon, *end;
	long port;
	if (strlen(s) >= sizeof buf)
		goto bad;
	strcpy(buf, s);
	colon = strrchr(buf, ':');
	if (!colon)
		goto bad;
	*colon = 0;
	memset(sa, 0, sizeof *sa);
	sa->sin_family = AF_INET;
	if (inet_pton(AF_INET, buf, &sa->sin_addr) != 1)
		goto bad;
	errno = 0;
	port = strtol(colon + 1, &end, 10);
	if (errno || *end || end == colon + 1 || port < 1 || port > 65535)
		goto bad;
	sa->sin_port = htons((uint16_t)port);
	return;
bad:
	fprintf(stderr, "stream: %s %s: want IPv4:PORT, e.g. 10.77.0.1:20000\n", flag, s);
	exit(EXIT_USAGE);
}

static void usage(const char *why)
{
	if (why)
		fprintf(stderr, "stream: %s\n", why);
	fprintf(stderr,
		"usage: stream [--conns K] [--bytes N] [--mode MODE] [--seed S]\n"
		"              [--rate R] [--progress SEC] [--server-first] [--max-idle-out N]\n"
		"              [--listen IP:PORT | --connect IP:PORT]\n"
		"  --conns K       connections from each rank to rank 0 (default 1)\n"
		"  --bytes N       bytes each side sends on each connection (default 1G; K/M/G suffixes)\n"
		"  --mode M        poll (default), epoll (level-triggered), epoll-et (edge-triggered),\n"
		"                  epoll-oneshot or blocking (two threads per connection)\n"
		"  --seed S        stream seed (default 1)\n"
		"  --rate R        cap on the bytes/s a rank sends, over all its connections (default none)\n"
		"  --progress SEC  progress on stderr every SEC seconds (default 1; 0: none)\n"
		"  --server-first  the accepting side writes a greeting before reading anything\n"
		"  --max-idle-out N  epoll: fail once a connection was reported writable N times\n"
		"                  and a write took nothing (0, the default: no limit)\n"
		"  --listen ADDR   be rank 0 of a two-process stream, listening on ADDR (no RADIC_PEERS)\n"
		"  --connect ADDR  be rank 1 of a two-process stream, connecting to ADDR (no RADIC_PEERS)\n"
		"Ranks come from RADIC_RANK, RADIC_SIZE and RADIC_PEERS (radic run). Exit status: 0 ok,\n"
		"1 set-up failure, 2 usage, 3 wrong/lost/extra data, 4 connection error or early end-of-file.\n");
	exit(EXIT_USAGE);
}

static int retryable(int e)
{
	return e == ECONNREFUSED || e == ETIMEDOUT || e == EHOSTUNREACH || e == ENETUNREACH || e == ECONNRESET ||
	       e == EAGAIN || e == EINTR || e == EADDRNOTAVAIL;
}

/* Connects to sa, retrying while the listener is not up yet. */
static int dial(const struct sockaddr_in *sa, double timeout_s)
{
	double deadline = now_s() + timeout_s;
	useconds_t backoff = 10000;
	for (;;) {
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), e;
		if (fd < 0)
			die("socket: %s", strerror(errno));
		if (connect(fd, (const struct sockaddr *)sa, sizeof *sa) == 0)
			return fd;
		e = errno;
		close(fd);
		if (!retryable(e) || now_s() > deadline) {
			char a[INET_ADDRSTRLEN];
			inet_ntop(AF_INET, &sa->sin_addr, a, sizeof a);
			die("connect to %s:%d: %s (gave up after %.0f s)", a, ntohs(sa->sin_port), strerror(e), timeout_s);
		}
		usleep(backoff);
		if (backoff < 200000)
			backoff *= 2;
	}
}

static void init_conn(struct conn *c, int fd, uint32_t id, int is_server)
{
	c->fd = fd;
	c->id = id;
	c->txdir = is_server ? 1 : 0;
	c->rxdir = 1 - c->txdir;
	c->txkey = stream_key(id, c->txdir);
	c->rxkey = stream_key(id, c->rxdir);
	c->txrng = c->txkey ^ 0x7478737a7478737aULL;
	c->rxrng = c->rxkey ^ 0x7278737a7278737aULL;
	c->hash = FNV_OFFSET;
	c->events = UINT32_MAX;
	c->txbuf = malloc(MAXCHUNK);
	if (!c->txbuf)
		die("out of memory");
}

/* The connecting side: k connections to rank 0 at sa, numbered from base. */
static void connect_all(const struct sockaddr_in *sa, int rank, int k, uint32_t base)
{
	int i;
	for (i = 0; i < k; i++) {
		int fd = dial(sa, 60);
		uint32_t hello[2] = {htonl((uint32_t)rank), htonl((uint32_t)i)};
		if (server_first) {
			char g[sizeof GREETING - 1];
			read_full(fd, g, sizeof g, "greeting");
			if (memcmp(g, GREETING, sizeof g) != 0)
				die("connection %d: the server's greeting is not \"STREAM!\\n\"", i);
		}
		write_full(fd, hello, sizeof hello, "hello");
		init_conn(&conns[i], fd, base + (uint32_t)i, 0);
	}
}

/* The accepting side: (ranks-1)*k connections, placed by their number. */
static void accept_all(int lfd, int ranks, int k)
{
	int i;
	for (i = 0; i < nconns; i++) {
		uint32_t hello[2], from, idx, id;
		int fd;
		do
			fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		while (fd < 0 && (errno == EINTR || errno == ECONNABORTED));
		if (fd < 0)
			die("accept: %s", strerror(errno));
		if (server_first)
			write_full(fd, GREETING, sizeof GREETING - 1, "greeting");
		read_full(fd, hello, sizeof hello, "hello");
		from = ntohl(hello[0]);
		idx = ntohl(hello[1]);
		if (from < 1 || from >= (uint32_t)ranks || idx >= (uint32_t)k)
			die("unexpected hello: rank %u connection %u (want ranks 1..%d, connections 0..%d)", from, idx, ranks - 1, k - 1);
		id = (from - 1) * (uint32_t)k + idx;
		if (conns[id].txbuf)
			die("connection %u of rank %u arrived twice", idx, from);
		init_conn(&conns[id], fd, id, 1);
	}
}

int main(int argc, char **argv)
{
	struct job j;
	struct sockaddr_in addr;
	const char *listen_at = NULL, *connect_to = NULL;
	int k = 1, i, ranks;
	uint64_t digest = FNV_OFFSET, total_rate = 0;
	double took;

	for (i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		char *end;
		if (!strcmp(a, "--server-first")) {
			server_first = 1;
			continue;
		}
		if (!strcmp(a, "-h") || !strcmp(a, "--help"))
			usage(NULL);
		if (strncmp(a, "--", 2) != 0) {
			fprintf(stderr, "stream: unexpected argument %s\n", a);
			usage(NULL);
		}
		if (strcmp(a, "--conns") && strcmp(a, "--bytes") && strcmp(a, "--rate") && strcmp(a, "--seed") &&
		    strcmp(a, "--progress") && strcmp(a, "--mode") && strcmp(a, "--listen") && strcmp(a, "--connect") &&
		    strcmp(a, "--max-idle-out")) {
			fprintf(stderr, "stream: unknown flag %s\n", a);
			usage(NULL);
		}
		if (!v) {
			fprintf(stderr, "stream: %s needs a value\n", a);
			usage(NULL);
		}
		i++;
		if (!strcmp(a, "--conns")) {
			long n = strtol(v, &end, 10);
			if (*end || end == v || n < 1 || n > 4096)
				usage("--conns: want 1..4096");
			k = (int)n;
		} else if (!strcmp(a, "--bytes")) {
			nbytes = parse_size(v, a);
		} else if (!strcmp(a, "--rate")) {
			total_rate = parse_size(v, a);
		} else if (!strcmp(a, "--seed")) {
			errno = 0;
			seed = strtoull(v, &end, 0);
			if (errno || *end || end == v)
				usage("--seed: want an unsigned number");
		} else if (!strcmp(a, "--progress")) {
			progress_every = strtod(v, &end);
			if (*end || end == v || progress_every < 0)
				usage("--progress: want seconds >= 0");
		} else if (!strcmp(a, "--mode")) {
			if (!strcmp(v, "poll"))
				mode = MODE_POLL;
			else if (!strcmp(v, "epoll"))
				mode = MODE_EPOLL;
			else if (!strcmp(v, "epoll-et"))
				mode = MODE_EPOLL_ET;
			else if (!strcmp(v, "epoll-oneshot"))
				mode = MODE_EPOLL_ONESHOT;
			else if (!strcmp(v, "blocking"))
				mode = MODE_BLOCKING;
			else
				usage("--mode: want poll, epoll, epoll-et, epoll-oneshot or blocking");
		} else if (!strcmp(a, "--max-idle-out")) {
			errno = 0;
			max_idle_out = strtoull(v, &end, 0);
			if (errno || *end || end == v)
				usage("--max-idle-out: want an unsigned number");
		} else if (!strcmp(a, "--listen")) {
			listen_at = v;
		} else {
			connect_to = v;
		}
	}
	if (listen_at && connect_to)
		usage("--listen and --connect exclude each other");
	signal(SIGPIPE, SIG_IGN); /* blocking mode writes with write(): EPIPE, not a signal */

	if (listen_at || connect_to) {
		/* One side of a two-process stream. */
		progname = "stream";
		j.size = ranks = 2;
		j.rank = listen_at ? 0 : 1;
		j.peers = calloc(2, sizeof *j.peers);
		if (!j.peers)
			die("out of memory");
		parse_hostport(listen_at ? listen_at : connect_to, listen_at ? "--listen" : "--connect", &j.peers[0]);
		myrank = j.rank;
	} else {
		job_init(&j, "stream");
		ranks = j.size;
		if (ranks < 2)
			die("stream needs two ranks or more (radic run --np 2), or --listen/--connect");
	}
	role_rank = j.rank;
	nconns = j.rank == 0 ? (ranks - 1) * k : k;
	conns = calloc((size_t)nconns, sizeof *conns);
	rxbuf = malloc(MAXCHUNK);
	scratch = malloc(MAXCHUNK);
	if (!conns || !rxbuf || !scratch)
		die("out of memory");
	addr = j.peers[0];
	if (j.rank == 0) {
		int lfd = job_listen(&j);
		accept_all(lfd, ranks, k);
		close(lfd);
	} else {
		connect_all(&addr, j.rank, k, (uint32_t)(j.rank - 1) * (uint32_t)k);
	}
	if (total_rate > 0)
		rate = (double)total_rate / nconns;
	if (mode != MODE_BLOCKING)
		for (i = 0; i < nconns; i++)
			set_nonblock(conns[i].fd);

	t_start = now_s();
	next_progress = progress_every > 0 ? t_start + progress_every : 0;
	if (mode == MODE_BLOCKING)
		run_blocking();
	else if (mode == MODE_EPOLL)
		run_epoll();
	else if (mode == MODE_EPOLL_ET)
		run_epoll_et();
	else if (mode == MODE_EPOLL_ONESHOT)
		run_epoll_oneshot();
	else
		run_poll();
	took = now_s() - t_start;

	for (i = 0; i < nconns; i++) {
		unsigned char b[16];
		int q;
		for (q = 0; q < 8; q++) {
			b[q] = (unsigned char)((uint64_t)conns[i].id >> (8 * q));
			b[8 + q] = (unsigned char)(conns[i].hash >> (8 * q));
		}
		digest = fnv1a(digest, b, sizeof b);
	}
	if (progress_every > 0)
		progress(1);
	say("stream: rank %d: done: %d connections, %.1f MiB each way in %.2f s (%.1f MiB/s received)", role_rank,
		nconns, (double)nbytes * nconns / 1048576.0, took, took > 0 ? (double)nbytes * nconns / 1048576.0 / took : 0.0);
	printf("stream ok rank %d conns %d bytes %" PRIu64 " digest %016" PRIx64 "\n", role_rank, nconns, nbytes, digest);
	fflush(stdout);
	return 0;
}
