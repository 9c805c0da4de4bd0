/* netbench: transport benchmarks between the two ranks of a job (radic run
 * --np 2), the load of the safe-socket benchmarks (test/safebench). Rank 0
 * listens on its RADIC_PEERS entry, rank 1 connects to it (job_connect);
 * both set TCP_NODELAY. One connection, blocking sockets, plain
 * read()/write(): the program measures the transport, not itself.
 *
 *   netbench lat  [--iters N]
 *   netbench bw   [--bytes N] [--chunk C]
 *   netbench flow [--rate R] [--chunk C] [--gap SEC] [--secs S] [--stop-file PATH]
 *
 * lat: rank 1 writes 8 bytes, rank 0 echoes them back, N times (default
 * 20000) after N/10 warm-up round trips. Each round trip is timed on its
 * own (CLOCK_MONOTONIC); rank 1 checks every echo and prints
 *   lat rtt_med_us=M rtt_mean_us=A rtt_p99_us=P iters=N
 *
 * bw: rank 1 writes N bytes (default 512M) in writes of C bytes (default
 * 1M); rank 0 reads them in reads of up to C bytes, times the last 7/8 of
 * them (the first eighth warms the connection up), answers one byte when
 * the last has arrived, and prints
 *   bw MBps=B bytes=N secs=T
 * (MB = 10^6 bytes). The data is not checked: that would make the program
 * CPU bound; the byte count and the end-of-file right after it are.
 *
 * flow: both ranks write C bytes (default 1K) every C/R seconds (R default
 * 1M: a write per millisecond), at the same time, until S seconds have
 * passed (default: none) or PATH exists (checked every 50 ms); then each
 * shuts its sending side down and reads the other direction to its
 * end-of-file. A sender that fell behind (blocked by a stalled connection)
 * does not catch up. Each receiver checks every byte (a position-indexed
 * pseudo-random stream, so a lost or duplicated byte is caught) and, when
 * data arrives after a silence of at least --gap seconds (default 1),
 * prints at once
 *   gap rank R start=T0 end=T1 ms=D
 * where T0 is the wall-clock time (CLOCK_REALTIME, seconds) of the last
 * read before the silence and T1 of the first read after it. The first
 * byte received is announced with "flow receiving rank R". At the end:
 *   flow ok rank R sent S received X gaps G
 *
 * Sizes and rates take K, M and G suffixes (KiB, MiB, GiB). Exit status:
 * 0 ok, 1 failure (set-up, connection, wrong data), 2 usage.
 */
#include "common.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { KIND_NETBENCH = 0x6e62 };

static struct job job;

static void usage(const char *why)
{
	if (why)
		fprintf(stderr, "netbench: %s\n", why);
	fprintf(stderr, "usage: netbench lat  [--iters N]\n"
			"       netbench bw   [--bytes N] [--chunk C]\n"
			"       netbench flow [--rate R] [--chunk C] [--gap SEC] [--secs S] [--stop-file PATH]\n"
			"Two ranks (radic run --np 2): rank 0 listens on its RADIC_PEERS entry, rank 1 connects.\n");
	exit(2);
}

static uint64_t parse_size(const char *s, const char *flag)
{
	char *end;
	unsigned long long v;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *s == '-')
		goto bad;
	switch (*end) {
	case 0:
		return v;
	case 'k':
	case 'K':
		v <<= 10;
		break;
	case 'm':
	case 'M':
		v <<= 20;
		break;
	case 'g':
	case 'G':
		v <<= 30;
		break;
	default:
		goto bad;
	}
	if (end[1] == 0)
		return v;
bad:
	fprintf(stderr, "netbench: %s %s: want a number, optionally with a K, M or G suffix\n", flag, s);
	exit(2);
}

static double parse_secs(const char *s, const char *flag)
{
	char *end;
	double v = strtod(s, &end);
	if (end == s || *end || v < 0) {
		fprintf(stderr, "netbench: %s %s: want seconds >= 0\n", flag, s);
		exit(2);
	}
	return v;
}

static double wall_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Writes one line to stdout with a single write(): lines of the two
 * threads never mix, and the line leaves at once. */
static void line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void line(const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	int n;
	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n > sizeof buf - 2)
		n = (int)sizeof buf - 2;
	buf[n++] = '\n';
	write_full(1, buf, (size_t)n, "stdout");
}

/* The one connection: rank 1 connects, rank 0 accepts. */
static int open_conn(void)
{
	int fd;
	if (job.rank == 0) {
		uint32_t from, kind;
		int l = job_listen(&job);
		fd = job_accept(l, &from, &kind);
		close(l);
		if (from != 1 || kind != KIND_NETBENCH)
			die("unexpected hello: rank %u kind %#x", from, kind);
	} else {
		fd = job_connect(&job, 0, KIND_NETBENCH, 60);
	}
	set_nodelay(fd);
	return fd;
}

/* read() that returns 0 only at end-of-file and dies on an error. */
static size_t read_some(int fd, void *buf, size_t len, const char *what)
{
	for (;;) {
		ssize_t n = read(fd, buf, len);
		if (n >= 0)
			return (size_t)n;
		if (errno != EINTR)
			die("read %s: %s", what, strerror(errno));
	}
}

static void expect_eof(int fd, const char *what)
{
	char c;
	if (read_some(fd, &c, 1, what) != 0)
		die("%s: data after the end", what);
}

/* ---- lat ---- */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static int run_lat(int argc, char **argv)
{
	long iters = 20000, warm, i;
	int fd;
	for (i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "--iters") && i + 1 < argc)
			iters = (long)parse_size(argv[++i], "--iters");
		else
			usage("lat: unknown argument");
	}
	if (iters < 10)
		usage("lat: --iters: at least 10");
	warm = iters / 10;
	fd = open_conn();
	if (job.rank == 0) {
		uint64_t m;
		/* Echo until end-of-file. */
		for (;;) {
			size_t n = read_some(fd, &m, sizeof m, "ping");
			if (n == 0)
				break;
			if (n < sizeof m)
				read_full(fd, (char *)&m + n, sizeof m - n, "ping");
			write_full(fd, &m, sizeof m, "pong");
		}
		close(fd);
		return 0;
	}
	double *rtt = malloc((size_t)iters * sizeof *rtt), sum = 0;
	if (!rtt)
		die("out of memory");
	for (i = -warm; i < iters; i++) {
		uint64_t m = mix64((uint64_t)(i + warm)), back;
		double t0 = now_s();
		write_full(fd, &m, sizeof m, "ping");
		read_full(fd, &back, sizeof back, "pong");
		double t = now_s() - t0;
		if (back != m)
			die("round trip %ld: echo %016" PRIx64 ", sent %016" PRIx64, i + warm, back, m);
		if (i >= 0) {
			rtt[i] = t;
			sum += t;
		}
	}
	shutdown(fd, SHUT_WR);
	expect_eof(fd, "pong");
	close(fd);
	qsort(rtt, (size_t)iters, sizeof *rtt, cmp_double);
	line("lat rtt_med_us=%.3f rtt_mean_us=%.3f rtt_p99_us=%.3f iters=%ld", rtt[iters / 2] * 1e6,
	     sum / (double)iters * 1e6, rtt[iters * 99 / 100] * 1e6, iters);
	return 0;
}

/* ---- bw ---- */

static int run_bw(int argc, char **argv)
{
	uint64_t nbytes = 512ULL << 20, chunk = 1 << 20, got = 0, warm;
	unsigned char *buf;
	int fd, i;
	for (i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "--bytes") && i + 1 < argc)
			nbytes = parse_size(argv[++i], "--bytes");
		else if (!strcmp(argv[i], "--chunk") && i + 1 < argc)
			chunk = parse_size(argv[++i], "--chunk");
		else
			usage("bw: unknown argument");
	}
	if (chunk < 1 || chunk > (256u << 20) || nbytes < 8 * chunk)
		usage("bw: want 1 <= --chunk <= 256M and --bytes >= 8 * --chunk");
	warm = nbytes / 8;
	buf = malloc(chunk);
	if (!buf)
		die("out of memory");
	for (uint64_t k = 0; k < chunk; k++)
		buf[k] = (unsigned char)(mix64(k / 8) >> (8 * (k % 8)));
	fd = open_conn();
	if (job.rank == 1) {
		char ack;
		while (got < nbytes) {
			uint64_t n = nbytes - got < chunk ? nbytes - got : chunk;
			write_full(fd, buf, n, "data");
			got += n;
		}
		read_full(fd, &ack, 1, "ack");
		shutdown(fd, SHUT_WR);
		expect_eof(fd, "ack");
		close(fd);
		return 0;
	}
	double t0 = 0;
	while (got < nbytes) {
		size_t n = read_some(fd, buf, chunk, "data");
		if (n == 0)
			die("data: end-of-file after %" PRIu64 " of %" PRIu64 " bytes", got, nbytes);
		if (got < warm && got + n >= warm)
			t0 = now_s();
		got += n;
	}
	double t = now_s() - t0;
	if (got != nbytes)
		die("data: %" PRIu64 " bytes, want %" PRIu64, got, nbytes);
	write_full(fd, "!", 1, "ack");
	expect_eof(fd, "data");
	close(fd);
	line("bw MBps=%.1f bytes=%" PRIu64 " secs=%.3f", (double)(nbytes - warm) / t / 1e6, nbytes, t);
	return 0;
}

/* ---- flow ---- */

static uint64_t flow_rate = 1 << 20, flow_chunk = 1 << 10;
static double flow_gap = 1, flow_secs;
static const char *stop_file;
static int flow_fd;
static uint64_t flow_sent, flow_rcvd, flow_gaps;

/* Byte off of the stream rank r sends. */
static unsigned char pat_of(int rank, uint64_t off)
{
	return (unsigned char)(mix64((off / 8) ^ ((uint64_t)rank << 56)) >> (8 * (off % 8)));
}

static void sleep_until(double t)
{
	double d = t - now_s();
	if (d <= 0)
		return;
	struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static void *flow_sender(void *arg)
{
	unsigned char *buf = malloc(flow_chunk);
	double start = now_s(), next = start, step = (double)flow_chunk / (double)flow_rate, check = start;
	(void)arg;
	if (!buf)
		die("out of memory");
	for (;;) {
		double t = now_s();
		if (flow_secs > 0 && t - start >= flow_secs)
			break;
		if (stop_file && t >= check) {
			struct stat st;
			if (stat(stop_file, &st) == 0)
				break;
			check = t + 0.05;
		}
		for (uint64_t k = 0; k < flow_chunk; k++)
			buf[k] = pat_of(job.rank, flow_sent + k);
		write_full(flow_fd, buf, flow_chunk, "flow");
		__atomic_store_n(&flow_sent, flow_sent + flow_chunk, __ATOMIC_RELAXED);
		next += step;
		t = now_s();
		if (next < t)
			next = t; /* fell behind: no catching up */
		sleep_until(next);
	}
	if (shutdown(flow_fd, SHUT_WR) < 0)
		die("shutdown: %s", strerror(errno));
	free(buf);
	return NULL;
}

static void *flow_receiver(void *arg)
{
	unsigned char *buf = malloc(64 << 10);
	int peer = 1 - job.rank;
	double last = 0;
	(void)arg;
	if (!buf)
		die("out of memory");
	for (;;) {
		size_t n = read_some(flow_fd, buf, 64 << 10, "flow");
		double t = wall_s();
		if (n == 0)
			break;
		for (size_t k = 0; k < n; k++)
			if (buf[k] != pat_of(peer, flow_rcvd + k))
				die("flow: wrong byte at offset %" PRIu64 ": got 0x%02x want 0x%02x", flow_rcvd + k, buf[k],
				    pat_of(peer, flow_rcvd + k));
		if (last == 0)
			line("flow receiving rank %d", job.rank);
		if (last > 0 && t - last >= flow_gap) {
			flow_gaps++;
			line("gap rank %d start=%.6f end=%.6f ms=%.1f", job.rank, last, t, (t - last) * 1e3);
		}
		last = t;
		flow_rcvd += n;
	}
	free(buf);
	return NULL;
}

static int run_flow(int argc, char **argv)
{
	pthread_t tx, rx;
	int i, e;
	for (i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "--rate") && i + 1 < argc)
			flow_rate = parse_size(argv[++i], "--rate");
		else if (!strcmp(argv[i], "--chunk") && i + 1 < argc)
			flow_chunk = parse_size(argv[++i], "--chunk");
		else if (!strcmp(argv[i], "--gap") && i + 1 < argc)
			flow_gap = parse_secs(argv[++i], "--gap");
		else if (!strcmp(argv[i], "--secs") && i + 1 < argc)
			flow_secs = parse_secs(argv[++i], "--secs");
		else if (!strcmp(argv[i], "--stop-file") && i + 1 < argc)
			stop_file = argv[++i];
		else
			usage("flow: unknown argument");
	}
	if (flow_rate < 1 || flow_chunk < 1 || flow_chunk > (16u << 20))
		usage("flow: want --rate >= 1 and 1 <= --chunk <= 16M");
	if (flow_secs <= 0 && !stop_file)
		usage("flow: give --secs or --stop-file (or both)");
	flow_fd = open_conn();
	if ((e = pthread_create(&tx, NULL, flow_sender, NULL)) != 0 ||
	    (e = pthread_create(&rx, NULL, flow_receiver, NULL)) != 0)
		die("pthread_create: %s", strerror(e));
	pthread_join(tx, NULL);
	pthread_join(rx, NULL);
	close(flow_fd);
	line("flow ok rank %d sent %" PRIu64 " received %" PRIu64 " gaps %" PRIu64, job.rank, flow_sent, flow_rcvd,
	     flow_gaps);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2 || (strcmp(argv[1], "lat") && strcmp(argv[1], "bw") && strcmp(argv[1], "flow")))
		usage(argc < 2 ? NULL : "want lat, bw or flow");
	job_init(&job, "netbench");
	if (job.size != 2)
		die("netbench needs exactly two ranks (radic run --np 2), not %d", job.size);
	signal(SIGPIPE, SIG_IGN);
	if (!strcmp(argv[1], "lat"))
		return run_lat(argc - 2, argv + 2);
	if (!strcmp(argv[1], "bw"))
		return run_bw(argc - 2, argv + 2);
	return run_flow(argc - 2, argv + 2);
}
