/*
 * Helpers shared by the shim test programs (test/progs/).
 *
 * Every program is self-checking: CHECK() exits with status 1 and a message
 * naming the file, line and errno on any wrong result. Programs print a
 * deterministic transcript on stdout (results and errno names, never fd
 * numbers, ports, pids or timings), so that test/shim can compare a bare run
 * with a preloaded one byte for byte.
 *
 * Data written through sockets is a position-indexed pseudo-random stream
 * (pat()), so a lost, duplicated or reordered byte is caught by the receiver.
 */
#ifndef RADIC_TEST_COMMON_H
#define RADIC_TEST_COMMON_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#define CHECK(cond, ...)                                                       \
	do {                                                                   \
		if (!(cond))                                                   \
			check_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);    \
	} while (0)

/* CHECK_SYS: a call that must succeed (returns >= 0). */
#define CHECK_SYS(expr)                                                        \
	({                                                                     \
		long _r = (long)(expr);                                        \
		if (_r < 0)                                                    \
			check_fail(__FILE__, __LINE__, #expr, "call failed");  \
		_r;                                                            \
	})

static const char *prog_name = "prog";

__attribute__((noreturn, format(printf, 4, 5))) static void
check_fail(const char *file, int line, const char *cond, const char *fmt, ...)
{
	int e = errno;
	va_list ap;
	fflush(stdout);
	fprintf(stderr, "%s: FAIL %s:%d: %s: ", prog_name, file, line, cond);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " (errno %s)\n", e ? strerrorname_np(e) : "0");
	exit(1);
}

/* out: one transcript line on stdout, flushed (programs fork). */
__attribute__((format(printf, 1, 2))) static void out(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

static __attribute__((unused)) const char *ename(int e)
{
	const char *s = e ? strerrorname_np(e) : "OK";
	return s ? s : "E?";
}

/* pat: byte number off of stream s. No short period, so a dropped byte
 * shifts everything after it and is seen at once. */
static inline uint8_t pat(uint32_t s, uint64_t off)
{
	uint64_t x = off * 0x9e3779b97f4a7c15ull + s * 0xbf58476d1ce4e5b9ull + 1;
	x ^= x >> 31;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 29;
	return (uint8_t)(x >> 24);
}

static __attribute__((unused)) void fill(void *buf, size_t n, uint32_t s, uint64_t off)
{
	uint8_t *p = buf;
	for (size_t i = 0; i < n; i++)
		p[i] = pat(s, off + i);
}

/* verify returns -1 when buf is bytes [off, off+n) of stream s, else the
 * index of the first wrong byte. */
static __attribute__((unused)) long verify(const void *buf, size_t n, uint32_t s, uint64_t off)
{
	const uint8_t *p = buf;
	for (size_t i = 0; i < n; i++)
		if (p[i] != pat(s, off + i))
			return (long)i;
	return -1;
}

#define VERIFY(buf, n, s, off)                                                 \
	do {                                                                   \
		long _bad = verify((buf), (n), (s), (off));                    \
		if (_bad >= 0)                                                 \
			errno = 0; /* not an error of a call */                \
		CHECK(_bad < 0, "stream %u: wrong byte at offset %llu",        \
		      (unsigned)(s), (unsigned long long)(off) + _bad);        \
	} while (0)

/* Socket address helpers: loopback only, ephemeral ports. */
typedef union {
	struct sockaddr sa;
	struct sockaddr_in in4;
	struct sockaddr_in6 in6;
	struct sockaddr_un un;
	struct sockaddr_storage ss;
} addr_t;

static __attribute__((unused)) socklen_t loopback(int family, addr_t *a, uint16_t port)
{
	memset(a, 0, sizeof *a);
	if (family == AF_INET6) {
		a->in6.sin6_family = AF_INET6;
		a->in6.sin6_addr = in6addr_loopback;
		a->in6.sin6_port = htons(port);
		return sizeof a->in6;
	}
	a->in4.sin_family = AF_INET;
	a->in4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	a->in4.sin_port = htons(port);
	return sizeof a->in4;
}

static __attribute__((unused)) uint16_t addr_port(const addr_t *a)
{
	return ntohs(a->sa.sa_family == AF_INET6 ? a->in6.sin6_port
						 : a->in4.sin_port);
}

/* listener: a socket of type on loopback, ephemeral port, listening when
 * type is SOCK_STREAM. */
static __attribute__((unused)) int listener(int family, int type, uint16_t *port)
{
	addr_t a;
	socklen_t len = loopback(family, &a, 0);
	int fd = CHECK_SYS(socket(family, type, 0));
	int one = 1;
	CHECK_SYS(setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one));
	CHECK_SYS(bind(fd, &a.sa, len));
	if ((type & 0xf) == SOCK_STREAM)
		CHECK_SYS(listen(fd, 64));
	len = sizeof a;
	CHECK_SYS(getsockname(fd, &a.sa, &len));
	*port = addr_port(&a);
	return fd;
}

static __attribute__((unused)) int connect_to(int family, uint16_t port)
{
	addr_t a;
	socklen_t len = loopback(family, &a, port);
	int fd = CHECK_SYS(socket(family, SOCK_STREAM, 0));
	CHECK_SYS(connect(fd, &a.sa, len));
	return fd;
}

/* tcp_pair: a connected loopback TCP pair (c = connect side, s = accept
 * side). */
static __attribute__((unused)) void tcp_pair(int family, int *c, int *s)
{
	uint16_t port;
	int l = listener(family, SOCK_STREAM, &port);
	*c = connect_to(family, port);
	*s = CHECK_SYS(accept(l, NULL, NULL));
	CHECK_SYS(close(l));
	int one = 1;
	CHECK_SYS(setsockopt(*c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one));
	CHECK_SYS(setsockopt(*s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one));
}

static __attribute__((unused)) void set_nonblock(int fd, int on)
{
	int fl = CHECK_SYS(fcntl(fd, F_GETFL));
	CHECK_SYS(fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK));
}

static __attribute__((unused)) void small_bufs(int fd, int bytes)
{
	CHECK_SYS(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes));
	CHECK_SYS(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes));
}

/* write_all / read_all with write(2) / read(2) on blocking fds. */
static __attribute__((unused)) void write_all(int fd, const void *buf, size_t n)
{
	const char *p = buf;
	while (n > 0) {
		ssize_t r = write(fd, p, n);
		if (r < 0 && errno == EINTR)
			continue;
		CHECK(r > 0, "write %zu bytes returned %zd", n, r);
		p += r;
		n -= (size_t)r;
	}
}

static __attribute__((unused)) void read_all(int fd, void *buf, size_t n)
{
	char *p = buf;
	while (n > 0) {
		ssize_t r = read(fd, p, n);
		if (r < 0 && errno == EINTR)
			continue;
		CHECK(r > 0, "read %zu bytes returned %zd (early EOF?)", n, r);
		p += r;
		n -= (size_t)r;
	}
}

#endif
