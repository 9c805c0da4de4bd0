/* logcost: what receiver-based pessimistic logging costs a receiver, for
 * the two designs issue 10 allows, measured side by side on one host (the
 * choice of the shim's logging edge; test/safebench BenchmarkLogCost).
 *
 *   logcost MODE lat [--iters N]      MODE: bare, sync, ring, copy or tee
 *   logcost MODE bw  [--bytes N] [--chunk C]
 *
 * Four processes: the app's receiver R and its peer S (a TCP connection
 * over loopback, TCP_NODELAY, blocking), a logger L (the node's radicd)
 * and a protector P (the radicd on another node; L ships to it over TCP and
 * P acknowledges cumulative offsets). Only R logs what it receives: under
 * radic both ends of a ping-pong log, so the added round-trip time there
 * is about twice what lat shows here.
 *
 *   bare  R receives and goes on.
 *   sync  every receive is logged before it returns to the app: R writes
 *         the bytes to L over a unix socket, L forwards them to P and
 *         answers once P has them.
 *   ring  every receive returns at once; R copies the bytes into a ring
 *         in memory shared with L (one memcpy, no system call while L is
 *         awake), L ships them to P and publishes the stable offset, and
 *         R's next send waits until everything it received is stable.
 *         R wakes L only when it is about to wait for it (a send) or the
 *         ring is a quarter full.
 *   copy  the ring alone: L takes each byte as stable as soon as it sees
 *         it, with no protector: what the copy and the wake-ups cost, apart
 *         from moving every byte a second time.
 *   tee   no copy by R: each receive is splice(socket -> pipe), tee(pipe ->
 *         L's pipe) and read(pipe -> app buffer); L splices its pipe to P
 *         and publishes the stable offset, and R's next send waits for it
 *         as in ring. Three system calls a receive instead of one.
 *
 * lat: R writes 8 bytes, S echoes them, N times (default 20000) after N/10
 * warm-up round trips, each timed; prints
 *   logcost mode=M lat rtt_med_us=X rtt_p99_us=Y iters=N
 * bw: S writes N bytes (default 256M) in writes of C (default 1M); R reads
 * them in reads of up to C and answers one byte at the end, a send, which
 * in ring mode waits for the log; S times the whole and prints
 *   logcost mode=M bw MBps=B bytes=N
 * Exit status: 0 ok, 1 failure, 2 usage.
 */
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

enum mode { BARE, SYNC, RING, COPY, TEE };

#define RING_SIZE (64u << 20)

/* The ring shared by R and L. Offsets grow without bound; a byte at
 * offset o lives at data[o % RING_SIZE]. */
struct ring {
	_Alignas(64) _Atomic uint64_t head; /* R: bytes written */
	_Alignas(64) _Atomic uint64_t shipped; /* L: bytes sent to P (room again) */
	_Alignas(64) _Atomic uint64_t stable; /* L: bytes P has acknowledged */
	_Alignas(64) _Atomic int l_asleep; /* L waits on l_wake */
	_Atomic int r_waiting;             /* R waits on r_wake */
	int l_wake, r_wake;                /* eventfds */
	_Alignas(64) unsigned char data[];
};

static enum mode mode;
static struct ring *ring;
static int log_fd = -1; /* sync: R's end of the unix socket to L */
static int tee_in[2], tee_log[2]; /* tee: R's own pipe, and the one L reads */

static void wake(int efd)
{
	uint64_t one = 1;
	if (write(efd, &one, sizeof one) != sizeof one)
		die("eventfd write: %s", strerror(errno));
}

static void sleep_on(int efd)
{
	uint64_t v;
	if (read(efd, &v, sizeof v) != sizeof v)
		die("eventfd read: %s", strerror(errno));
}

/* R: a receive returned n bytes at p. */
static void log_received(const unsigned char *p, size_t n)
{
	switch (mode) {
	case BARE:
	case TEE: /* logged by the kernel's tee, in app_recv */
		return;
	case SYNC: {
		uint64_t len = n, ack;
		write_full(log_fd, &len, sizeof len, "log header");
		write_full(log_fd, p, n, "log bytes");
		read_full(log_fd, &ack, sizeof ack, "log ack");
		return;
	}
	case RING:
	case COPY: {
		uint64_t h = atomic_load_explicit(&ring->head, memory_order_relaxed);
		while (h + n - atomic_load_explicit(&ring->shipped, memory_order_acquire) > RING_SIZE)
			sched_yield(); /* full: L is behind (rare; a real shim would block) */
		size_t at = h % RING_SIZE, first = n < RING_SIZE - at ? n : RING_SIZE - at;
		memcpy(ring->data + at, p, first);
		memcpy(ring->data, p + first, n - first);
		atomic_store(&ring->head, h + n);
		/* L is woken when R will wait for it (before_send) or when the
		 * ring fills: a stream that R only reads costs no wake-ups, and L
		 * ships it in large pieces. */
		if (h + n - atomic_load(&ring->shipped) > RING_SIZE / 4 && atomic_load(&ring->l_asleep))
			wake(ring->l_wake);
		return;
	}
	}
}

/* R: one receive of up to max bytes, as the app's read() would return
 * them, logged as the mode says. */
static ssize_t app_recv(int fd, unsigned char *buf, size_t max)
{
	if (mode != TEE) {
		ssize_t n = read(fd, buf, max);
		if (n > 0)
			log_received(buf, (size_t)n);
		return n;
	}
	ssize_t n = splice(fd, NULL, tee_in[1], NULL, max, SPLICE_F_MOVE);
	if (n <= 0)
		return n;
	/* tee duplicates from the pipe's start: what it could not take yet
	 * is teed again only once the part before it has been read out. */
	for (size_t off = 0; off < (size_t)n;) {
		ssize_t k = tee(tee_in[0], tee_log[1], (size_t)n - off, 0);
		if (k <= 0)
			die("tee: %s", k == 0 ? "nothing" : strerror(errno));
		read_full(tee_in[0], buf + off, (size_t)k, "tee'd bytes");
		off += (size_t)k;
	}
	atomic_store(&ring->head, atomic_load_explicit(&ring->head, memory_order_relaxed) + (uint64_t)n);
	return n;
}

/* L in tee mode: splice what R teed to P, publish what P acknowledged. */
static void logger_tee(int pfd)
{
	struct pollfd w[2] = {{tee_log[0], POLLIN, 0}, {pfd, POLLIN, 0}};
	for (;;) {
		if (poll(w, 2, -1) < 0)
			die("logger poll: %s", strerror(errno));
		if (w[0].revents) {
			ssize_t k = splice(tee_log[0], NULL, pfd, NULL, 1 << 20, SPLICE_F_MOVE);
			if (k <= 0)
				exit(k == 0 ? 0 : 1);
		}
		if (w[1].revents) {
			uint64_t acks[512];
			ssize_t k = read(pfd, acks, sizeof acks);
			if (k <= 0)
				exit(k == 0 ? 0 : 1);
			atomic_store(&ring->stable, acks[k / 8 - 1]);
			if (atomic_load(&ring->r_waiting))
				wake(ring->r_wake);
		}
	}
}

/* R: about to send; in ring mode everything received must be stable. */
static void before_send(void)
{
	if (mode == BARE || mode == SYNC)
		return;
	uint64_t want = atomic_load_explicit(&ring->head, memory_order_relaxed);
	if (mode != TEE && atomic_load(&ring->stable) < want && atomic_load(&ring->l_asleep))
		wake(ring->l_wake);
	for (int spin = 0; spin < 2000; spin++)
		if (atomic_load_explicit(&ring->stable, memory_order_acquire) >= want)
			return;
	while (atomic_load_explicit(&ring->stable, memory_order_acquire) < want) {
		atomic_store(&ring->r_waiting, 1);
		if (atomic_load(&ring->stable) >= want) {
			atomic_store(&ring->r_waiting, 0);
			break;
		}
		sleep_on(ring->r_wake);
		atomic_store(&ring->r_waiting, 0);
	}
}

/* P: counts what arrives and acknowledges cumulative offsets. */
static void protector(int fd)
{
	static unsigned char buf[1 << 20];
	uint64_t total = 0;
	for (;;) {
		ssize_t n = read(fd, buf, sizeof buf);
		if (n <= 0)
			exit(n == 0 ? 0 : 1);
		total += (uint64_t)n;
		write_full(fd, &total, sizeof total, "protector ack");
	}
}

/* L in sync mode: a record from R, to P, P's ack, R's ack. */
static void logger_sync(int rfd, int pfd)
{
	static unsigned char buf[1 << 20];
	uint64_t total = 0;
	for (;;) {
		uint64_t len;
		ssize_t n = read(rfd, &len, sizeof len);
		if (n == 0)
			exit(0);
		if (n != sizeof len)
			die("logger: short header");
		for (uint64_t left = len; left > 0;) {
			size_t k = left < sizeof buf ? left : sizeof buf;
			read_full(rfd, buf, k, "logger record");
			write_full(pfd, buf, k, "logger ship");
			left -= k;
		}
		total += len;
		for (uint64_t acked = 0; acked < total;)
			read_full(pfd, &acked, sizeof acked, "logger protector ack");
		write_full(rfd, &total, sizeof total, "logger ack");
	}
}

/* L in ring mode: ship what R wrote, publish what P acknowledged. Its
 * flags and R's are a Dekker pair (store my flag, then read the other's
 * offset): sequentially consistent on both sides, or a wake-up is lost. */
static void logger_ring(int pfd)
{
	set_nonblock(pfd);
	uint64_t sent = 0;
	for (;;) {
		uint64_t h = atomic_load(&ring->head);
		if (mode == COPY && sent < h) {
			sent = h;
			atomic_store_explicit(&ring->shipped, sent, memory_order_release);
			atomic_store(&ring->stable, sent);
			if (atomic_load(&ring->r_waiting))
				wake(ring->r_wake);
		}
		while (sent < h) {
			size_t at = sent % RING_SIZE, n = h - sent < RING_SIZE - at ? h - sent : RING_SIZE - at;
			ssize_t k = write(pfd, ring->data + at, n);
			if (k < 0 && errno == EAGAIN)
				break;
			if (k <= 0)
				exit(k == 0 ? 0 : 1);
			sent += (uint64_t)k;
			atomic_store_explicit(&ring->shipped, sent, memory_order_release);
		}
		uint64_t acks[512];
		ssize_t k;
		while ((k = read(pfd, acks, sizeof acks)) > 0) {
			atomic_store(&ring->stable, acks[k / 8 - 1]);
			if (atomic_load(&ring->r_waiting))
				wake(ring->r_wake);
		}
		if (k == 0)
			exit(0);
		atomic_store(&ring->l_asleep, 1);
		if (atomic_load(&ring->head) == sent) {
			struct pollfd w[2] = {{ring->l_wake, POLLIN, 0}, {pfd, POLLIN, 0}};
			poll(w, 2, -1);
		} else if (sent < atomic_load(&ring->head)) {
			struct pollfd w[1] = {{pfd, POLLOUT | POLLIN, 0}}; /* P's socket is full */
			poll(w, 1, -1);
		}
		atomic_store(&ring->l_asleep, 0);
		uint64_t v;
		if (read(ring->l_wake, &v, sizeof v) < 0 && errno != EAGAIN)
			die("logger eventfd: %s", strerror(errno));
	}
}

/* A connected TCP pair over loopback. */
static void tcp_pair(int fds[2])
{
	int l = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof a;
	if (l < 0 || bind(l, (void *)&a, sizeof a) < 0 || listen(l, 1) < 0 || getsockname(l, (void *)&a, &len) < 0)
		die("listen: %s", strerror(errno));
	fds[0] = socket(AF_INET, SOCK_STREAM, 0);
	if (fds[0] < 0 || connect(fds[0], (void *)&a, sizeof a) < 0)
		die("connect: %s", strerror(errno));
	fds[1] = accept(l, NULL, NULL);
	if (fds[1] < 0)
		die("accept: %s", strerror(errno));
	close(l);
	set_nodelay(fds[0]);
	set_nodelay(fds[1]);
}

static pid_t spawn(void (*fn)(int, int), int a, int b, int keep[], int nkeep, int all[], int nall)
{
	pid_t pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid == 0) {
		for (int i = 0; i < nall; i++) {
			int kept = 0;
			for (int j = 0; j < nkeep; j++)
				kept |= all[i] == keep[j];
			if (!kept)
				close(all[i]);
		}
		fn(a, b);
		exit(0);
	}
	return pid;
}

static void run_protector(int fd, int unused) { (void)unused; protector(fd); }
static void run_logger_sync(int rfd, int pfd) { logger_sync(rfd, pfd); }
static void run_logger_ring(int pfd, int unused) { (void)unused; logger_ring(pfd); }
static void run_logger_tee(int pfd, int unused) { (void)unused; logger_tee(pfd); }

static long iters = 20000;
static uint64_t bytes = 256u << 20;
static size_t chunk = 1u << 20;

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* S in lat: echo 8-byte messages. */
static void echo(int fd, int unused)
{
	(void)unused;
	unsigned char m[8];
	for (;;) {
		ssize_t n = read(fd, m, sizeof m);
		if (n <= 0)
			exit(n == 0 ? 0 : 1);
		write_full(fd, m, (size_t)n, "echo");
	}
}

/* S in bw: send, then wait for R's one byte. */
static void blast(int fd, int unused)
{
	(void)unused;
	unsigned char *buf = malloc(chunk), done;
	if (buf == NULL)
		die("out of memory");
	memset(buf, 0x5a, chunk);
	double t0 = now_s();
	for (uint64_t left = bytes; left > 0;) {
		size_t k = left < chunk ? left : chunk;
		write_full(fd, buf, k, "bw data");
		left -= k;
	}
	read_full(fd, &done, 1, "bw done");
	double t = now_s() - t0;
	printf("logcost mode=%s bw MBps=%.1f bytes=%llu\n", (const char *[]){"bare", "sync", "ring", "copy", "tee"}[mode],
	       (double)bytes / t / 1e6, (unsigned long long)bytes);
	fflush(stdout);
}

static uint64_t parse_size(const char *s)
{
	char *end;
	unsigned long long v = strtoull(s, &end, 10);
	switch (*end) {
	case 'K': v <<= 10; end++; break;
	case 'M': v <<= 20; end++; break;
	case 'G': v <<= 30; end++; break;
	}
	if (*end != 0 || v == 0) {
		fprintf(stderr, "logcost: bad size %s\n", s);
		exit(2);
	}
	return v;
}

int main(int argc, char **argv)
{
	progname = "logcost";
	if (argc < 3) {
		fprintf(stderr, "usage: logcost bare|sync|ring|copy|tee lat|bw [--iters N] [--bytes N] [--chunk C]\n");
		return 2;
	}
	const char *names[] = {"bare", "sync", "ring", "copy", "tee"};
	mode = (enum mode)-1;
	for (int i = 0; i < 5; i++)
		if (strcmp(argv[1], names[i]) == 0)
			mode = (enum mode)i;
	int lat = strcmp(argv[2], "lat") == 0;
	if ((int)mode < 0 || (!lat && strcmp(argv[2], "bw") != 0)) {
		fprintf(stderr, "logcost: unknown mode %s or test %s\n", argv[1], argv[2]);
		return 2;
	}
	for (int i = 3; i + 1 < argc; i += 2) {
		if (strcmp(argv[i], "--iters") == 0)
			iters = (long)parse_size(argv[i + 1]);
		else if (strcmp(argv[i], "--bytes") == 0)
			bytes = parse_size(argv[i + 1]);
		else if (strcmp(argv[i], "--chunk") == 0)
			chunk = (size_t)parse_size(argv[i + 1]);
		else {
			fprintf(stderr, "logcost: unknown flag %s\n", argv[i]);
			return 2;
		}
	}

	int app[2], ship[2], lr[2] = {-1, -1};
	tcp_pair(app);  /* app[0]: R, app[1]: S */
	tcp_pair(ship); /* ship[0]: L, ship[1]: P */
	if (mode == SYNC && socketpair(AF_UNIX, SOCK_STREAM, 0, lr) < 0)
		die("socketpair: %s", strerror(errno));
	if (mode == TEE) {
		if (pipe(tee_in) < 0 || pipe(tee_log) < 0)
			die("pipe: %s", strerror(errno));
		for (int i = 0; i < 2; i++)
			if (fcntl((int[]){tee_in[1], tee_log[1]}[i], F_SETPIPE_SZ, 1 << 20) < 0)
				die("F_SETPIPE_SZ: %s", strerror(errno));
	}
	if (mode != BARE && mode != SYNC) {
		ring = mmap(NULL, sizeof *ring + RING_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		if (ring == MAP_FAILED)
			die("mmap: %s", strerror(errno));
		ring->l_wake = eventfd(0, EFD_NONBLOCK);
		ring->r_wake = eventfd(0, 0);
		if (ring->l_wake < 0 || ring->r_wake < 0)
			die("eventfd: %s", strerror(errno));
	}
	int all[] = {app[0], app[1], ship[0], ship[1], lr[0], lr[1], tee_in[0], tee_in[1], tee_log[0], tee_log[1]};
	int nall = mode == TEE ? 10 : 6;
	pid_t kids[3];
	int nk = 0;
	kids[nk++] = spawn(run_protector, ship[1], 0, (int[]){ship[1]}, 1, all, nall);
	if (mode == SYNC)
		kids[nk++] = spawn(run_logger_sync, lr[1], ship[0], (int[]){lr[1], ship[0]}, 2, all, nall);
	if (mode == RING || mode == COPY)
		kids[nk++] = spawn(run_logger_ring, ship[0], 0, (int[]){ship[0]}, 1, all, nall);
	if (mode == TEE)
		kids[nk++] = spawn(run_logger_tee, ship[0], 0, (int[]){ship[0], tee_log[0]}, 2, all, nall);
	kids[nk++] = spawn(lat ? echo : blast, app[1], 0, (int[]){app[1]}, 1, all, nall);
	close(app[1]);
	close(ship[0]);
	close(ship[1]);
	if (lr[1] >= 0)
		close(lr[1]);
	log_fd = lr[0];
	int r = app[0];

	if (lat) {
		long warm = iters / 10;
		double *rtt = malloc(sizeof(double) * (size_t)iters);
		if (rtt == NULL)
			die("out of memory");
		unsigned char m[8], back[8];
		for (long i = -warm; i < iters; i++) {
			memcpy(m, &i, sizeof m);
			double t0 = now_s();
			before_send();
			write_full(r, m, sizeof m, "ping");
			for (size_t got = 0; got < sizeof back;) {
				ssize_t n = app_recv(r, back + got, sizeof back - got);
				if (n <= 0)
					die("pong: %s", n == 0 ? "end of stream" : strerror(errno));
				got += (size_t)n;
			}
			if (i >= 0)
				rtt[i] = (now_s() - t0) * 1e6;
			if (memcmp(m, back, sizeof m) != 0)
				die("echo %ld differs", i);
		}
		qsort(rtt, (size_t)iters, sizeof *rtt, cmp_double);
		printf("logcost mode=%s lat rtt_med_us=%.2f rtt_p99_us=%.2f iters=%ld\n",
		       argv[1], rtt[iters / 2], rtt[iters * 99 / 100], iters);
	} else {
		unsigned char *buf = malloc(chunk);
		if (buf == NULL)
			die("out of memory");
		for (uint64_t got = 0; got < bytes;) {
			ssize_t n = app_recv(r, buf, chunk);
			if (n <= 0)
				die("bw: %s after %llu bytes", n == 0 ? "end of stream" : strerror(errno), (unsigned long long)got);
			got += (uint64_t)n;
		}
		before_send();
		write_full(r, "", 1, "bw done");
	}
	fflush(stdout);
	shutdown(r, SHUT_WR);
	close(r);
	if (log_fd >= 0)
		close(log_fd);
	/* S prints bw's figure: wait for it, then end L and P. */
	int st, failed = 0;
	waitpid(kids[nk - 1], &st, 0);
	failed = !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	for (int i = 0; i < nk - 1; i++) {
		kill(kids[i], SIGTERM);
		waitpid(kids[i], NULL, 0);
	}
	return failed;
}
