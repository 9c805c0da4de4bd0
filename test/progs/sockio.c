/*
 * sockio: every interposed data call, blocking and non-blocking, on TCP
 * (IPv4 and IPv6), UDP, unix sockets and pipes.
 *
 *   read write readv writev send sendto sendmsg recv recvfrom recvmsg
 *   sendmmsg recvmmsg sendfile sendfile64 splice
 *
 * with partial reads and writes (small SO_SNDBUF/SO_RCVBUF, small buffers),
 * MSG_WAITALL, MSG_PEEK, MSG_DONTWAIT, MSG_NOSIGNAL, EAGAIN, EPIPE, EOF.
 * Every byte received is checked against the sender's stream.
 */
#include "common.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/uio.h>

enum method { M_RW, M_V, M_SR, M_TO, M_MSG, M_MMSG, M_WAITALL, M_NMETHODS };
static const char *wname[] = {"write", "writev", "send", "sendto",
			      "sendmsg", "sendmmsg", "send"};
static const char *rname[] = {"read", "readv", "recv", "recvfrom",
			      "recvmsg", "recvmmsg", "recv(MSG_WAITALL)"};

/* A small deterministic generator for chunk sizes. */
static uint32_t lcg(uint32_t *s)
{
	*s = *s * 1664525u + 1013904223u;
	return *s >> 8;
}

/* xsend: one call of method m, returns what the call returned. */
static ssize_t xsend(int fd, enum method m, const char *p, size_t n, int flags)
{
	struct iovec iov[3];
	size_t a = n / 3, b = n / 4;
	switch (m) {
	case M_RW:
		return write(fd, p, n);
	case M_V:
		iov[0] = (struct iovec){(void *)p, a};
		iov[1] = (struct iovec){(void *)(p + a), b};
		iov[2] = (struct iovec){(void *)(p + a + b), n - a - b};
		return writev(fd, iov, 3);
	case M_SR:
	case M_WAITALL:
		return send(fd, p, n, flags);
	case M_TO:
		return sendto(fd, p, n, flags, NULL, 0);
	case M_MSG: {
		iov[0] = (struct iovec){(void *)p, a};
		iov[1] = (struct iovec){(void *)(p + a), n - a};
		struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
		return sendmsg(fd, &mh, flags);
	}
	case M_MMSG: {
		/* Two messages in one call; on a stream socket the second
		 * is sent only if the first went out whole. */
		iov[0] = (struct iovec){(void *)p, a};
		iov[1] = (struct iovec){(void *)(p + a), n - a};
		struct mmsghdr mm[2] = {
		    {.msg_hdr = {.msg_iov = &iov[0], .msg_iovlen = 1}},
		    {.msg_hdr = {.msg_iov = &iov[1], .msg_iovlen = 1}},
		};
		if (!a) {
			iov[0].iov_len = n;
			mm[0].msg_hdr.msg_iovlen = 1;
		}
		int r = sendmmsg(fd, mm, a ? 2 : 1, flags);
		if (r <= 0)
			return r;
		if (!a)
			return (ssize_t)mm[0].msg_len;
		return (ssize_t)mm[0].msg_len + (r == 2 ? (ssize_t)mm[1].msg_len : 0);
	}
	default:
		abort();
	}
}

static ssize_t xrecv(int fd, enum method m, char *p, size_t n, int flags)
{
	struct iovec iov[3];
	size_t a = n / 2, b = n / 3;
	switch (m) {
	case M_RW:
		return read(fd, p, n);
	case M_V:
		iov[0] = (struct iovec){p, a};
		iov[1] = (struct iovec){p + a, b};
		iov[2] = (struct iovec){p + a + b, n - a - b};
		return readv(fd, iov, 3);
	case M_SR:
		return recv(fd, p, n, flags);
	case M_WAITALL:
		return recv(fd, p, n, flags | MSG_WAITALL);
	case M_TO:
		return recvfrom(fd, p, n, flags, NULL, NULL);
	case M_MSG: {
		iov[0] = (struct iovec){p, a};
		iov[1] = (struct iovec){p + a, n - a};
		struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
		return recvmsg(fd, &mh, flags);
	}
	case M_MMSG: {
		iov[0] = (struct iovec){p, n};
		struct mmsghdr mm[1] = {
		    {.msg_hdr = {.msg_iov = &iov[0], .msg_iovlen = 1}}};
		int r = recvmmsg(fd, mm, 1, flags, NULL);
		return r <= 0 ? r : (ssize_t)mm[0].msg_len;
	}
	default:
		abort();
	}
}

/* ---- blocking stream transfer: a writer thread, the reader here ---- */

struct writer {
	int fd;
	enum method m;
	uint32_t stream;
	size_t total;
	int shut; /* shutdown(SHUT_WR) at the end, else close */
};

static void *writer_main(void *arg)
{
	struct writer *w = arg;
	static __thread char buf[70000];
	uint32_t seed = w->stream * 7 + 1;
	size_t done = 0;
	while (done < w->total) {
		size_t n = 1 + lcg(&seed) % 65536;
		if (n > w->total - done)
			n = w->total - done;
		fill(buf, n, w->stream, done);
		size_t sent = 0;
		while (sent < n) {
			ssize_t r = xsend(w->fd, w->m, buf + sent, n - sent,
					  MSG_NOSIGNAL);
			if (r < 0 && errno == EINTR)
				continue;
			CHECK(r > 0, "%s returned %zd", wname[w->m], r);
			sent += (size_t)r;
		}
		done += n;
	}
	if (w->shut)
		CHECK_SYS(shutdown(w->fd, SHUT_WR));
	else
		CHECK_SYS(close(w->fd));
	return NULL;
}

static void stream_test(const char *kind, int wfd, int rfd, enum method wm,
			enum method rm, size_t total, int shut, uint32_t stream)
{
	pthread_t th;
	struct writer w = {wfd, wm, stream, total, shut};
	static char buf[70000];
	uint32_t seed = stream * 13 + 5;
	size_t got = 0;
	CHECK(pthread_create(&th, NULL, writer_main, &w) == 0, "pthread_create");
	for (;;) {
		size_t n = 1 + lcg(&seed) % (rm == M_WAITALL ? 65536 : 4096);
		if (rm == M_WAITALL && n > total - got && got < total)
			n = total - got;
		ssize_t r = xrecv(rfd, rm, buf, n, 0);
		if (r < 0 && errno == EINTR)
			continue;
		CHECK(r >= 0, "%s %s returned %zd", kind, rname[rm], r);
		if (r == 0)
			break;
		if (rm == M_WAITALL)
			CHECK((size_t)r == n, "%s MSG_WAITALL asked %zu got %zd",
			      kind, n, r);
		VERIFY(buf, (size_t)r, stream, got);
		got += (size_t)r;
	}
	CHECK(pthread_join(th, NULL) == 0, "pthread_join");
	CHECK(got == total, "%s %s->%s: got %zu of %zu bytes", kind, wname[wm],
	      rname[rm], got, total);
	out("stream %s %s->%s bytes=%zu eof=yes", kind, wname[wm], rname[rm],
	    got);
}

/* ---- non-blocking: deterministic partial write, EAGAIN, drain ---- */

static void nonblocking_test(const char *kind, int family, enum method wm,
			     enum method rm)
{
	int c, s;
	tcp_pair(family, &c, &s);
	/* A small send buffer makes writes partial; the receive buffer is
	 * left big enough that the receiver's window updates are not held
	 * back (a tiny one leaves the sender on zero-window probe timers). */
	small_bufs(c, 4096);
	set_nonblock(c, 1);
	set_nonblock(s, 1);
	static char buf[1 << 20];
	uint32_t stream = 100 + (uint32_t)wm * 10 + (uint32_t)rm;
	size_t total = 1u << 20, wdone = 0, rdone = 0;
	int partial = 0, weagain = 0, reagain = 0, rounds = 0;

	/* Reading an empty non-blocking socket: EAGAIN. */
	errno = 0;
	ssize_t r = xrecv(s, rm, buf, 100, 0);
	CHECK(r == -1 && errno == EAGAIN, "%s empty %s returned %zd", kind,
	      rname[rm], r);
	out("nonblock %s %s on empty: %zd %s", kind, rname[rm], r,
	    ename(errno));

	while (rdone < total) {
		rounds++;
		/* Fill until EAGAIN: the first write of a big buffer into a
		 * 4 KiB socket buffer is partial. */
		while (wdone < total) {
			size_t n = total - wdone < sizeof buf ? total - wdone
							      : sizeof buf;
			fill(buf, n, stream, wdone);
			r = xsend(c, wm, buf, n, MSG_NOSIGNAL);
			if (r < 0) {
				CHECK(errno == EAGAIN, "%s %s", kind, wname[wm]);
				weagain++;
				break;
			}
			CHECK(r > 0, "%s %s returned 0", kind, wname[wm]);
			if ((size_t)r < n)
				partial++;
			wdone += (size_t)r;
		}
		/* Drain in small pieces until EAGAIN. */
		for (;;) {
			r = xrecv(s, rm, buf, 1 + (rdone % 1500), 0);
			if (r < 0) {
				CHECK(errno == EAGAIN, "%s %s", kind, rname[rm]);
				reagain++;
				break;
			}
			CHECK(r > 0, "%s %s: early EOF", kind, rname[rm]);
			VERIFY(buf, (size_t)r, stream, rdone);
			rdone += (size_t)r;
		}
		if (rdone < total) {
			/* Data may still be in flight: wait for either end. */
			struct pollfd p[2] = {{s, POLLIN, 0}, {c, POLLOUT, 0}};
			CHECK_SYS(poll(p, wdone < total ? 2 : 1, 5000));
		}
	}
	CHECK(partial > 0, "%s: no partial %s with 4 KiB buffers", kind,
	      wname[wm]);
	CHECK(weagain > 0 && reagain > 0, "%s: no EAGAIN", kind);
	out("nonblock %s %s->%s bytes=%zu partial-writes=yes eagain=yes", kind,
	    wname[wm], rname[rm], rdone);
	CHECK_SYS(close(c));
	CHECK_SYS(close(s));
}

/* ---- flags: MSG_PEEK, MSG_DONTWAIT, MSG_WAITALL, MSG_NOSIGNAL ---- */

static void flags_test(int family, const char *kind)
{
	int c, s;
	char buf[256], pk[256];
	tcp_pair(family, &c, &s);

	/* Partial read: ask for more than is there. */
	fill(buf, 100, 7, 0);
	CHECK(send(c, buf, 100, 0) == 100, "send 100");
	ssize_t r = read(s, pk, sizeof pk);
	CHECK(r == 100, "read returned %zd", r);
	VERIFY(pk, 100, 7, 0);
	out("flags %s read asked=256 got=%zd", kind, r);

	/* MSG_PEEK leaves the data; a second peek sees the same. */
	fill(buf, 50, 8, 0);
	CHECK(send(c, buf, 50, 0) == 50, "send 50");
	r = recv(s, pk, 20, MSG_PEEK);
	CHECK(r == 20, "peek returned %zd", r);
	VERIFY(pk, 20, 8, 0);
	r = recv(s, pk, 30, MSG_PEEK);
	CHECK(r == 30, "peek returned %zd", r);
	VERIFY(pk, 30, 8, 0);
	r = recvfrom(s, pk, 10, MSG_PEEK | MSG_DONTWAIT, NULL, NULL);
	CHECK(r == 10, "recvfrom peek returned %zd", r);
	VERIFY(pk, 10, 8, 0);
	r = recv(s, pk, 50, 0);
	CHECK(r == 50, "recv after peek returned %zd", r);
	VERIFY(pk, 50, 8, 0);
	out("flags %s MSG_PEEK 20,30,10 then recv=%zd", kind, r);

	/* MSG_DONTWAIT on a blocking socket with nothing queued. */
	errno = 0;
	r = recv(s, pk, 10, MSG_DONTWAIT);
	out("flags %s recv(MSG_DONTWAIT) empty=%zd %s", kind, r, ename(errno));
	CHECK(r == -1 && errno == EAGAIN, "MSG_DONTWAIT");
	struct msghdr mh = {0};
	struct iovec iov = {pk, 10};
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	errno = 0;
	r = recvmsg(s, &mh, MSG_DONTWAIT);
	out("flags %s recvmsg(MSG_DONTWAIT) empty=%zd %s", kind, r,
	    ename(errno));
	CHECK(r == -1 && errno == EAGAIN, "recvmsg MSG_DONTWAIT");

	/* SO_RCVTIMEO: a blocking recv times out with EAGAIN. */
	struct timeval tv = {0, 20000};
	CHECK_SYS(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
	errno = 0;
	r = read(s, pk, 10);
	out("flags %s read with SO_RCVTIMEO=%zd %s", kind, r, ename(errno));
	CHECK(r == -1 && (errno == EAGAIN), "SO_RCVTIMEO");
	tv.tv_usec = 0;
	CHECK_SYS(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));

	/* MSG_WAITALL across several sends is covered by stream_test. */

	/* shutdown(SHUT_WR): the peer reads EOF, then can still send. */
	CHECK_SYS(shutdown(c, SHUT_WR));
	r = recv(s, pk, 10, 0);
	out("flags %s recv after peer SHUT_WR=%zd", kind, r);
	CHECK(r == 0, "EOF expected");
	fill(buf, 10, 9, 0);
	CHECK(send(s, buf, 10, MSG_NOSIGNAL) == 10, "send back");
	r = recv(c, pk, 10, MSG_WAITALL);
	CHECK(r == 10, "recv back %zd", r);
	VERIFY(pk, 10, 9, 0);

	/* MSG_NOSIGNAL: sending to a closed peer gives EPIPE, no SIGPIPE
	 * (SIGPIPE is at its default here: a signal would kill us). */
	CHECK_SYS(close(c));
	int err = 0, sends = 0;
	for (int i = 0; i < 100 && !err; i++) {
		r = send(s, buf, 10, MSG_NOSIGNAL);
		if (r < 0)
			err = errno;
		else
			sends++;
	}
	out("flags %s send(MSG_NOSIGNAL) to closed peer: %s", kind, ename(err));
	CHECK(err == EPIPE || err == ECONNRESET, "no EPIPE after %d sends",
	      sends);
	CHECK_SYS(close(s));

	/* write() to a closed peer with SIGPIPE ignored: EPIPE. */
	tcp_pair(family, &c, &s);
	CHECK_SYS(close(c));
	signal(SIGPIPE, SIG_IGN);
	err = 0;
	for (int i = 0; i < 100 && !err; i++)
		if (write(s, buf, 10) < 0)
			err = errno;
	signal(SIGPIPE, SIG_DFL);
	out("flags %s write to closed peer (SIGPIPE ignored): %s", kind,
	    ename(err));
	CHECK(err == EPIPE || err == ECONNRESET, "write to closed peer");
	CHECK_SYS(close(s));
}

/* ---- UDP: sendto/recvfrom with addresses, sendmsg/recvmsg,
 * sendmmsg/recvmmsg batches ---- */

static void udp_test(int family, const char *kind)
{
	uint16_t pa, pb;
	int a = listener(family, SOCK_DGRAM, &pa);
	int b = listener(family, SOCK_DGRAM, &pb);
	addr_t to, from;
	socklen_t tolen = loopback(family, &to, pb), flen;
	char buf[2048], rb[2048];

	for (int i = 0; i < 20; i++) {
		size_t n = 1 + (size_t)i * 97;
		fill(buf, n, 200 + (uint32_t)i, 0);
		CHECK(sendto(a, buf, n, 0, &to.sa, tolen) == (ssize_t)n,
		      "sendto");
		flen = sizeof from;
		ssize_t r = recvfrom(b, rb, sizeof rb, 0, &from.sa, &flen);
		CHECK(r == (ssize_t)n, "recvfrom returned %zd want %zu", r, n);
		VERIFY(rb, n, 200 + (uint32_t)i, 0);
		CHECK(addr_port(&from) == pa, "recvfrom: wrong source port");
	}
	out("udp %s sendto/recvfrom 20 datagrams, sources match", kind);

	/* Datagram truncation: MSG_TRUNC reports the real length. */
	fill(buf, 1000, 300, 0);
	CHECK(sendto(a, buf, 1000, 0, &to.sa, tolen) == 1000, "sendto 1000");
	ssize_t r = recv(b, rb, 10, MSG_TRUNC);
	out("udp %s recv(10, MSG_TRUNC) of 1000-byte datagram=%zd", kind, r);
	CHECK(r == 1000, "MSG_TRUNC");
	VERIFY(rb, 10, 300, 0);

	/* sendmsg with a destination, recvmsg with flags. */
	struct iovec iov[2];
	fill(buf, 600, 301, 0);
	iov[0] = (struct iovec){buf, 200};
	iov[1] = (struct iovec){buf + 200, 400};
	struct msghdr mh = {.msg_name = &to,
			    .msg_namelen = tolen,
			    .msg_iov = iov,
			    .msg_iovlen = 2};
	CHECK(sendmsg(a, &mh, 0) == 600, "sendmsg");
	iov[0] = (struct iovec){rb, 100};
	struct msghdr rh = {.msg_name = &from,
			    .msg_namelen = sizeof from,
			    .msg_iov = iov,
			    .msg_iovlen = 1};
	r = recvmsg(b, &rh, 0);
	out("udp %s recvmsg into 100 of 600: %zd trunc=%d", kind, r,
	    !!(rh.msg_flags & MSG_TRUNC));
	CHECK(r == 100 && (rh.msg_flags & MSG_TRUNC), "recvmsg truncation");
	VERIFY(rb, 100, 301, 0);

	/* sendmmsg / recvmmsg: 8 datagrams per call. */
	enum { N = 8 };
	static char mb[N][512], mr[N][512];
	struct mmsghdr mm[N];
	struct iovec mi[N];
	for (int i = 0; i < N; i++) {
		fill(mb[i], 100 + (size_t)i * 40, 400 + (uint32_t)i, 0);
		mi[i] = (struct iovec){mb[i], 100 + (size_t)i * 40};
		mm[i] = (struct mmsghdr){.msg_hdr = {.msg_name = &to,
						     .msg_namelen = tolen,
						     .msg_iov = &mi[i],
						     .msg_iovlen = 1}};
	}
	int k = sendmmsg(a, mm, N, 0);
	CHECK(k == N, "sendmmsg sent %d", k);
	for (int i = 0; i < N; i++) {
		mi[i] = (struct iovec){mr[i], sizeof mr[i]};
		mm[i] = (struct mmsghdr){
		    .msg_hdr = {.msg_iov = &mi[i], .msg_iovlen = 1}};
	}
	k = recvmmsg(b, mm, N, MSG_WAITFORONE, NULL);
	CHECK(k >= 1, "recvmmsg");
	int total = k;
	while (total < N) {
		int m = recvmmsg(b, mm + total, N - total, 0, NULL);
		CHECK(m >= 1, "recvmmsg more");
		total += m;
	}
	for (int i = 0; i < N; i++) {
		CHECK(mm[i].msg_len == 100 + (unsigned)i * 40,
		      "recvmmsg len %u", mm[i].msg_len);
		VERIFY(mr[i], mm[i].msg_len, 400 + (uint32_t)i, 0);
	}
	out("udp %s sendmmsg=%d recvmmsg total=%d", kind, N, total);

	/* Non-blocking recvmmsg on an empty socket. */
	errno = 0;
	k = recvmmsg(b, mm, N, MSG_DONTWAIT, NULL);
	out("udp %s recvmmsg(MSG_DONTWAIT) empty=%d %s", kind, k, ename(errno));
	CHECK(k == -1 && errno == EAGAIN, "recvmmsg empty");
	CHECK_SYS(close(a));
	CHECK_SYS(close(b));
}

/* ---- sendfile / sendfile64 / splice ---- */

struct sink {
	int fd;
	uint32_t stream;
	size_t total;
};

static void *sink_main(void *arg)
{
	struct sink *k = arg;
	static char buf[8192];
	size_t got = 0;
	while (got < k->total) {
		ssize_t r = recv(k->fd, buf, 1 + got % sizeof buf, 0);
		CHECK(r > 0, "sink recv %zd", r);
		VERIFY(buf, (size_t)r, k->stream, got);
		got += (size_t)r;
	}
	return NULL;
}

static void sendfile_test(void)
{
	size_t size = 600000;
	int mf = CHECK_SYS(memfd_create("sockio", 0));
	char *m = malloc(size);
	CHECK(m != NULL, "malloc");
	fill(m, size, 500, 0);
	write_all(mf, m, size);
	free(m);

	for (int v = 0; v < 2; v++) {
		int c, s;
		tcp_pair(AF_INET, &c, &s);
		small_bufs(c, 8192);
		pthread_t th;
		struct sink k = {s, 500, size};
		CHECK(pthread_create(&th, NULL, sink_main, &k) == 0, "thread");
		off_t off = 0;
		off64_t off64 = 0;
		int calls = 0;
		while ((v ? (size_t)off64 : (size_t)off) < size) {
			size_t left = size - (v ? (size_t)off64 : (size_t)off);
			ssize_t r = v ? sendfile64(c, mf, &off64, left)
				      : sendfile(c, mf, &off, left);
			CHECK(r > 0, "%s returned %zd",
			      v ? "sendfile64" : "sendfile", r);
			calls++;
		}
		CHECK(pthread_join(th, NULL) == 0, "join");
		out("%s bytes=%zu", v ? "sendfile64" : "sendfile", size);
		CHECK_SYS(close(c));
		CHECK_SYS(close(s));
	}
	CHECK_SYS(close(mf));
}

static void splice_test(void)
{
	int a1, a2, b1, b2, p[2];
	tcp_pair(AF_INET, &a1, &a2);
	tcp_pair(AF_INET6, &b1, &b2);
	CHECK_SYS(pipe(p));
	static char buf[65536];
	size_t total = 0;
	for (int round = 0; round < 8; round++) {
		size_t n = 65536 - (size_t)round * 1000;
		fill(buf, n, 600, total);
		write_all(a1, buf, n);
		/* socket -> pipe -> socket */
		size_t moved = 0;
		while (moved < n) {
			ssize_t r = splice(a2, NULL, p[1], NULL, n - moved,
					   SPLICE_F_MOVE);
			CHECK(r > 0, "splice sock->pipe %zd", r);
			size_t out2 = 0;
			while (out2 < (size_t)r) {
				ssize_t w = splice(p[0], NULL, b1, NULL,
						   (size_t)r - out2,
						   SPLICE_F_MOVE);
				CHECK(w > 0, "splice pipe->sock %zd", w);
				out2 += (size_t)w;
			}
			moved += (size_t)r;
		}
		read_all(b2, buf, n);
		VERIFY(buf, n, 600, total);
		total += n;
	}
	/* Non-blocking splice from an empty socket. */
	set_nonblock(a2, 1);
	errno = 0;
	ssize_t r2 = splice(a2, NULL, p[1], NULL, 100, SPLICE_F_NONBLOCK);
	out("splice bytes=%zu; empty nonblocking socket: %zd %s",
	    total, r2, ename(errno));
	CHECK(r2 == -1 && errno == EAGAIN, "splice empty");
	close(a1), close(a2), close(b1), close(b2), close(p[0]), close(p[1]);
}

/* ---- SCM_RIGHTS over a unix socket (PMI-style fd passing) ---- */

static void scm_rights_test(void)
{
	int sv[2], pp[2];
	CHECK_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
	CHECK_SYS(pipe(pp));
	char c = 'x';
	struct iovec iov = {&c, 1};
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr h;
	} cb;
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = cb.b,
			    .msg_controllen = sizeof cb.b};
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &pp[1], sizeof(int));
	CHECK(sendmsg(sv[0], &mh, 0) == 1, "sendmsg SCM_RIGHTS");
	memset(&cb, 0, sizeof cb);
	mh.msg_controllen = sizeof cb.b;
	c = 0;
	CHECK(recvmsg(sv[1], &mh, 0) == 1 && c == 'x', "recvmsg SCM_RIGHTS");
	cm = CMSG_FIRSTHDR(&mh);
	CHECK(cm && cm->cmsg_type == SCM_RIGHTS, "no SCM_RIGHTS");
	int nfd;
	memcpy(&nfd, CMSG_DATA(cm), sizeof nfd);
	CHECK(write(nfd, "fd!", 3) == 3, "write through passed fd");
	char b[4] = {0};
	CHECK(read(pp[0], b, 3) == 3 && !memcmp(b, "fd!", 3), "pipe read");
	out("scm_rights: passed fd works");
	close(nfd), close(pp[0]), close(pp[1]), close(sv[0]), close(sv[1]);
}

int main(int argc, char **argv)
{
	prog_name = "sockio";
	size_t total = argc > 1 ? strtoul(argv[1], NULL, 0) : 400000;
	int c, s;

	/* Blocking streams: every send method against every recv method
	 * on TCP/IPv4, a diagonal on IPv6 and unix sockets, pipes. */
	for (int wm = 0; wm < M_NMETHODS - 1; wm++)
		for (int rm = 0; rm < M_NMETHODS; rm++) {
			if ((wm + rm) % 2 && wm != rm && rm != M_WAITALL)
				continue; /* half the matrix is enough */
			tcp_pair(AF_INET, &c, &s);
			if (rm % 2) { /* small buffers on half of them */
				small_bufs(c, 8192);
				small_bufs(s, 32768);
			}
			stream_test("tcp4", c, s, (enum method)wm,
				    (enum method)rm, total / 4,
				    (wm + rm) % 3 == 0,
				    (uint32_t)(wm * 10 + rm));
			close(s);
			if ((wm + rm) % 3 == 0)
				close(c);
		}
	for (int m = 0; m < M_NMETHODS; m++) {
		tcp_pair(AF_INET6, &c, &s);
		stream_test("tcp6", s, c, (enum method)(m % (M_NMETHODS - 1)),
			    (enum method)m, total, 0, (uint32_t)(50 + m));
		close(c);
		int sv[2];
		CHECK_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
		stream_test("unix", sv[0], sv[1],
			    (enum method)(m % (M_NMETHODS - 1)), (enum method)m,
			    total / 2, 0, (uint32_t)(60 + m));
		close(sv[1]);
	}
	for (int m = 0; m < 2; m++) {
		int p[2];
		CHECK_SYS(pipe(p));
		stream_test("pipe", p[1], p[0], (enum method)m, (enum method)m,
			    total / 2, 0, (uint32_t)(70 + m));
		close(p[0]);
	}

	/* Non-blocking, small buffers: partial writes, EAGAIN. */
	nonblocking_test("tcp4", AF_INET, M_RW, M_RW);
	nonblocking_test("tcp4", AF_INET, M_V, M_V);
	nonblocking_test("tcp6", AF_INET6, M_SR, M_SR);
	nonblocking_test("tcp4", AF_INET, M_TO, M_TO);
	nonblocking_test("tcp6", AF_INET6, M_MSG, M_MSG);
	nonblocking_test("tcp4", AF_INET, M_MMSG, M_MMSG);

	flags_test(AF_INET, "tcp4");
	flags_test(AF_INET6, "tcp6");
	udp_test(AF_INET, "udp4");
	udp_test(AF_INET6, "udp6");
	sendfile_test();
	splice_test();
	scm_rights_test();
	out("sockio: all checks passed");
	return 0;
}
