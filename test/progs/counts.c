/*
 * counts: a fixed number of each interposed call on TCP sockets, and
 * another fixed number of the same calls on pipes, unix sockets and UDP
 * sockets. Under RADIC_TEST_MANAGE=1 every TCP socket is managed, so the
 * shim's Go side must see exactly the TCP calls (test/shim counts the
 * expected numbers in TestManagedCallsReachGo) and none of the others.
 *
 * Every call's result is checked; nothing here goes through a helper that
 * makes calls of its own on a socket, so the numbers are exact.
 */
#include "common.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/sendfile.h>
#include <sys/uio.h>

static char msg[16] = "0123456789abcdef", in[64];

#define EQ(expr, want)                                                          \
	do {                                                                    \
		long _v = (long)(expr);                                         \
		if (_v >= 0)                                                    \
			errno = 0; /* a wrong count, not a failed call */       \
		CHECK(_v == (long)(want), "%s = %ld, want %ld", #expr, _v, (long)(want)); \
	} while (0)

/* Waiting calls on one fd, for readability, each exactly once. */
static void wait_all(int fd, int times_poll, int times_ppoll, int times_select,
		     int times_pselect)
{
	struct pollfd p = {fd, POLLIN, 0};
	struct timespec ts = {1, 0};
	for (int i = 0; i < times_poll; i++)
		EQ(poll(&p, 1, 1000), 1);
	for (int i = 0; i < times_ppoll; i++)
		EQ(ppoll(&p, 1, &ts, NULL), 1);
	for (int i = 0; i < times_select; i++) {
		fd_set rs;
		FD_ZERO(&rs);
		FD_SET(fd, &rs);
		struct timeval tv = {1, 0};
		EQ(select(fd + 1, &rs, NULL, NULL, &tv), 1);
	}
	for (int i = 0; i < times_pselect; i++) {
		fd_set rs;
		FD_ZERO(&rs);
		FD_SET(fd, &rs);
		EQ(pselect(fd + 1, &rs, NULL, NULL, &ts, NULL), 1);
	}
}

/* data: the data calls between a writer w and a reader r, k times each.
 * stream is 1 for stream sockets and pipes (send/recv only on sockets). */
static void data(int w, int r, int k, int sock)
{
	struct iovec iov[2] = {{msg, 8}, {msg + 8, 8}};
	struct iovec riov[2] = {{in, 8}, {in + 8, 8}};
	for (int i = 0; i < k; i++) {
		EQ(write(w, msg, 16), 16);
		EQ(read(r, in, 16), 16);
		EQ(writev(w, iov, 2), 16);
		EQ(readv(r, riov, 2), 16);
		if (!sock)
			continue;
		EQ(send(w, msg, 16, 0), 16);
		EQ(recv(r, in, 16, 0), 16);
		EQ(sendto(w, msg, 16, 0, NULL, 0), 16);
		EQ(recvfrom(r, in, 16, 0, NULL, NULL), 16);
		struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
		EQ(sendmsg(w, &mh, 0), 16);
		struct msghdr rh = {.msg_iov = riov, .msg_iovlen = 2};
		EQ(recvmsg(r, &rh, 0), 16);
	}
	CHECK(!memcmp(in, msg, 16), "data");
}

int main(void)
{
	prog_name = "counts";
	addr_t a;
	socklen_t al;
	int one = 1, zero = 0;

	/* ---------------- TCP: all counted ---------------- */
	int l = CHECK_SYS(socket(AF_INET, SOCK_STREAM, 0));               /* socket 1 */
	CHECK_SYS(setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one)); /* setsockopt 1 */
	al = loopback(AF_INET, &a, 0);
	CHECK_SYS(bind(l, &a.sa, al));                                     /* bind 1 */
	CHECK_SYS(listen(l, 8));                                           /* listen 1 */
	al = sizeof a;
	CHECK_SYS(getsockname(l, &a.sa, &al));                             /* getsockname 1 */
	int c = CHECK_SYS(socket(AF_INET, SOCK_STREAM, 0));                /* socket 2 */
	CHECK_SYS(connect(c, &a.sa, al));                                  /* connect 1 */
	int s = CHECK_SYS(accept(l, NULL, NULL));                          /* accept 1 */
	int c2 = CHECK_SYS(socket(AF_INET, SOCK_STREAM, 0));               /* socket 3 */
	CHECK_SYS(connect(c2, &a.sa, al));                                 /* connect 2 */
	int s2 = CHECK_SYS(accept4(l, NULL, NULL, SOCK_CLOEXEC));          /* accept4 1 */
	addr_t pn;
	socklen_t pl = sizeof pn;
	CHECK_SYS(getpeername(c, &pn.sa, &pl));                            /* getpeername 1 */
	int type;
	socklen_t tl = sizeof type;
	CHECK_SYS(getsockopt(c, SOL_SOCKET, SO_TYPE, &type, &tl));         /* getsockopt 1 */
	EQ(type, SOCK_STREAM);
	int fl = CHECK_SYS(fcntl(c, F_GETFL));                             /* fcntl 1 */
	EQ(fcntl64(s, F_GETFL), fl);                                       /* fcntl64 1 */
	CHECK_SYS(ioctl(s, FIONBIO, &one));                                /* ioctl 1 */
	CHECK_SYS(ioctl(s, FIONBIO, &zero));                               /* ioctl 2 */
	out("tcp: set up 3 sockets, 2 accepted");

	/* write/read/writev/readv/send/recv/sendto/recvfrom/sendmsg/recvmsg
	 * x20 (more than 97 reads: the broken test library drops a byte on
	 * every 97th, so this program notices it too) */
	data(c, s, 20, 1);
	out("tcp: data calls x20 checked");

	/* sendmmsg / recvmmsg: one call each. */
	struct iovec mi[2] = {{msg, 8}, {msg + 8, 8}};
	struct mmsghdr mm[2] = {{.msg_hdr = {.msg_iov = &mi[0], .msg_iovlen = 1}},
				{.msg_hdr = {.msg_iov = &mi[1], .msg_iovlen = 1}}};
	EQ(sendmmsg(c, mm, 2, 0), 2);                                     /* sendmmsg 1 */
	struct iovec ri = {in, 16};
	struct mmsghdr rm = {.msg_hdr = {.msg_iov = &ri, .msg_iovlen = 1}};
	EQ(recvmmsg(s, &rm, 1, MSG_WAITALL, NULL), 1);                     /* recvmmsg 1 */
	EQ(rm.msg_len, 16);

	/* sendfile from a memfd into TCP; splice TCP -> pipe -> TCP. */
	int mf = CHECK_SYS(memfd_create("counts", 0));
	EQ(write(mf, msg, 16), 16);                                        /* (memfd: not counted) */
	off_t off = 0;
	EQ(sendfile(c, mf, &off, 16), 16);                                 /* sendfile 1 */
	EQ(recv(s, in, 16, MSG_WAITALL), 16);                              /* recv 21 */
	int p[2];
	CHECK_SYS(pipe(p));
	EQ(send(c, msg, 16, 0), 16);                                       /* send 21 */
	EQ(splice(s, NULL, p[1], NULL, 16, 0), 16);                        /* splice 1 */
	EQ(splice(p[0], NULL, c2, NULL, 16, 0), 16);                       /* splice 2 */
	EQ(read(s2, in, 16), 16);                                          /* read 21 */
	out("tcp: sendmmsg/recvmmsg/sendfile/splice checked");

	/* Waiting: s readable (data queued). */
	EQ(write(c, msg, 16), 16);                                         /* write 21 */
	wait_all(s, 3, 1, 2, 1);                                           /* poll 3 ppoll 1 select 2 pselect 1 */
	struct pollfd mix[2] = {{p[0], POLLIN, 0}, {s, POLLIN, 0}};
	EQ(poll(mix, 2, 1000), 1);                                         /* poll 4: a managed fd in the set */
	int ep = CHECK_SYS(epoll_create1(0));
	struct epoll_event e = {.events = EPOLLIN, .data.fd = s}, o;
	CHECK_SYS(epoll_ctl(ep, EPOLL_CTL_ADD, s, &e));                    /* epoll_ctl 1 */
	EQ(epoll_wait(ep, &o, 1, 1000), 1);                                /* epoll_wait 1 */
	EQ(epoll_wait(ep, &o, 1, 1000), 1);                                /* epoll_wait 2 */
	EQ(epoll_pwait(ep, &o, 1, 1000, NULL), 1);                         /* epoll_pwait 1 */
	struct timespec ts = {1, 0};
	EQ(epoll_pwait2(ep, &o, 1, &ts, NULL), 1);                         /* epoll_pwait2 1 */
	CHECK_SYS(epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL));                  /* epoll_ctl 2 */
	EQ(read(s, in, 16), 16);                                           /* read 22 */
	out("tcp: poll/ppoll/select/pselect/epoll checked");

	/* Descriptors: dup, dup2, dup3, shutdown, close. */
	int d = CHECK_SYS(dup(s));                                         /* dup 1 */
	EQ(dup2(s, 200), 200);                                             /* dup2 1 */
	EQ(dup3(s, 201, O_CLOEXEC), 201);                                  /* dup3 1 */
	EQ(send(c, msg, 16, 0), 16);                                       /* send 22 */
	EQ(recv(201, in, 16, 0), 16);                                      /* recv 22: on the copy */
	CHECK_SYS(shutdown(c, SHUT_WR));                                   /* shutdown 1 */
	EQ(recv(200, in, 16, 0), 0);                                       /* recv 23: EOF on the copy */
	CHECK_SYS(close(d));                                               /* close 1 */
	CHECK_SYS(close(200));                                             /* close 2 */
	CHECK_SYS(close(201));                                             /* close 3 */
	CHECK_SYS(close(c));                                               /* close 4 */
	CHECK_SYS(close(s));                                               /* close 5 */
	CHECK_SYS(close(c2));                                              /* close 6 */
	CHECK_SYS(close(s2));                                              /* close 7 */
	CHECK_SYS(close(l));                                               /* close 8 */
	out("tcp: dup/dup2/dup3/shutdown/close checked");

	/* ---------------- not TCP: none counted ---------------- */
	/* Pipe: data x3, waiting, an epoll set of pipes only, fcntl, dup. */
	data(p[1], p[0], 3, 0);
	EQ(write(p[1], msg, 16), 16);
	wait_all(p[0], 2, 2, 2, 2);
	int ep2 = CHECK_SYS(epoll_create1(0)); /* a set that never held TCP */
	e.data.fd = p[0];
	CHECK_SYS(epoll_ctl(ep2, EPOLL_CTL_ADD, p[0], &e));
	EQ(epoll_wait(ep2, &o, 1, 1000), 1);
	EQ(epoll_pwait(ep2, &o, 1, 1000, NULL), 1);
	/* The TCP set again: its TCP fd was deleted, it holds a pipe now. */
	CHECK_SYS(epoll_ctl(ep, EPOLL_CTL_ADD, p[0], &e));
	EQ(epoll_wait(ep, &o, 1, 1000), 1);
	EQ(read(p[0], in, 16), 16);
	CHECK_SYS(fcntl(p[0], F_GETFL));
	CHECK_SYS(fcntl64(p[0], F_GETFL));
	int pd = CHECK_SYS(dup(p[0]));
	EQ(dup2(p[0], 210), 210);
	CHECK_SYS(close(pd));
	CHECK_SYS(close(210));
	out("pipe: data x3, waiting, epoll, fcntl, dup checked");

	/* Unix stream socket pair: data x3 including send/recv families. */
	int u[2];
	CHECK_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, u));
	data(u[0], u[1], 3, 1);
	CHECK_SYS(setsockopt(u[0], SOL_SOCKET, SO_SNDBUF, &one, sizeof one));
	tl = sizeof type;
	CHECK_SYS(getsockopt(u[0], SOL_SOCKET, SO_TYPE, &type, &tl));
	CHECK_SYS(ioctl(u[1], FIONBIO, &one));
	EQ(recv(u[1], in, 16, 0), -1);
	CHECK_SYS(shutdown(u[0], SHUT_WR));
	EQ(read(u[1], in, 16), 0);
	int ul = CHECK_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
	CHECK_SYS(close(ul));
	out("unix: data x3, options, shutdown checked");

	/* UDP over IPv4 (not a stream: not managed). */
	uint16_t up;
	int ua = CHECK_SYS(socket(AF_INET, SOCK_DGRAM, 0));
	al = loopback(AF_INET, &a, 0);
	CHECK_SYS(bind(ua, &a.sa, al));
	al = sizeof a;
	CHECK_SYS(getsockname(ua, &a.sa, &al));
	up = addr_port(&a);
	int ub = CHECK_SYS(socket(AF_INET, SOCK_DGRAM, 0));
	al = loopback(AF_INET, &a, up);
	CHECK_SYS(connect(ub, &a.sa, al));
	for (int i = 0; i < 3; i++) {
		EQ(send(ub, msg, 16, 0), 16);
		EQ(recvfrom(ua, in, 64, 0, NULL, NULL), 16);
		EQ(sendmmsg(ub, mm, 2, 0), 2);
		EQ(recvmmsg(ua, &rm, 1, 0, NULL), 1);
		EQ(recv(ua, in, 64, 0), 8);
	}
	wait_all(ub, 0, 0, 0, 0);
	CHECK_SYS(close(ua));
	CHECK_SYS(close(ub));
	out("udp: data x3 checked");

	close(u[0]), close(u[1]), close(p[0]), close(p[1]), close(ep), close(ep2), close(mf);
	out("counts: all checks passed");
	return 0;
}
