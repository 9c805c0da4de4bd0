/*
 * pingpong: TCP loopback ping-pong between two processes, the benchmark of
 * the C fast path.
 *
 *   pingpong [SMALL_ITERS [BIG_ITERS]]
 *
 * The program forks and execs itself as the echo server (so both ends are
 * whole processes, preloaded like any other), then measures the round trip
 * of 8-byte messages and of 1 MiB messages with blocking send/recv. It
 * prints
 *
 *   lat_us=L    half the mean 8 B round trip, in microseconds
 *   bw_MBps=B   1 MiB ping-pong bandwidth, 2 * bytes / time, in MB/s
 *
 * and checks the contents of the first and last message of each size.
 */
#include "common.h"

#include <sys/wait.h>
#include <time.h>

#define BIG (1 << 20)

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sendn(int fd, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
		CHECK(r > 0, "send");
		p += r;
		n -= (size_t)r;
	}
}

static int recvn(int fd, char *p, size_t n)
{
	while (n > 0) {
		ssize_t r = recv(fd, p, n, 0);
		if (r == 0)
			return 0;
		CHECK(r > 0, "recv");
		p += r;
		n -= (size_t)r;
	}
	return 1;
}

static int server(int l)
{
	int s = CHECK_SYS(accept(l, NULL, NULL));
	CHECK_SYS(close(l));
	int one = 1;
	CHECK_SYS(setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one));
	struct timeval tv = {10, 0}; /* a lost byte fails instead of hanging */
	CHECK_SYS(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
	static char buf[BIG];
	uint32_t size;
	/* Each phase: a 4-byte size, then messages of that size, echoed. */
	while (recvn(s, (char *)&size, 4)) {
		CHECK(size <= BIG, "size");
		uint32_t iters;
		CHECK(recvn(s, (char *)&iters, 4), "iters");
		for (uint32_t i = 0; i < iters; i++) {
			CHECK(recvn(s, buf, size), "early EOF");
			sendn(s, buf, size);
		}
	}
	return 0;
}

static double phase(int c, uint32_t size, uint32_t iters, uint32_t id)
{
	static char buf[BIG], in[BIG];
	sendn(c, (char *)&size, 4);
	sendn(c, (char *)&iters, 4);
	fill(buf, size, id, 0);
	double t0 = 0;
	for (uint32_t i = 0; i < iters; i++) {
		if (i == iters / 10)
			t0 = now(); /* the first tenth warms up */
		sendn(c, buf, size);
		CHECK(recvn(c, in, size), "early EOF");
		if (i == 0 || i == iters - 1) {
			VERIFY(in, size, id, 0);
			memset(in, 0, size);
		}
	}
	return (now() - t0) / (iters - iters / 10);
}

int main(int argc, char **argv)
{
	prog_name = "pingpong";
	if (argc == 3 && !strcmp(argv[1], "server"))
		return server(atoi(argv[2]));
	uint32_t small = argc > 1 ? (uint32_t)atoi(argv[1]) : 20000;
	uint32_t big = argc > 2 ? (uint32_t)atoi(argv[2]) : 300;
	CHECK(small >= 10 && big >= 10, "at least 10 iterations");

	uint16_t port;
	int l = listener(AF_INET, SOCK_STREAM, &port);
	pid_t pid = CHECK_SYS(fork());
	if (pid == 0) {
		char fd[16];
		snprintf(fd, sizeof fd, "%d", l);
		execl("/proc/self/exe", "pingpong", "server", fd, (char *)NULL);
		_exit(127);
	}
	CHECK_SYS(close(l));
	int c = connect_to(AF_INET, port);
	int one = 1;
	CHECK_SYS(setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one));
	struct timeval tv = {10, 0};
	CHECK_SYS(setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
	double rtt = phase(c, 8, small, 1);
	double rtt_big = phase(c, BIG, big, 2);
	CHECK_SYS(close(c));
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	      "server failed");
	out("lat_us=%.3f", rtt / 2 * 1e6);
	out("bw_MBps=%.1f", 2.0 * BIG / rtt_big / 1e6);
	return 0;
}
