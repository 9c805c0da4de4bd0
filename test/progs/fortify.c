/*
 * fortify: built with -D_FORTIFY_SOURCE=2 -O2 (see mk/shimtests.mk, which
 * checks with nm), so that read, recv and recvfrom into fixed-size buffers
 * with a length the compiler cannot bound become glibc's __read_chk,
 * __recv_chk and __recvfrom_chk. A TCP stream, a unix stream and a UDP
 * socket are read through each; every byte is checked.
 */
#include "common.h"

#include <pthread.h>

struct src {
	int fd;
	uint32_t stream;
	size_t total;
};

static void *src_main(void *arg)
{
	struct src *s = arg;
	static __thread char buf[3000];
	size_t done = 0;
	while (done < s->total) {
		size_t n = 1 + (done * 7 + 13) % sizeof buf;
		if (n > s->total - done)
			n = s->total - done;
		fill(buf, n, s->stream, done);
		write_all(s->fd, buf, n);
		done += n;
	}
	CHECK_SYS(close(s->fd));
	return NULL;
}

/* want: a length the compiler cannot see through, so the _chk variant is
 * used. */
static volatile size_t want_base = 1;

static void stream(const char *kind, int wfd, int rfd, int how, size_t total,
		   uint32_t id)
{
	char buf[2048];
	pthread_t th;
	struct src s = {wfd, id, total};
	size_t got = 0;
	CHECK(pthread_create(&th, NULL, src_main, &s) == 0, "thread");
	for (;;) {
		size_t want = want_base + (got * 5 + 3) % (sizeof buf - 1);
		ssize_t r;
		switch (how) {
		case 0:
			r = read(rfd, buf, want);
			break;
		case 1:
			r = recv(rfd, buf, want, 0);
			break;
		default:
			r = recvfrom(rfd, buf, want, 0, NULL, NULL);
			break;
		}
		CHECK(r >= 0, "%s read %zd", kind, r);
		if (r == 0)
			break;
		VERIFY(buf, (size_t)r, id, got);
		got += (size_t)r;
	}
	CHECK(pthread_join(th, NULL) == 0, "join");
	CHECK(got == total, "%s: got %zu of %zu", kind, got, total);
	static const char *names[] = {"__read_chk", "__recv_chk",
				      "__recvfrom_chk"};
	out("%s %s bytes=%zu", kind, names[how], got);
}

int main(int argc, char **argv)
{
	prog_name = "fortify";
	size_t total = argc > 1 ? strtoul(argv[1], NULL, 0) : 300000;
	for (int how = 0; how < 3; how++) {
		int c, s, sv[2];
		tcp_pair(how == 1 ? AF_INET6 : AF_INET, &c, &s);
		stream(how == 1 ? "tcp6" : "tcp4", c, s, how, total,
		       (uint32_t)how);
		CHECK_SYS(close(s));
		CHECK_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
		stream("unix", sv[0], sv[1], how, total / 4,
		       10 + (uint32_t)how);
		CHECK_SYS(close(sv[1]));
	}

	/* UDP with a source address, through __recvfrom_chk. */
	uint16_t pa, pb;
	int a = listener(AF_INET, SOCK_DGRAM, &pa);
	int b = listener(AF_INET, SOCK_DGRAM, &pb);
	addr_t to, from;
	socklen_t tl = loopback(AF_INET, &to, pb), fl;
	char buf[1500], rb[1500];
	for (int i = 0; i < 50; i++) {
		size_t n = 1 + (size_t)i * 29;
		fill(buf, n, 50 + (uint32_t)i, 0);
		CHECK(sendto(a, buf, n, 0, &to.sa, tl) == (ssize_t)n, "sendto");
		fl = sizeof from;
		ssize_t r = recvfrom(b, rb, want_base + sizeof rb - 1, 0,
				     &from.sa, &fl);
		CHECK(r == (ssize_t)n, "recvfrom %zd want %zu", r, n);
		VERIFY(rb, n, 50 + (uint32_t)i, 0);
		CHECK(addr_port(&from) == pa, "source port");
	}
	out("udp4 __recvfrom_chk 50 datagrams, sources match");

	/* Non-blocking through the _chk variants. */
	int c, s;
	tcp_pair(AF_INET, &c, &s);
	set_nonblock(s, 1);
	errno = 0;
	ssize_t r1 = read(s, buf, want_base + 10);
	int e1 = errno;
	errno = 0;
	ssize_t r2 = recv(s, buf, want_base + 10, 0);
	int e2 = errno;
	errno = 0;
	ssize_t r3 = recvfrom(s, buf, want_base + 10, 0, NULL, NULL);
	int e3 = errno;
	out("empty non-blocking: %zd %s, %zd %s, %zd %s", r1, ename(e1), r2,
	    ename(e2), r3, ename(e3));
	CHECK(r1 == -1 && r2 == -1 && r3 == -1 && e1 == EAGAIN &&
		  e2 == EAGAIN && e3 == EAGAIN,
	      "EAGAIN expected");
	close(c), close(s), close(a), close(b);
	out("fortify: all checks passed");
	return 0;
}
