/*
 * closeall: a process that closes all its descriptors and keeps running.
 *
 * Three ways, one after the other in one process: closefrom(3),
 * close_range(3, ~0U, 0) (and stdin with close_range(0, 0, 0)), and a
 * close() loop up to the fd limit (what orted's launch child does). After
 * each, the program keeps going for a while and does checked socket I/O
 * (TCP, with a thread, poll and epoll) — a preload library whose own fds
 * were closed would die or hang here. Last, close_range with
 * CLOSE_RANGE_CLOEXEC and an exec of itself, which does the I/O again.
 */
#include "common.h"

#include <linux/close_range.h>
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <time.h>

struct w {
	int fd;
	uint32_t id;
	size_t n;
};

static void *wmain(void *arg)
{
	struct w *w = arg;
	static __thread char buf[32768];
	size_t done = 0;
	while (done < w->n) {
		size_t k = w->n - done < sizeof buf ? w->n - done : sizeof buf;
		fill(buf, k, w->id, done);
		write_all(w->fd, buf, k);
		done += k;
	}
	return NULL;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {0, ms * 1000000L};
	nanosleep(&ts, NULL);
}

/* io: some rounds of checked TCP traffic, waiting with poll and epoll,
 * with pauses so that anything running in the background gets to run. */
static void io(const char *after)
{
	for (int round = 0; round < 4; round++) {
		int c, s;
		tcp_pair(round % 2 ? AF_INET6 : AF_INET, &c, &s);
		struct w w = {c, 700 + (uint32_t)round, 1 << 20};
		pthread_t th;
		CHECK(pthread_create(&th, NULL, wmain, &w) == 0, "thread");
		int ep = CHECK_SYS(epoll_create1(0));
		struct epoll_event e = {.events = EPOLLIN, .data.fd = s};
		CHECK_SYS(epoll_ctl(ep, EPOLL_CTL_ADD, s, &e));
		static char buf[8192];
		size_t got = 0;
		while (got < w.n) {
			if (got % 2) {
				struct pollfd p = {s, POLLIN, 0};
				CHECK(poll(&p, 1, 5000) == 1, "poll");
			} else {
				CHECK(epoll_wait(ep, &e, 1, 5000) == 1, "epoll_wait");
			}
			ssize_t r = recv(s, buf, sizeof buf, 0);
			CHECK(r > 0, "recv");
			VERIFY(buf, (size_t)r, w.id, got);
			got += (size_t)r;
		}
		CHECK(pthread_join(th, NULL) == 0, "join");
		close(c), close(s), close(ep);
		sleep_ms(40);
	}
	out("after %s: 4 rounds of 1 MiB checked, still running", after);
}

int main(int argc, char **argv)
{
	prog_name = "closeall";
	if (argc > 1 && !strcmp(argv[1], "exec")) {
		io("close_range(CLOEXEC)+exec");
		out("closeall: all checks passed");
		return 0;
	}
	io("start");

	closefrom(3);
	io("closefrom(3)");

	CHECK_SYS(close_range(3, ~0U, 0));
	CHECK_SYS(close_range(0, 0, 0));
	io("close_range(3,~0U) and close_range(0,0)");

	struct rlimit rl;
	CHECK_SYS(getrlimit(RLIMIT_NOFILE, &rl));
	long max = rl.rlim_cur > 65536 ? 65536 : (long)rl.rlim_cur;
	int closed = 0;
	for (long fd = 3; fd < max; fd++)
		if (close((int)fd) == 0)
			closed++;
	io("close() loop to RLIMIT_NOFILE");

	CHECK_SYS(close_range(3, ~0U, CLOSE_RANGE_CLOEXEC));
	fflush(stdout);
	execl("/proc/self/exe", "closeall", "exec", (char *)NULL);
	CHECK(0, "exec");
}
