#include "common.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/tcp.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

const char *progname = "app";
int myrank = 0;

void die(const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "%s[rank %d]: ", progname, myrank);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int parse_int(const char *s, const char *name)
{
	char *end;
	long v;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || end == s || v < 0 || v > 1 << 20)
		die("%s=%s is not a valid number", name, s);
	return (int)v;
}

static void parse_addr(const char *s, size_t n, struct sockaddr_in *sa)
{
	char buf[64];
	char *colon;
	if (n == 0 || n >= sizeof buf)
		die("RADIC_PEERS entry '%.*s' is not host:port", (int)n, s);
	memcpy(buf, s, n);
	buf[n] = 0;
	colon = strrchr(buf, ':');
	if (!colon)
		die("RADIC_PEERS entry '%s' is not host:port", buf);
	*colon = 0;
	memset(sa, 0, sizeof *sa);
	sa->sin_family = AF_INET;
	if (inet_pton(AF_INET, buf, &sa->sin_addr) != 1)
		die("RADIC_PEERS entry '%s': '%s' is not an IPv4 address", s, buf);
	sa->sin_port = htons((uint16_t)parse_int(colon + 1, "port"));
}

void job_init(struct job *j, const char *prog)
{
	const char *r = getenv("RADIC_RANK"), *n = getenv("RADIC_SIZE"), *p = getenv("RADIC_PEERS");
	int i;
	progname = prog;
	j->rank = r ? parse_int(r, "RADIC_RANK") : 0;
	j->size = n ? parse_int(n, "RADIC_SIZE") : 1;
	myrank = j->rank;
	if (j->size < 1 || j->rank >= j->size)
		die("RADIC_RANK=%d with RADIC_SIZE=%d", j->rank, j->size);
	j->peers = calloc((size_t)j->size, sizeof *j->peers);
	if (!j->peers)
		die("out of memory");
	if (j->size == 1 && !p)
		return;
	if (!p)
		die("RADIC_PEERS is not set (RADIC_SIZE=%d): launch with `radic run`", j->size);
	for (i = 0; i < j->size; i++) {
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);
		if (len == 0)
			die("RADIC_PEERS has %d entries, RADIC_SIZE is %d", i, j->size);
		parse_addr(p, len, &j->peers[i]);
		p += len;
		if (*p == ',')
			p++;
	}
	if (*p)
		die("RADIC_PEERS has more than RADIC_SIZE=%d entries", j->size);
}

int job_listen(const struct job *j)
{
	int one = 1;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		die("socket: %s", strerror(errno));
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(fd, (const struct sockaddr *)&j->peers[j->rank], sizeof j->peers[j->rank]) < 0) {
		char a[INET_ADDRSTRLEN];
		inet_ntop(AF_INET, &j->peers[j->rank].sin_addr, a, sizeof a);
		die("bind %s:%d: %s", a, ntohs(j->peers[j->rank].sin_port), strerror(errno));
	}
	if (listen(fd, 1024) < 0)
		die("listen: %s", strerror(errno));
	return fd;
}

static int retryable(int e)
{
	return e == ECONNREFUSED || e == ETIMEDOUT || e == EHOSTUNREACH || e == ENETUNREACH ||
	       e == ECONNRESET || e == EAGAIN || e == EINTR || e == EADDRNOTAVAIL;
}

int job_connect_tries, job_connect_nonblock;

/* A connect made the strict POSIX way on a non-blocking socket: connect
 * says EINPROGRESS (or succeeds at once), anything else is fatal; poll for
 * writable; SO_ERROR says how it ended. Returns 0 or that errno. */
static int connect_nonblocking(int fd, const struct sockaddr_in *to, int rank)
{
	int e = 0;
	socklen_t len = sizeof e;
	struct pollfd p = {.fd = fd, .events = POLLOUT};
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	if (connect(fd, (const struct sockaddr *)to, sizeof *to) < 0) {
		if (errno != EINPROGRESS)
			die("non-blocking connect to rank %d: %s (want EINPROGRESS)", rank, strerror(errno));
		while (poll(&p, 1, -1) < 0)
			if (errno != EINTR)
				die("poll: %s", strerror(errno));
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) < 0)
			die("getsockopt SO_ERROR: %s", strerror(errno));
	}
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	return e;
}

int job_connect(const struct job *j, int to, uint32_t kind, double timeout_s)
{
	double deadline = now_s() + timeout_s;
	useconds_t backoff = 10000;
	uint32_t hello[2];
	for (job_connect_tries = 1;; job_connect_tries++) {
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		int e;
		if (fd < 0)
			die("socket: %s", strerror(errno));
		if (job_connect_nonblock)
			e = connect_nonblocking(fd, &j->peers[to], to);
		else
			e = connect(fd, (const struct sockaddr *)&j->peers[to], sizeof j->peers[to]) == 0 ? 0 : errno;
		if (e == 0) {
			hello[0] = htonl((uint32_t)j->rank);
			hello[1] = htonl(kind);
			write_full(fd, hello, sizeof hello, "hello");
			return fd;
		}
		close(fd);
		if (!retryable(e) || now_s() > deadline)
			die("connect to rank %d: %s (gave up after %.0f s)", to, strerror(e), timeout_s);
		usleep(backoff);
		if (backoff < 200000)
			backoff *= 2;
	}
}

int job_accept(int lfd, uint32_t *rank, uint32_t *kind)
{
	uint32_t hello[2];
	int fd;
	do
		fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	while (fd < 0 && (errno == EINTR || errno == ECONNABORTED));
	if (fd < 0)
		die("accept: %s", strerror(errno));
	read_full(fd, hello, sizeof hello, "hello");
	*rank = ntohl(hello[0]);
	*kind = ntohl(hello[1]);
	return fd;
}

void write_full(int fd, const void *buf, size_t len, const char *what)
{
	const char *p = buf;
	while (len > 0) {
		ssize_t n = write(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("write %s: %s", what, strerror(errno));
		p += n;
		len -= (size_t)n;
	}
}

void read_full(int fd, void *buf, size_t len, const char *what)
{
	char *p = buf;
	while (len > 0) {
		ssize_t n = read(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("read %s: %s", what, strerror(errno));
		if (n == 0)
			die("read %s: the peer closed the connection", what);
		p += n;
		len -= (size_t)n;
	}
}

void set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		die("fcntl O_NONBLOCK: %s", strerror(errno));
}

void set_nodelay(int fd)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

uint64_t mix64(uint64_t x)
{
	/* splitmix64's finalizer */
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return x;
}

uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	size_t i;
	for (i = 0; i < n; i++) {
		h ^= b[i];
		h *= 0x100000001b3ULL;
	}
	return h;
}
