/*
 * lifecycle: the interposed socket lifecycle and descriptor calls, with
 * their error cases:
 *
 *   socket connect accept accept4 bind listen shutdown close close_range
 *   closefrom dup dup2 dup3 fcntl fcntl64 ioctl(FIONBIO, FIONREAD)
 *   setsockopt getsockopt getpeername getsockname
 *
 * including EINPROGRESS connects, ECONNREFUSED, EADDRINUSE, EISCONN,
 * ENOTCONN, EBADF. IPv4 and IPv6.
 */
#include "common.h"

#include <linux/close_range.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/time.h>

static int fdflags(int fd) { return (int)CHECK_SYS(fcntl(fd, F_GETFD)); }
static int flflags(int fd) { return (int)CHECK_SYS(fcntl(fd, F_GETFL)); }

/* echo1: 4 KiB through a connected pair and back, read in small pieces
 * (so that every copy of a descriptor carries checked data). */
static void echo1(int a, int b, const char *what)
{
	static char buf[4096], in[4096];
	static uint32_t stream = 1000;
	stream++;
	struct timeval tv = {10, 0}; /* lost data fails instead of hanging */
	CHECK_SYS(setsockopt(a, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
	CHECK_SYS(setsockopt(b, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
	fill(buf, sizeof buf, stream, 0);
	CHECK(send(a, buf, sizeof buf, MSG_NOSIGNAL) == sizeof buf, "%s: send", what);
	for (size_t got = 0; got < sizeof in;) {
		ssize_t r = recv(b, in + got, 64, 0);
		CHECK(r > 0, "%s: recv", what);
		got += (size_t)r;
	}
	VERIFY(in, sizeof in, stream, 0);
	CHECK(write(b, in, sizeof in) == sizeof in, "%s: write back", what);
	for (size_t got = 0; got < sizeof buf;) {
		ssize_t r = read(a, buf + got, 100);
		CHECK(r > 0, "%s: read back", what);
		got += (size_t)r;
	}
	VERIFY(buf, sizeof buf, stream, 0);
}

static void expect_err(long r, int want, const char *what)
{
	int e = errno;
	out("%s: %ld %s", what, r, r < 0 ? ename(e) : "OK");
	errno = e;
	CHECK(r == -1 && e == want, "%s: want %s", what, ename(want));
}

static void family_test(int fam, const char *kind)
{
	char what[128];
	addr_t a, b;
	socklen_t alen;

	/* socket with type flags. */
	int l = CHECK_SYS(socket(fam, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
	out("%s socket(NONBLOCK|CLOEXEC): nonblock=%d cloexec=%d", kind,
	    !!(flflags(l) & O_NONBLOCK), !!(fdflags(l) & FD_CLOEXEC));
	CHECK((flflags(l) & O_NONBLOCK) && (fdflags(l) & FD_CLOEXEC), "flags");

	/* getsockname before bind: port 0. */
	alen = sizeof a;
	CHECK_SYS(getsockname(l, &a.sa, &alen));
	out("%s getsockname unbound: family_ok=%d port=%u", kind,
	    a.sa.sa_family == fam, addr_port(&a));

	alen = loopback(fam, &a, 0);
	CHECK_SYS(bind(l, &a.sa, alen));
	alen = sizeof a;
	CHECK_SYS(getsockname(l, &a.sa, &alen));
	uint16_t port = addr_port(&a);
	out("%s bind+getsockname: port_nonzero=%d len_ok=%d", kind, port != 0,
	    alen == (fam == AF_INET ? sizeof a.in4 : sizeof a.in6));
	CHECK(port != 0, "ephemeral port");

	/* Binding the same port again: EADDRINUSE. */
	int l2 = CHECK_SYS(socket(fam, SOCK_STREAM, 0));
	snprintf(what, sizeof what, "%s bind same port", kind);
	expect_err(bind(l2, &a.sa, alen), EADDRINUSE, what);
	CHECK_SYS(close(l2));

	/* accept4 before listen: EINVAL; after listen, nothing queued:
	 * EAGAIN on the non-blocking listener. */
	snprintf(what, sizeof what, "%s accept before listen", kind);
	expect_err(accept(l, NULL, NULL), EINVAL, what);
	CHECK_SYS(listen(l, 16));
	snprintf(what, sizeof what, "%s accept4 nothing queued", kind);
	expect_err(accept4(l, NULL, NULL, SOCK_CLOEXEC), EAGAIN, what);

	/* Non-blocking connect: EINPROGRESS (or at once on loopback), then
	 * writable, SO_ERROR 0. */
	int c = CHECK_SYS(socket(fam, SOCK_STREAM | SOCK_NONBLOCK, 0));
	int r = connect(c, &a.sa, alen);
	int e = errno;
	CHECK(r == 0 || e == EINPROGRESS, "nonblocking connect: %s", ename(e));
	struct pollfd p = {c, POLLOUT, 0};
	CHECK(poll(&p, 1, 5000) == 1 && (p.revents & POLLOUT), "POLLOUT");
	int soerr = -1;
	socklen_t sl = sizeof soerr;
	CHECK_SYS(getsockopt(c, SOL_SOCKET, SO_ERROR, &soerr, &sl));
	out("%s nonblocking connect: 0-or-EINPROGRESS=yes writable=yes SO_ERROR=%s",
	    kind, ename(soerr));
	CHECK(soerr == 0, "SO_ERROR");
	/* After an asynchronous connect completes, connect reports success
	 * once (unless it completed at once), then EISCONN. */
	if (r != 0) {
		r = connect(c, &a.sa, alen);
		out("%s connect after completion: %d", kind, r);
		CHECK(r == 0, "connect after completion");
	} else {
		out("%s connect after completion: 0", kind);
	}
	snprintf(what, sizeof what, "%s connect again", kind);
	expect_err(connect(c, &a.sa, alen), EISCONN, what);

	/* accept with address: it is the client's getsockname. */
	p = (struct pollfd){l, POLLIN, 0};
	CHECK(poll(&p, 1, 5000) == 1, "listener readable");
	alen = sizeof b;
	int s = CHECK_SYS(accept(l, &b.sa, &alen));
	addr_t cn;
	socklen_t cl = sizeof cn;
	CHECK_SYS(getsockname(c, &cn.sa, &cl));
	out("%s accept: peer_is_client=%d nonblock_inherited=%d", kind,
	    addr_port(&b) == addr_port(&cn) && b.sa.sa_family == fam,
	    !!(flflags(s) & O_NONBLOCK));
	CHECK(addr_port(&b) == addr_port(&cn), "accept address");
	addr_t pn;
	socklen_t pl = sizeof pn;
	CHECK_SYS(getpeername(c, &pn.sa, &pl));
	CHECK(addr_port(&pn) == port, "getpeername");
	pl = sizeof pn;
	CHECK_SYS(getpeername(s, &pn.sa, &pl));
	CHECK(addr_port(&pn) == addr_port(&cn), "getpeername server side");
	out("%s getpeername both ends: ok", kind);
	set_nonblock(c, 0);
	echo1(c, s, "accepted");

	/* accept4 with flags. */
	int c2 = connect_to(fam, port);
	p = (struct pollfd){l, POLLIN, 0};
	CHECK(poll(&p, 1, 5000) == 1, "listener readable");
	int s2 = CHECK_SYS(accept4(l, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC));
	out("%s accept4(NONBLOCK|CLOEXEC): nonblock=%d cloexec=%d", kind,
	    !!(flflags(s2) & O_NONBLOCK), !!(fdflags(s2) & FD_CLOEXEC));
	CHECK((flflags(s2) & O_NONBLOCK) && (fdflags(s2) & FD_CLOEXEC), "accept4 flags");
	set_nonblock(s2, 0);
	echo1(c2, s2, "accept4");

	/* setsockopt / getsockopt. */
	int one = 1, v = 0;
	sl = sizeof v;
	CHECK_SYS(setsockopt(c2, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one));
	CHECK_SYS(getsockopt(c2, IPPROTO_TCP, TCP_NODELAY, &v, &sl));
	out("%s TCP_NODELAY=%d", kind, v);
	CHECK(v == 1, "TCP_NODELAY");
	CHECK_SYS(setsockopt(c2, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one));
	sl = sizeof v;
	CHECK_SYS(getsockopt(c2, SOL_SOCKET, SO_KEEPALIVE, &v, &sl));
	CHECK(v == 1, "SO_KEEPALIVE");
	int sz = 20000;
	CHECK_SYS(setsockopt(c2, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz));
	sl = sizeof v;
	CHECK_SYS(getsockopt(c2, SOL_SOCKET, SO_SNDBUF, &v, &sl));
	out("%s SO_SNDBUF set 20000 got %d", kind, v);
	CHECK(v == 40000, "SO_SNDBUF doubled");
	sl = sizeof v;
	CHECK_SYS(getsockopt(c2, SOL_SOCKET, SO_TYPE, &v, &sl));
	int dom = 0;
	socklen_t dl = sizeof dom;
	CHECK_SYS(getsockopt(c2, SOL_SOCKET, SO_DOMAIN, &dom, &dl));
	out("%s SO_TYPE stream=%d SO_DOMAIN ok=%d", kind, v == SOCK_STREAM, dom == fam);
	CHECK(v == SOCK_STREAM && dom == fam, "SO_TYPE/SO_DOMAIN");
	struct linger lg = {1, 0}, lg2;
	socklen_t ll = sizeof lg2;
	CHECK_SYS(setsockopt(c2, SOL_SOCKET, SO_LINGER, &lg, sizeof lg));
	CHECK_SYS(getsockopt(c2, SOL_SOCKET, SO_LINGER, &lg2, &ll));
	CHECK(lg2.l_onoff == 1 && lg2.l_linger == 0, "SO_LINGER");
	snprintf(what, sizeof what, "%s setsockopt bad level", kind);
	expect_err(setsockopt(c2, 12345, 1, &one, sizeof one), ENOPROTOOPT, what);

	/* ioctl: FIONBIO on and off, FIONREAD. */
	CHECK_SYS(ioctl(s2, FIONBIO, &one));
	int nb1 = !!(flflags(s2) & O_NONBLOCK);
	char buf[64];
	errno = 0;
	long rr = recv(s2, buf, 1, 0);
	int e2 = errno;
	int zero = 0;
	CHECK_SYS(ioctl(s2, FIONBIO, &zero));
	int nb0 = !!(flflags(s2) & O_NONBLOCK);
	out("%s ioctl FIONBIO on: nonblock=%d recv=%ld %s; off: nonblock=%d", kind,
	    nb1, rr, ename(e2), nb0);
	CHECK(nb1 && !nb0 && rr == -1 && e2 == EAGAIN, "FIONBIO");
	CHECK(send(c2, "0123456789", 10, 0) == 10, "send 10");
	p = (struct pollfd){s2, POLLIN, 0};
	CHECK(poll(&p, 1, 5000) == 1, "readable");
	int q = 0;
	CHECK_SYS(ioctl(s2, FIONREAD, &q));
	out("%s ioctl FIONREAD=%d", kind, q);
	CHECK(q == 10, "FIONREAD");
	CHECK(recv(s2, buf, 10, MSG_WAITALL) == 10 && !memcmp(buf, "0123456789", 10), "data");

	/* fcntl and fcntl64. */
	CHECK_SYS(fcntl(s2, F_SETFL, flflags(s2) | O_NONBLOCK));
	int g1 = !!(fcntl64(s2, F_GETFL) & O_NONBLOCK);
	CHECK_SYS(fcntl64(s2, F_SETFL, fcntl64(s2, F_GETFL) & ~O_NONBLOCK));
	int g2 = !!(fcntl(s2, F_GETFL) & O_NONBLOCK);
	CHECK_SYS(fcntl64(s2, F_SETFD, 0));
	int g3 = fcntl(s2, F_GETFD);
	int hi = CHECK_SYS(fcntl(s2, F_DUPFD_CLOEXEC, 300));
	int hi64 = CHECK_SYS(fcntl64(s2, F_DUPFD, 310));
	out("%s fcntl/fcntl64: nonblock=%d then %d, cloexec cleared=%d, "
	    "F_DUPFD_CLOEXEC>=300:%d cloexec=%d, fcntl64 F_DUPFD>=310:%d",
	    kind, g1, g2, g3 == 0, hi >= 300, !!(fdflags(hi) & FD_CLOEXEC), hi64 >= 310);
	CHECK(g1 && !g2 && g3 == 0 && hi >= 300 && hi64 >= 310, "fcntl");
	echo1(c2, hi, "F_DUPFD_CLOEXEC");
	echo1(c2, hi64, "fcntl64 F_DUPFD");
	CHECK_SYS(close(hi));
	CHECK_SYS(close(hi64));
	snprintf(what, sizeof what, "%s fcntl on closed fd", kind);
	expect_err(fcntl(hi, F_GETFL), EBADF, what);

	/* dup, dup2, dup3: the copies carry the same connection. */
	int d = CHECK_SYS(dup(s2));
	echo1(c2, d, "dup");
	int target = 400;
	int other = CHECK_SYS(socket(fam, SOCK_DGRAM, 0));
	CHECK(dup2(other, target) == target, "dup2 other");
	CHECK_SYS(close(other));
	CHECK(dup2(d, target) == target, "dup2 over an open fd");
	sl = sizeof v;
	CHECK_SYS(getsockopt(target, SOL_SOCKET, SO_TYPE, &v, &sl));
	CHECK(v == SOCK_STREAM, "dup2 replaced the old socket");
	echo1(c2, target, "dup2");
	CHECK(dup2(target, target) == target, "dup2 same fd");
	snprintf(what, sizeof what, "%s dup3 same fd", kind);
	expect_err(dup3(target, target, 0), EINVAL, what);
	CHECK(dup3(d, target + 1, O_CLOEXEC) == target + 1, "dup3");
	CHECK(fdflags(target + 1) & FD_CLOEXEC, "dup3 O_CLOEXEC");
	echo1(c2, target + 1, "dup3");
	/* Closing the original keeps the copies working. */
	CHECK_SYS(close(s2));
	CHECK_SYS(close(d));
	echo1(c2, target, "dup2 after original closed");
	out("%s dup/dup2/dup3: copies work, dup2 same fd ok, originals closed ok", kind);

	/* close_range and closefrom on a block of sockets at high fds. */
	int base = 500;
	for (int i = 0; i < 6; i++)
		CHECK(dup2(target, base + i) == base + i, "dup2 block");
	CHECK_SYS(close_range((unsigned)base, (unsigned)base + 1, CLOSE_RANGE_CLOEXEC));
	int cx = (fdflags(base) & FD_CLOEXEC) && (fdflags(base + 1) & FD_CLOEXEC);
	CHECK_SYS(close_range((unsigned)base, (unsigned)base + 2, 0));
	errno = 0;
	int bad = fcntl(base + 2, F_GETFD) == -1 && errno == EBADF;
	echo1(c2, base + 3, "after close_range");
	closefrom(base + 3);
	errno = 0;
	int bad2 = fcntl(base + 5, F_GETFD) == -1 && errno == EBADF;
	out("%s close_range CLOEXEC=%d closed=%d, closefrom closed=%d", kind, cx, bad, bad2);
	CHECK(cx && bad && bad2, "close_range/closefrom");
	echo1(c2, target, "survivor after closefrom above it");

	/* shutdown directions. */
	CHECK_SYS(shutdown(target, SHUT_RD));
	CHECK_SYS(shutdown(c2, SHUT_WR));
	rr = recv(target, buf, 1, 0);
	out("%s after SHUT_RD + peer SHUT_WR: recv=%ld", kind, rr);
	CHECK(rr == 0, "EOF after shutdown");
	CHECK(send(target, "x", 1, MSG_NOSIGNAL) == 1, "half-closed send");
	CHECK(recv(c2, buf, 1, 0) == 1, "half-closed recv");
	CHECK_SYS(shutdown(target, SHUT_RDWR));
	rr = recv(c2, buf, 1, 0);
	CHECK(rr == 0, "EOF after SHUT_RDWR");
	int u = CHECK_SYS(socket(fam, SOCK_STREAM, 0));
	snprintf(what, sizeof what, "%s shutdown unconnected", kind);
	expect_err(shutdown(u, SHUT_RDWR), ENOTCONN, what);
	pl = sizeof pn;
	snprintf(what, sizeof what, "%s getpeername unconnected", kind);
	expect_err(getpeername(u, &pn.sa, &pl), ENOTCONN, what);

	/* close, then everything on the fd is EBADF. */
	CHECK_SYS(close(target + 1));
	CHECK_SYS(close(target));
	snprintf(what, sizeof what, "%s close twice", kind);
	expect_err(close(target), EBADF, what);
	snprintf(what, sizeof what, "%s send on closed fd", kind);
	expect_err(send(target, "x", 1, 0), EBADF, what);
	snprintf(what, sizeof what, "%s getsockname on closed fd", kind);
	alen = sizeof a;
	expect_err(getsockname(target, &a.sa, &alen), EBADF, what);

	/* Blocking connect to a port nobody listens on: ECONNREFUSED; the
	 * same non-blocking: EINPROGRESS then SO_ERROR ECONNREFUSED. */
	int dead = CHECK_SYS(socket(fam, SOCK_STREAM, 0));
	alen = loopback(fam, &a, 0);
	CHECK_SYS(bind(dead, &a.sa, alen));
	alen = sizeof a;
	CHECK_SYS(getsockname(dead, &a.sa, &alen));
	snprintf(what, sizeof what, "%s blocking connect refused", kind);
	expect_err(connect(u, &a.sa, alen), ECONNREFUSED, what);
	int nb = CHECK_SYS(socket(fam, SOCK_STREAM | SOCK_NONBLOCK, 0));
	r = connect(nb, &a.sa, alen);
	e = errno;
	p = (struct pollfd){nb, POLLOUT, 0};
	CHECK(poll(&p, 1, 5000) == 1, "refused connect completes");
	sl = sizeof soerr;
	CHECK_SYS(getsockopt(nb, SOL_SOCKET, SO_ERROR, &soerr, &sl));
	out("%s nonblocking connect refused: %d %s, SO_ERROR=%s", kind, r,
	    r < 0 ? (e == EINPROGRESS || e == ECONNREFUSED ? "EINPROGRESS-or-ECONNREFUSED" : ename(e)) : "OK",
	    r < 0 && e == ECONNREFUSED ? "ECONNREFUSED" : ename(soerr));
	CHECK(r == -1 && (e == EINPROGRESS || e == ECONNREFUSED), "refused");
	CHECK(e == ECONNREFUSED || soerr == ECONNREFUSED, "SO_ERROR refused");

	/* UDP connect, send, recv. */
	uint16_t up;
	int ul = listener(fam, SOCK_DGRAM, &up);
	int uc = CHECK_SYS(socket(fam, SOCK_DGRAM, 0));
	alen = loopback(fam, &a, up);
	CHECK_SYS(connect(uc, &a.sa, alen));
	CHECK(send(uc, "dgram", 5, 0) == 5, "udp send");
	CHECK(recv(ul, buf, sizeof buf, 0) == 5 && !memcmp(buf, "dgram", 5), "udp recv");
	out("%s udp connect/send/recv ok", kind);

	close(c), close(s), close(c2), close(l), close(u), close(dead), close(nb),
	    close(ul), close(uc);
}

/* errno is the contract: a call that succeeds leaves it alone. */
#define KEEPS_ERRNO(call)                                                       \
	do {                                                                    \
		errno = EDOM;                                                   \
		long _r = (long)(call);                                         \
		int _e = errno;                                                 \
		CHECK(_r >= 0, "%s failed", #call);                             \
		CHECK(_e == EDOM, "%s succeeded but changed errno to %s", #call, \
		      ename(_e));                                               \
		kept++;                                                         \
	} while (0)

static void on_alarm(int sig) { (void)sig; }

static void errno_test(int fam, const char *kind)
{
	int c, s, kept = 0, one = 1, v;
	socklen_t vl = sizeof v;
	char b[16];
	addr_t a;
	socklen_t al = sizeof a;
	tcp_pair(fam, &c, &s);
	KEEPS_ERRNO(send(c, "0123456789", 10, 0));
	KEEPS_ERRNO(recv(s, b, 5, 0));
	KEEPS_ERRNO(read(s, b, 5));
	KEEPS_ERRNO(write(s, "ab", 2));
	struct pollfd p = {c, POLLIN, 0};
	KEEPS_ERRNO(poll(&p, 1, 1000));
	KEEPS_ERRNO(recv(c, b, 2, MSG_WAITALL));
	KEEPS_ERRNO(fcntl(c, F_GETFL));
	KEEPS_ERRNO(setsockopt(c, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one));
	KEEPS_ERRNO(getsockopt(c, SOL_SOCKET, SO_KEEPALIVE, &v, &vl));
	KEEPS_ERRNO(getsockname(c, &a.sa, &al));
	al = sizeof a;
	KEEPS_ERRNO(getpeername(c, &a.sa, &al));
	KEEPS_ERRNO(ioctl(c, FIONBIO, &one));
	int d;
	KEEPS_ERRNO(d = dup(c));
	KEEPS_ERRNO(close(d));
	int n;
	KEEPS_ERRNO(n = socket(fam, SOCK_STREAM, 0));
	KEEPS_ERRNO(close(n));

	/* A blocking recv interrupted by a signal without SA_RESTART: EINTR. */
	struct sigaction sa = {0};
	sa.sa_handler = on_alarm;
	CHECK_SYS(sigaction(SIGALRM, &sa, NULL));
	struct itimerval it = {{0, 0}, {0, 30000}};
	CHECK_SYS(setitimer(ITIMER_REAL, &it, NULL));
	errno = 0;
	long r = recv(s, b, sizeof b, 0);
	int e = errno;
	out("%s errno kept by %d successful calls; blocking recv + signal: %ld %s", kind, kept,
	    r, ename(e));
	CHECK(r == -1 && e == EINTR, "EINTR expected");
	KEEPS_ERRNO(shutdown(c, SHUT_WR));
	KEEPS_ERRNO(recv(s, b, sizeof b, 0)); /* EOF */
	close(c), close(s);
}

int main(void)
{
	prog_name = "lifecycle";
	errno_test(AF_INET, "tcp4");
	errno_test(AF_INET6, "tcp6");
	family_test(AF_INET, "tcp4");
	family_test(AF_INET6, "tcp6");
	/* Calls on a bad fd number. */
	expect_err(close(-1), EBADF, "close(-1)");
	expect_err(dup(-1), EBADF, "dup(-1)");
	expect_err(dup2(-1, 5000), EBADF, "dup2(-1)");
	expect_err(listen(0x7fff, 1), EBADF, "listen(bad fd)");
	int p[2];
	CHECK_SYS(pipe(p));
	expect_err(listen(p[0], 1), ENOTSOCK, "listen(pipe)");
	expect_err(accept(p[0], NULL, NULL), ENOTSOCK, "accept(pipe)");
	close(p[0]), close(p[1]);
	out("lifecycle: all checks passed");
	return 0;
}
