/*
 * waiting: readiness through every interposed waiting call
 *
 *   poll ppoll select pselect epoll_create1 epoll_ctl epoll_wait
 *   epoll_pwait epoll_pwait2
 *
 * For each: an EINPROGRESS connect becoming writable, a listener becoming
 * readable, an idle socket timing out, data and EOF making a socket
 * readable, only the ready fd of a mixed set (pipe, unix, TCP) reported,
 * EINTR from a signal, and a checked 300-message exchange driven by the
 * call on non-blocking sockets. Then epoll specifics: MOD, DEL,
 * edge-triggered and one-shot.
 */
#include "common.h"

#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/time.h>

enum wm { W_POLL, W_PPOLL, W_SELECT, W_PSELECT, W_EPOLL, W_EPWAIT, W_EPWAIT2, W_N };
static const char *wn[] = {"poll", "ppoll", "select", "pselect",
			   "epoll_wait", "epoll_pwait", "epoll_pwait2"};

#define WIN 1
#define WOUT 2
#define WHUP 4

/* waitfds: wait for ev[i] on fd[i] with method m; sets rev[i]; returns the
 * number of ready fds, or -1 with errno. */
static int waitfds(enum wm m, int n, const int *fd, const int *ev, int *rev,
		   int timeout_ms)
{
	struct timespec ts = {timeout_ms / 1000, (timeout_ms % 1000) * 1000000L};
	struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
	sigset_t mask;
	sigemptyset(&mask);
	int r = 0;
	for (int i = 0; i < n; i++)
		rev[i] = 0;
	if (m == W_POLL || m == W_PPOLL) {
		struct pollfd p[8];
		for (int i = 0; i < n; i++)
			p[i] = (struct pollfd){fd[i],
					       (short)((ev[i] & WIN ? POLLIN | POLLRDHUP : 0) |
						       (ev[i] & WOUT ? POLLOUT : 0)),
					       0};
		r = m == W_POLL ? poll(p, (nfds_t)n, timeout_ms)
				: ppoll(p, (nfds_t)n, &ts, &mask);
		if (r < 0)
			return r;
		for (int i = 0; i < n; i++)
			rev[i] = (p[i].revents & POLLIN ? WIN : 0) |
				 (p[i].revents & POLLOUT ? WOUT : 0) |
				 (p[i].revents & (POLLHUP | POLLRDHUP) ? WHUP : 0);
	} else if (m == W_SELECT || m == W_PSELECT) {
		fd_set rs, ws;
		FD_ZERO(&rs);
		FD_ZERO(&ws);
		int mx = -1;
		for (int i = 0; i < n; i++) {
			if (ev[i] & WIN)
				FD_SET(fd[i], &rs);
			if (ev[i] & WOUT)
				FD_SET(fd[i], &ws);
			if (fd[i] > mx)
				mx = fd[i];
		}
		r = m == W_SELECT ? select(mx + 1, &rs, &ws, NULL, &tv)
				  : pselect(mx + 1, &rs, &ws, NULL, &ts, &mask);
		if (r < 0)
			return r;
		for (int i = 0; i < n; i++)
			rev[i] = (FD_ISSET(fd[i], &rs) ? WIN : 0) |
				 (FD_ISSET(fd[i], &ws) ? WOUT : 0);
	} else {
		int ep = CHECK_SYS(epoll_create1(EPOLL_CLOEXEC));
		for (int i = 0; i < n; i++) {
			struct epoll_event e = {
			    .events = (ev[i] & WIN ? EPOLLIN | EPOLLRDHUP : 0) |
				      (ev[i] & WOUT ? EPOLLOUT : 0),
			    .data.u32 = (uint32_t)i};
			CHECK_SYS(epoll_ctl(ep, EPOLL_CTL_ADD, fd[i], &e));
		}
		struct epoll_event out[8];
		if (m == W_EPOLL)
			r = epoll_wait(ep, out, 8, timeout_ms);
		else if (m == W_EPWAIT)
			r = epoll_pwait(ep, out, 8, timeout_ms, &mask);
		else
			r = epoll_pwait2(ep, out, 8, &ts, &mask);
		int e = errno;
		CHECK_SYS(close(ep));
		errno = e;
		if (r < 0)
			return r;
		for (int i = 0; i < r; i++)
			rev[out[i].data.u32] =
			    (out[i].events & EPOLLIN ? WIN : 0) |
			    (out[i].events & EPOLLOUT ? WOUT : 0) |
			    (out[i].events & (EPOLLHUP | EPOLLRDHUP) ? WHUP : 0);
	}
	/* select counts an fd once per set: count ready fds instead. */
	int k = 0;
	for (int i = 0; i < n; i++)
		k += rev[i] != 0;
	return k;
}

static int wait1(enum wm m, int fd, int ev, int timeout_ms)
{
	int rev;
	int r = waitfds(m, 1, &fd, &ev, &rev, timeout_ms);
	CHECK(r >= 0, "%s", wn[m]);
	return r ? rev : 0;
}

static void on_alarm(int sig) { (void)sig; }

static void method_test(enum wm m, int fam)
{
	const char *kind = fam == AF_INET ? "tcp4" : "tcp6";
	uint16_t port;
	int l = listener(fam, SOCK_STREAM, &port);
	set_nonblock(l, 1);

	/* EINPROGRESS connect, then writable. */
	addr_t a;
	socklen_t al = loopback(fam, &a, port);
	int c = CHECK_SYS(socket(fam, SOCK_STREAM | SOCK_NONBLOCK, 0));
	int r = connect(c, &a.sa, al);
	CHECK(r == 0 || errno == EINPROGRESS, "connect");
	int cw = wait1(m, c, WOUT, 5000);
	int lr = wait1(m, l, WIN, 5000);
	int s = CHECK_SYS(accept4(l, NULL, NULL, SOCK_NONBLOCK));
	int soerr = -1;
	socklen_t sl = sizeof soerr;
	CHECK_SYS(getsockopt(c, SOL_SOCKET, SO_ERROR, &soerr, &sl));

	/* Idle: nothing readable, timeout. */
	int idle = wait1(m, s, WIN, 20);
	/* Data: readable. */
	CHECK(send(c, "ping", 4, 0) == 4, "send");
	int dr = wait1(m, s, WIN, 5000);
	char buf[4096];
	CHECK(recv(s, buf, sizeof buf, 0) == 4, "recv 4");

	/* Mixed set: pipe, unix socket, TCP; only TCP has data. */
	int p[2], u[2];
	CHECK_SYS(pipe(p));
	CHECK_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, u));
	CHECK(write(c, "x", 1) == 1, "write");
	int fds[3] = {p[0], u[0], s}, evs[3] = {WIN, WIN, WIN}, rev[3];
	/* wait until the byte is there, then look at the whole set */
	CHECK(wait1(m, s, WIN, 5000) & WIN, "tcp readable");
	r = waitfds(m, 3, fds, evs, rev, 1000);
	int only = r == 1 && rev[0] == 0 && rev[1] == 0 && (rev[2] & WIN);
	CHECK(read(s, buf, 1) == 1, "read 1");
	/* and the other way: only the pipe */
	CHECK(write(p[1], "y", 1) == 1, "pipe write");
	r = waitfds(m, 3, fds, evs, rev, 1000);
	int onlypipe = r == 1 && (rev[0] & WIN) && rev[1] == 0 && rev[2] == 0;
	CHECK(read(p[0], buf, 1) == 1, "pipe read");

	/* EINTR: a signal (no SA_RESTART) during an indefinite wait. */
	struct sigaction sa = {0};
	sa.sa_handler = on_alarm;
	CHECK_SYS(sigaction(SIGALRM, &sa, NULL));
	struct itimerval it = {{0, 0}, {0, 30000}};
	CHECK_SYS(setitimer(ITIMER_REAL, &it, NULL));
	int fd1 = s, ev1 = WIN, rv1;
	errno = 0;
	r = waitfds(m, 1, &fd1, &ev1, &rv1, 10000);
	int eintr = errno;
	CHECK(r == -1 && eintr == EINTR, "%s: EINTR expected, got %d", wn[m], r);

	/* A 300-message exchange driven by the waiting call, with
	 * non-blocking sockets and messages of growing size. */
	uint64_t sent = 0, got = 0, back = 0;
	static char big[20000];
	for (int i = 0; i < 300; i++) {
		size_t n = 1 + (size_t)i * 61 % 19000;
		fill(big, n, 900 + (uint32_t)fam, sent);
		size_t off = 0;
		while (off < n) {
			ssize_t w = send(c, big + off, n - off, MSG_DONTWAIT | MSG_NOSIGNAL);
			if (w < 0) {
				CHECK(errno == EAGAIN, "send");
				CHECK(wait1(m, c, WOUT, 5000) & WOUT, "writable");
				continue;
			}
			off += (size_t)w;
		}
		sent += n;
		while (got < sent) {
			if (!(wait1(m, s, WIN, 5000) & WIN))
				CHECK(0, "%s: not readable, %llu of %llu", wn[m],
				      (unsigned long long)got, (unsigned long long)sent);
			ssize_t rr = recv(s, buf, sizeof buf, 0);
			if (rr < 0 && errno == EAGAIN)
				continue;
			CHECK(rr > 0, "recv");
			VERIFY(buf, (size_t)rr, 900 + (uint32_t)fam, got);
			got += (size_t)rr;
		}
		/* a one-byte acknowledgement back */
		CHECK(write(s, "k", 1) == 1, "ack");
		CHECK(wait1(m, c, WIN, 5000) & WIN, "ack readable");
		CHECK(read(c, buf, 1) == 1 && buf[0] == 'k', "ack");
		back++;
	}

	/* EOF: readable (and hang-up where the call reports it). */
	CHECK_SYS(close(c));
	int eof = wait1(m, s, WIN, 5000);
	CHECK(recv(s, buf, 1, 0) == 0, "EOF");

	out("%s %s: connect-writable=%d listener-readable=%d SO_ERROR=%s idle=%d "
	    "data-readable=%d only-tcp=%d only-pipe=%d signal=%s exchange=%llu/%llu "
	    "eof-readable=%d hup=%d",
	    wn[m], kind, !!(cw & WOUT), !!(lr & WIN), ename(soerr), idle, !!(dr & WIN),
	    only, onlypipe, ename(eintr), (unsigned long long)back,
	    (unsigned long long)got, !!(eof & WIN), !!(eof & WHUP));
	CHECK((cw & WOUT) && (lr & WIN) && soerr == 0 && idle == 0 && (dr & WIN) &&
		  only && onlypipe && (eof & WIN),
	      "%s readiness", wn[m]);
	close(s), close(l), close(p[0]), close(p[1]), close(u[0]), close(u[1]);
}

/* epoll specifics on one epoll set: MOD, DEL, EPOLLET, EPOLLONESHOT. */
static void epoll_specifics(void)
{
	int c, s;
	tcp_pair(AF_INET, &c, &s);
	set_nonblock(s, 1);
	int ep = CHECK_SYS(epoll_create1(0));
	struct epoll_event e = {.events = EPOLLIN | EPOLLET, .data.fd = s}, o[4];
	CHECK_SYS(epoll_ctl(ep, EPOLL_CTL_ADD, s, &e));
	int dup_add = epoll_ctl(ep, EPOLL_CTL_ADD, s, &e);
	int dup_err = errno;
	CHECK(write(c, "abc", 3) == 3, "write");
	int et1 = epoll_wait(ep, o, 4, 5000);
	int et2 = epoll_wait(ep, o, 4, 20); /* edge already consumed */
	char b[8];
	CHECK(read(s, b, 8) == 3, "read");
	/* MOD to level-triggered one-shot. */
	e.events = EPOLLIN | EPOLLONESHOT;
	CHECK_SYS(epoll_ctl(ep, EPOLL_CTL_MOD, s, &e));
	CHECK(write(c, "d", 1) == 1, "write");
	int os1 = epoll_pwait(ep, o, 4, 5000, NULL);
	int os2 = epoll_wait(ep, o, 4, 20); /* disarmed */
	e.events = EPOLLIN;
	CHECK_SYS(epoll_ctl(ep, EPOLL_CTL_MOD, s, &e));
	int lt1 = epoll_wait(ep, o, 4, 5000);
	int lt2 = epoll_wait(ep, o, 4, 5000); /* level: still there */
	CHECK_SYS(epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL));
	int del = epoll_wait(ep, o, 4, 20);
	int del2 = epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL);
	int del2_err = errno;
	out("epoll: ADD twice=%d %s, ET=%d then %d, ONESHOT=%d then %d, LT=%d,%d, "
	    "after DEL=%d, DEL twice=%d %s",
	    dup_add, ename(dup_err), et1, et2, os1, os2, lt1, lt2, del, del2,
	    ename(del2_err));
	CHECK(dup_add == -1 && dup_err == EEXIST && et1 == 1 && et2 == 0 &&
		  os1 == 1 && os2 == 0 && lt1 == 1 && lt2 == 1 && del == 0 &&
		  del2 == -1 && del2_err == ENOENT,
	      "epoll semantics");
	/* Closing a registered fd removes it from the set. */
	e.events = EPOLLIN;
	CHECK_SYS(epoll_ctl(ep, EPOLL_CTL_ADD, s, &e));
	CHECK_SYS(close(s));
	int closed = epoll_wait(ep, o, 4, 20);
	out("epoll: after closing the registered fd: %d", closed);
	CHECK(closed == 0, "closed fd reported");
	close(c), close(ep);
}

int main(void)
{
	prog_name = "waiting";
	for (int m = 0; m < W_N; m++) {
		method_test((enum wm)m, AF_INET);
		method_test((enum wm)m, AF_INET6);
	}
	epoll_specifics();
	out("waiting: all checks passed");
	return 0;
}
