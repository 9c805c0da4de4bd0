/*
 * stress: four threads doing socket I/O at once. Threads 0/1 and 2/3 form
 * client/server pairs; each pair opens 20 connections in turn (pair 0
 * over IPv4, pair 1 over IPv6) and exchanges 50 length-prefixed messages per connection, echoed
 * back; every byte is checked on both sides. The transcript is the
 * per-thread totals, which are fixed by the message schedule.
 */
#include "common.h"

#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/uio.h>

enum { PAIRS = 2, CONNS = 20, MSGS = 50, MAXMSG = 16384 };

struct pair {
	int l;
	uint16_t port;
	int fam;
	uint64_t cbytes, sbytes;
};

static size_t msgsize(int conn, int msg) { return 1 + (size_t)(conn * 7919 + msg * 104729) % MAXMSG; }

static void *client(void *arg)
{
	struct pair *p = arg;
	static __thread char buf[MAXMSG], back[MAXMSG];
	for (int conn = 0; conn < CONNS; conn++) {
		int c = connect_to(p->fam, p->port);
		for (int m = 0; m < MSGS; m++) {
			size_t n = msgsize(conn, m);
			uint32_t id = (uint32_t)(conn * MSGS + m);
			uint32_t len = (uint32_t)n;
			fill(buf, n, id, 0);
			struct iovec iov[2] = {{&len, 4}, {buf, n}};
			size_t want = n + 4, done = 0;
			while (done < want) {
				ssize_t r = writev(c, iov, 2);
				CHECK(r > 0, "writev");
				done += (size_t)r;
				/* advance the iovecs */
				size_t k = (size_t)r;
				for (int i = 0; i < 2 && k; i++) {
					size_t t = k < iov[i].iov_len ? k : iov[i].iov_len;
					iov[i].iov_base = (char *)iov[i].iov_base + t;
					iov[i].iov_len -= t;
					k -= t;
				}
			}
			ssize_t r = recv(c, back, n, MSG_WAITALL);
			CHECK(r == (ssize_t)n, "echo: %zd of %zu", r, n);
			VERIFY(back, n, id, 0);
			p->cbytes += n;
		}
		CHECK_SYS(close(c));
	}
	return NULL;
}

static void *server(void *arg)
{
	struct pair *p = arg;
	static __thread char buf[MAXMSG];
	int ep = CHECK_SYS(epoll_create1(0));
	for (int conn = 0; conn < CONNS; conn++) {
		struct pollfd pf = {p->l, POLLIN, 0};
		CHECK(poll(&pf, 1, 10000) == 1, "accept readiness");
		int s = CHECK_SYS(accept4(p->l, NULL, NULL, SOCK_CLOEXEC));
		struct epoll_event e = {.events = EPOLLIN, .data.fd = s};
		CHECK_SYS(epoll_ctl(ep, EPOLL_CTL_ADD, s, &e));
		for (int m = 0;; m++) {
			CHECK(epoll_wait(ep, &e, 1, 10000) == 1, "epoll_wait");
			uint32_t len;
			ssize_t r = recv(s, &len, 4, MSG_WAITALL);
			if (r == 0) {
				CHECK(m == MSGS, "EOF after %d messages", m);
				break;
			}
			CHECK(r == 4 && len == msgsize(conn, m), "header: %zd len %u", r, len);
			size_t got = 0;
			while (got < len) {
				r = read(s, buf + got, len - got);
				CHECK(r > 0, "read");
				got += (size_t)r;
			}
			VERIFY(buf, len, (uint32_t)(conn * MSGS + m), 0);
			struct iovec iov = {buf, len};
			struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
			size_t sent = 0;
			while (sent < len) {
				iov.iov_base = buf + sent;
				iov.iov_len = len - sent;
				r = sendmsg(s, &mh, MSG_NOSIGNAL);
				CHECK(r > 0, "sendmsg");
				sent += (size_t)r;
			}
			p->sbytes += len;
		}
		CHECK_SYS(epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL));
		CHECK_SYS(close(s));
	}
	CHECK_SYS(close(ep));
	return NULL;
}

int main(void)
{
	prog_name = "stress";
	struct pair p[PAIRS];
	pthread_t th[2 * PAIRS];
	for (int i = 0; i < PAIRS; i++) {
		p[i] = (struct pair){0};
		p[i].fam = i % 2 ? AF_INET6 : AF_INET;
		p[i].l = listener(p[i].fam, SOCK_STREAM, &p[i].port);
	}
	for (int i = 0; i < PAIRS; i++) {
		CHECK(pthread_create(&th[2 * i], NULL, client, &p[i]) == 0, "thread");
		CHECK(pthread_create(&th[2 * i + 1], NULL, server, &p[i]) == 0, "thread");
	}
	for (int i = 0; i < 2 * PAIRS; i++)
		CHECK(pthread_join(th[i], NULL) == 0, "join");
	uint64_t want = 0;
	for (int conn = 0; conn < CONNS; conn++)
		for (int m = 0; m < MSGS; m++)
			want += msgsize(conn, m);
	for (int i = 0; i < PAIRS; i++) {
		out("pair %d (%s): client checked %llu bytes, server checked %llu bytes", i,
		    p[i].fam == AF_INET ? "tcp4" : "tcp6", (unsigned long long)p[i].cbytes,
		    (unsigned long long)p[i].sbytes);
		CHECK(p[i].cbytes == want && p[i].sbytes == want, "totals");
		close(p[i].l);
	}
	out("stress: all checks passed");
	return 0;
}
