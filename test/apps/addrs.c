/* addrs: prints the addresses a program sees on its connections, for the
 * test of address virtualization (test/safesock). Rank 0 listens on its
 * RADIC_PEERS entry and accepts --conns connections; rank 1 opens them one
 * after the other, waiting before each one after the first until the file
 * named by RADIC_TEST_GATE exists (so that a test can readdress nodes in
 * between). Both sides print, per connection,
 *
 *   addrs rank R conn K accept=IP:PORT peer=IP:PORT self=IP:PORT
 *
 * (accept= only on rank 0: what accept() wrote), exchange a byte and close.
 * The byte is read with recvmsg (rank 0) or recvfrom (rank 1) with room
 * for a sender's address, and the length they report is printed:
 *
 *   addrs rank R conn K namelen=N      (TCP names no sender: N is 0)
 *
 *   addrs [CONNS [PAUSE_US]]   CONNS connections (default 2); rank 1 sleeps
 *                              PAUSE_US microseconds after each one (default 0)
 */
#include "common.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *fmt_addr(const struct sockaddr_in *a, char *buf, size_t n)
{
	char ip[INET_ADDRSTRLEN];
	inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
	snprintf(buf, n, "%s:%d", ip, ntohs(a->sin_port));
	return buf;
}

static void report(int rank, int k, int fd, const struct sockaddr_in *accepted)
{
	struct sockaddr_in peer, self;
	socklen_t pl = sizeof peer, sl = sizeof self;
	if (getpeername(fd, (struct sockaddr *)&peer, &pl) < 0 ||
	    getsockname(fd, (struct sockaddr *)&self, &sl) < 0)
		die("getpeername/getsockname: %s", strerror(errno));
	char a[64] = "-", p[64], s[64];
	if (accepted)
		fmt_addr(accepted, a, sizeof a);
	printf("addrs rank %d conn %d accept=%s peer=%s self=%s\n", rank, k, a,
	       fmt_addr(&peer, p, sizeof p), fmt_addr(&self, s, sizeof s));
	fflush(stdout);
}

/* Reads the byte with recvmsg or recvfrom and says how long a sender's
 * address they reported. */
static void read_byte(int rank, int k, int fd, char *b)
{
	struct sockaddr_in from;
	socklen_t fl = sizeof from;
	ssize_t r;
	if (rank == 0) {
		struct iovec v = {b, 1};
		struct msghdr m = {.msg_name = &from, .msg_namelen = fl, .msg_iov = &v, .msg_iovlen = 1};
		r = recvmsg(fd, &m, MSG_WAITALL);
		fl = m.msg_namelen;
	} else {
		r = recvfrom(fd, b, 1, MSG_WAITALL, (struct sockaddr *)&from, &fl);
	}
	if (r != 1)
		die("read byte: %s", r < 0 ? strerror(errno) : "end of stream");
	printf("addrs rank %d conn %d namelen=%u\n", rank, k, (unsigned)fl);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	struct job j;
	int conns = argc > 1 ? atoi(argv[1]) : 2;
	useconds_t pause_us = argc > 2 ? (useconds_t)atoi(argv[2]) : 0;
	job_init(&j, "addrs");
	if (j.size != 2)
		die("run with --np 2");
	char b = 'x';
	if (j.rank == 0) {
		int lfd = job_listen(&j);
		for (int k = 0; k < conns; k++) {
			struct sockaddr_in a;
			socklen_t al = sizeof a;
			int fd = accept(lfd, (struct sockaddr *)&a, &al);
			if (fd < 0)
				die("accept: %s", strerror(errno));
			uint32_t hello[2];
			read_full(fd, hello, sizeof hello, "hello");
			report(0, k, fd, &a);
			read_byte(0, k, fd, &b);
			write_full(fd, &b, 1, "byte");
			close(fd);
		}
		return 0;
	}
	const char *gate = getenv("RADIC_TEST_GATE");
	for (int k = 0; k < conns; k++) {
		struct stat st;
		while (k > 0 && gate != NULL && stat(gate, &st) < 0)
			usleep(20000);
		int fd = job_connect(&j, 0, 0, 30);
		report(1, k, fd, NULL);
		write_full(fd, &b, 1, "byte");
		read_byte(1, k, fd, &b);
		close(fd);
		if (pause_us > 0)
			usleep(pause_us);
	}
	return 0;
}
