/* starve: a ping-pong whose polling thread is starved of CPU, for the test
 * of waits across a reconnection (test/safesock).
 *
 * Every thread of the process is pinned to one CPU, where a spinning thread
 * competes with them; the main thread runs at SCHED_IDLE, so that once the
 * kernel wakes it, it waits a long while before it runs. A wait woken by a
 * connection's failure therefore looks at its fds again only after the
 * other threads of the process have had ample time to act (under radic:
 * reconnect and put a new socket under the fd). Real codes meet the same
 * when a node is loaded.
 *
 * Rank 1 connects to rank 0 and sends 8-byte counters; rank 0 echoes them.
 * Both wait for each message with poll (or select) on a non-blocking
 * socket, forever. After --seconds S rank 1 sends the end marker and both
 * print
 *
 *   starve rank R trips N
 *
 *   starve [--seconds S] [--poller poll|select]
 */
#include "common.h"

#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#define END UINT64_MAX

static int use_select;

static void *spin(void *arg)
{
	(void)arg;
	for (volatile unsigned long i = 0;; i++)
		;
	return NULL;
}

/* Pins every thread the process has now (and so every thread they start)
 * to the CPU the main thread is on. */
static void pin_all(void)
{
	cpu_set_t one;
	CPU_ZERO(&one);
	CPU_SET(sched_getcpu(), &one);
	DIR *d = opendir("/proc/self/task");
	if (d == NULL)
		die("/proc/self/task: %s", strerror(errno));
	for (struct dirent *e; (e = readdir(d)) != NULL;) {
		int tid = atoi(e->d_name);
		if (tid > 0 && sched_setaffinity(tid, sizeof one, &one) < 0)
			die("sched_setaffinity %d: %s", tid, strerror(errno));
	}
	closedir(d);
}

static void wait_readable(int fd)
{
	for (;;) {
		int k;
		if (use_select) {
			fd_set rd;
			FD_ZERO(&rd);
			FD_SET(fd, &rd);
			k = select(fd + 1, &rd, NULL, NULL, NULL);
		} else {
			struct pollfd p = {.fd = fd, .events = POLLIN};
			k = poll(&p, 1, -1);
		}
		if (k > 0)
			return;
		if (k < 0 && errno != EINTR)
			die("%s: %s", use_select ? "select" : "poll", strerror(errno));
	}
}

/* Reads one counter, waiting for it with poll or select. */
static uint64_t recv_counter(int fd)
{
	uint64_t v;
	size_t got = 0;
	while (got < sizeof v) {
		wait_readable(fd);
		ssize_t r = recv(fd, (char *)&v + got, sizeof v - got, 0);
		if (r == 0)
			die("the peer closed the connection");
		if (r < 0 && errno != EAGAIN && errno != EINTR)
			die("recv: %s", strerror(errno));
		if (r > 0)
			got += (size_t)r;
	}
	return v;
}

static void send_counter(int fd, uint64_t v)
{
	size_t done = 0;
	while (done < sizeof v) {
		ssize_t w = send(fd, (char *)&v + done, sizeof v - done, MSG_NOSIGNAL);
		if (w < 0 && errno != EAGAIN && errno != EINTR)
			die("send: %s", strerror(errno));
		if (w > 0)
			done += (size_t)w;
		else {
			struct pollfd p = {.fd = fd, .events = POLLOUT};
			poll(&p, 1, 100);
		}
	}
}

int main(int argc, char **argv)
{
	double seconds = 10;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
			seconds = atof(argv[++i]);
		else if (!strcmp(argv[i], "--poller") && i + 1 < argc)
			use_select = !strcmp(argv[++i], "select");
		else {
			fprintf(stderr, "usage: starve [--seconds S] [--poller poll|select]\n");
			return 2;
		}
	}
	struct job j;
	job_init(&j, "starve");
	if (j.size != 2)
		die("needs 2 ranks, has %d", j.size);

	int fd;
	if (j.rank == 0) {
		int lfd = job_listen(&j);
		uint32_t rank, kind;
		fd = job_accept(lfd, &rank, &kind);
		close(lfd);
	} else {
		fd = job_connect(&j, 0, 0, 30);
	}
	set_nonblock(fd);
	set_nodelay(fd);

	pin_all();
	pthread_t t;
	if (pthread_create(&t, NULL, spin, NULL) != 0)
		die("pthread_create failed");
	struct sched_param none = {0};
	if (sched_setscheduler((pid_t)syscall(SYS_gettid), SCHED_IDLE, &none) < 0)
		die("SCHED_IDLE: %s", strerror(errno));

	uint64_t trips = 0;
	if (j.rank == 1) {
		double end = now_s() + seconds;
		for (uint64_t i = 0; now_s() < end; i++) {
			send_counter(fd, i);
			uint64_t v = recv_counter(fd);
			if (v != i)
				die("echo %llu, want %llu", (unsigned long long)v, (unsigned long long)i);
			trips++;
		}
		send_counter(fd, END);
	} else {
		for (uint64_t v; (v = recv_counter(fd)) != END; trips++)
			send_counter(fd, v);
	}
	printf("starve rank %d trips %llu\n", j.rank, (unsigned long long)trips);
	return 0;
}
