/*
 * sockio.c — raw socket helpers for the Go control plane.
 *
 * Go reaches the app's sockets, and the sockets it swaps under them, through
 * these: always the real libc calls (never our wrappers), with timeouts, and
 * never through Go's poller (a socket given to the app must not be one Go
 * thinks it owns). Errors come back as negative errno values.
 */
#include "shim.h"
#include "sockio.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>

static long now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Waits for events on fd until deadline (ms, monotonic); 0 or -errno. */
static int wait_fd(int fd, short events, long deadline)
{
	for (;;) {
		long left = deadline - now_ms();
		if (left <= 0)
			return -ETIMEDOUT;
		struct pollfd p = {.fd = fd, .events = events};
		int r = REAL(poll)(&p, 1, (int)left);
		if (r > 0)
			return 0;
		if (r < 0 && errno != EINTR)
			return -errno;
	}
}

static int finish_connect(int fd, long deadline)
{
	int e = wait_fd(fd, POLLOUT, deadline);
	if (e < 0)
		return e;
	int err = 0;
	socklen_t len = sizeof err;
	if (REAL(getsockopt)(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
		return -errno;
	return -err;
}

/* A new blocking TCP socket connected to ip:port (ip in network order). */
int radic_sock_dial(uint32_t ip, uint16_t port, int timeout_ms)
{
	int fd = REAL(socket)(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr = {ip}};
	int e = 0;
	if (REAL(connect)(fd, (struct sockaddr *)&a, sizeof a) < 0) {
		e = errno == EINPROGRESS ? finish_connect(fd, now_ms() + timeout_ms) : -errno;
	}
	if (e < 0) {
		syscall(SYS_close, fd);
		return e;
	}
	int one = 1;
	REAL(setsockopt)(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	REAL(fcntl)(fd, F_SETFL, REAL(fcntl)(fd, F_GETFL) & ~O_NONBLOCK);
	return fd;
}

/* The app's connect, made blocking whatever the socket's mode, to ip:port. */
int radic_sock_connect(int fd, uint32_t ip, uint16_t port, int timeout_ms)
{
	int fl = REAL(fcntl)(fd, F_GETFL);
	if (fl < 0)
		return -errno;
	REAL(fcntl)(fd, F_SETFL, fl | O_NONBLOCK);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr = {ip}};
	int e = 0;
	if (REAL(connect)(fd, (struct sockaddr *)&a, sizeof a) < 0)
		e = errno == EINPROGRESS ? finish_connect(fd, now_ms() + timeout_ms) : -errno;
	if (e < 0 && e != -ETIMEDOUT && e != -EINTR)
		/* Linux keeps a socket whose non-blocking connect failed
		 * "connecting" until a connect call sees the failure (it says
		 * ECONNABORTED then): this one, so that the app's next connect
		 * on the socket, or ours, is a new one, as after a blocking
		 * connect that failed. */
		REAL(connect)(fd, (struct sockaddr *)&a, sizeof a);
	REAL(fcntl)(fd, F_SETFL, fl);
	return e;
}

/* A new TCP socket bound to ip with a port of its own (*port), above the
 * fds an app expects to see (it lives until the app accepts its peer). */
int radic_sock_bound(uint32_t ip, uint16_t *port)
{
	int s = REAL(socket)(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -errno;
	int fd = (int)syscall(SYS_fcntl, s, F_DUPFD_CLOEXEC, 64);
	int e = fd < 0 ? -errno : 0;
	syscall(SYS_close, s);
	if (e < 0)
		return e;
	uint32_t got;
	e = radic_sock_bind(fd, ip, 0);
	if (e == 0)
		e = radic_sock_name(fd, 0, &got, port);
	if (e < 0) {
		syscall(SYS_close, fd);
		return e;
	}
	return fd;
}

/* fd connects to a loopback port nobody listens on: a socket of ours is
 * bound there for the moment (and closed at once), so that no listener can
 * take the port in between. */
int radic_sock_refuse(int fd)
{
	int s = REAL(socket)(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -errno;
	uint32_t ip;
	uint16_t port;
	int e = radic_sock_bind(s, htonl(INADDR_LOOPBACK), 0);
	if (e == 0)
		e = radic_sock_name(s, 0, &ip, &port);
	if (e == 0) {
		struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
					.sin_addr = {htonl(INADDR_LOOPBACK)}};
		e = REAL(connect)(fd, (struct sockaddr *)&a, sizeof a) < 0 ? -errno : 0;
	}
	syscall(SYS_close, s);
	return e;
}

/* Abandons a connect still on its way (Linux: connect to AF_UNSPEC makes
 * the socket unconnected again, keeping what the app bound). */
void radic_sock_disconnect(int fd)
{
	struct sockaddr a = {.sa_family = AF_UNSPEC};
	REAL(connect)(fd, &a, sizeof a);
}

int radic_sock_write_full(int fd, const void *p, size_t n, int timeout_ms)
{
	long deadline = now_ms() + timeout_ms;
	const char *b = p;
	while (n > 0) {
		ssize_t r = REAL(send)(fd, b, n, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (r > 0) {
			b += r;
			n -= (size_t)r;
			continue;
		}
		if (r < 0 && errno != EAGAIN && errno != EINTR)
			return -errno;
		int e = wait_fd(fd, POLLOUT, deadline);
		if (e < 0)
			return e;
	}
	return 0;
}

/* Reads exactly n bytes; -EPIPE if the stream ends first. */
int radic_sock_read_full(int fd, void *p, size_t n, int timeout_ms)
{
	long deadline = now_ms() + timeout_ms;
	char *b = p;
	while (n > 0) {
		ssize_t r = REAL(recv)(fd, b, n, MSG_DONTWAIT);
		if (r > 0) {
			b += r;
			n -= (size_t)r;
			continue;
		}
		if (r == 0)
			return -EPIPE;
		if (errno != EAGAIN && errno != EINTR)
			return -errno;
		int e = wait_fd(fd, POLLIN, deadline);
		if (e < 0)
			return e;
	}
	return 0;
}

/* Peeks at up to n bytes, waiting up to timeout_ms for the first; returns
 * how many are there (0 on timeout), -EPIPE at the end of the stream, or
 * -errno. */
int radic_sock_peek(int fd, void *p, size_t n, int timeout_ms)
{
	int e = wait_fd(fd, POLLIN, now_ms() + timeout_ms);
	if (e == -ETIMEDOUT)
		return 0;
	if (e < 0)
		return e;
	ssize_t r = REAL(recv)(fd, p, n, MSG_PEEK | MSG_DONTWAIT);
	if (r < 0)
		return errno == EAGAIN ? 0 : -errno;
	return r == 0 && n > 0 ? -EPIPE : (int)r;
}

/* The local (peer=0) or remote address of fd; ip in network order. */
int radic_sock_name(int fd, int peer, uint32_t *ip, uint16_t *port)
{
	struct sockaddr_in a;
	socklen_t len = sizeof a;
	int r = peer ? REAL(getpeername)(fd, (struct sockaddr *)&a, &len)
		     : REAL(getsockname)(fd, (struct sockaddr *)&a, &len);
	if (r < 0)
		return -errno;
	if (a.sin_family != AF_INET)
		return -EAFNOSUPPORT;
	*ip = a.sin_addr.s_addr;
	*port = ntohs(a.sin_port);
	return 0;
}

int radic_sock_bind(int fd, uint32_t ip, uint16_t port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr = {ip}};
	return REAL(bind)(fd, (struct sockaddr *)&a, sizeof a) < 0 ? -errno : 0;
}

/* 1 if ip (network order) is an address of this host's namespace, 0 if it
 * is not (any more), -errno if that cannot be told. */
int radic_addr_is_local(uint32_t ip)
{
	int fd = REAL(socket)(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr = {ip}};
	int r = REAL(bind)(fd, (struct sockaddr *)&a, sizeof a) == 0 ? 1
		: errno == EADDRNOTAVAIL				   ? 0
									   : -errno;
	syscall(SYS_close, fd);
	return r;
}

/* Writes ip:port as the app's sockaddr (truncated to *len, as the kernel
 * does); -1 on a bad pointer. */
int radic_sock_fill(void *sa, socklen_t *len, uint32_t ip, uint16_t port)
{
	if (sa == NULL || len == NULL)
		return -1;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr = {ip}};
	memcpy(sa, &a, *len < sizeof a ? *len : sizeof a);
	*len = sizeof a;
	return 0;
}

int radic_sock_listen(int fd, int backlog) { return REAL(listen)(fd, backlog) < 0 ? -errno : 0; }

/* A private duplicate of fd (for a connection the app closed but whose
 * bytes are not all delivered yet). */
int radic_sock_dup(int fd)
{
	int r = (int)syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, 64);
	return r < 0 ? -errno : r;
}

int radic_sock_graft(int held, int fd)
{
	int nonblock = REAL(fcntl)(fd, F_GETFL) & O_NONBLOCK;
	int cloexec = REAL(fcntl)(fd, F_GETFD) & FD_CLOEXEC;
	int fl = REAL(fcntl)(held, F_GETFL);
	int r = 0;
	if (REAL(fcntl)(held, F_SETFL, (fl & ~O_NONBLOCK) | nonblock) < 0 ||
	    REAL(dup3)(held, fd, cloexec ? O_CLOEXEC : 0) < 0)
		r = -errno;
	syscall(SYS_close, held);
	return r;
}

void radic_sock_close(int fd) { syscall(SYS_close, fd); }

int radic_sock_shutdown(int fd, int how) { return REAL(shutdown)(fd, how) < 0 ? -errno : 0; }

int radic_sock_getfl(int fd) { return REAL(fcntl)(fd, F_GETFL); }

int radic_sock_setopt(int fd, int level, int name, const void *val, socklen_t len)
{
	return REAL(setsockopt)(fd, level, name, val, len) < 0 ? -errno : 0;
}

void radic_log(const char *s) { radic_logf("%s", s); }

void radic_set_lpid(const char *s) { snprintf(radic_lpid, sizeof radic_lpid, "%s", s); }
