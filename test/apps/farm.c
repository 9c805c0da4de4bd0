/* farm: a master/worker task farm. Rank 0 is the master; it listens on its
 * RADIC_PEERS entry, the workers connect to it with blocking sockets. The
 * master hands out tasks (rows of a Mandelbrot image), waits in select()
 * (or poll, or epoll_wait: --wait) for whichever worker answers first,
 * stores the row and gives that worker the next task. The digest hashes the rows in row order, so it does not
 * depend on which worker computed what or in which order the answers came.
 * With one rank the master computes every row itself (the reference).
 *
 *   farm [--tasks T] [--width W] [--maxiter M] [--pause-ms P]
 *        [--wait select|poll|epoll] [--listen-delay-ms D] [--nonblocking-connect]
 *        [--verbose]
 *
 * --pause-ms: the master waits P ms after the last result, before it prints
 * (a long final phase: the workers have exited by then).
 * --listen-delay-ms: the master listens only after D ms, so that the
 * workers' first connects are refused and retried; each worker prints how
 * many connects it made ("rank R connected after N tries"), which a
 * restarted worker must print again the same. --nonblocking-connect: the
 * workers connect on non-blocking sockets, taking any errno but
 * EINPROGRESS from connect for fatal (refusals come through SO_ERROR).
 */
#include "common.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <unistd.h>

enum { MSG_TASK = 1, MSG_RESULT = 2, MSG_STOP = 3 };
enum { KIND_WORKER = 3 };

struct hdr {
	uint32_t type, task, len;
};

static int width = 1024, maxiter = 2000, tasks = 512, pause_ms, listen_delay_ms;

static void compute_row(int row, uint32_t *out)
{
	double y = -1.5 + 3.0 * (double)row / (double)tasks;
	int x;
	for (x = 0; x < width; x++) {
		double cr = -2.0 + 3.0 * (double)x / (double)width, zr = 0, zi = 0;
		int n = 0;
		while (n < maxiter && zr * zr + zi * zi <= 4.0) {
			double t = zr * zr - zi * zi + cr;
			zi = 2.0 * zr * zi + y;
			zr = t;
			n++;
		}
		out[x] = (uint32_t)n;
	}
}

/* One write per message (header and body together), so that Nagle's
 * algorithm never holds a body back waiting for the header's ACK. */
static void send_msg(int fd, uint32_t type, uint32_t task, const void *p, uint32_t len)
{
	static char *buf;
	static size_t cap;
	struct hdr h = {htonl(type), htonl(task), htonl(len)};
	if (sizeof h + len > cap) {
		cap = sizeof h + len;
		buf = realloc(buf, cap);
		if (!buf)
			die("out of memory");
	}
	memcpy(buf, &h, sizeof h);
	if (len)
		memcpy(buf + sizeof h, p, len);
	write_full(fd, buf, sizeof h + len, "message");
}

static void recv_hdr(int fd, struct hdr *h)
{
	read_full(fd, h, sizeof *h, "message header");
	h->type = ntohl(h->type);
	h->task = ntohl(h->task);
	h->len = ntohl(h->len);
}

static void worker(struct job *j)
{
	int fd = job_connect(j, 0, KIND_WORKER, 60);
	if (listen_delay_ms > 0) {
		printf("rank %d connected after %d tries\n", j->rank, job_connect_tries);
		fflush(stdout);
	}
	set_nodelay(fd);
	uint32_t *row = calloc((size_t)width, sizeof *row);
	for (;;) {
		struct hdr h;
		recv_hdr(fd, &h);
		if (h.type == MSG_STOP)
			break;
		if (h.type != MSG_TASK || h.len != 0 || h.task >= (uint32_t)tasks)
			die("bad message from the master: type %u task %u len %u", h.type, h.task, h.len);
		compute_row((int)h.task, row);
		send_msg(fd, MSG_RESULT, h.task, row, (uint32_t)width * sizeof *row);
	}
	close(fd);
}

static void usage(void)
{
	fprintf(stderr, "usage: farm [--tasks T] [--width W] [--maxiter M] [--pause-ms P]\n"
			"            [--wait select|poll|epoll] [--listen-delay-ms D] [--nonblocking-connect]\n"
			"            [--verbose]\n");
	exit(2);
}

enum wait_call { WAIT_SELECT, WAIT_POLL, WAIT_EPOLL };

/* Waits for answers from the workers still working (fds[i] >= 0) with
 * call, and sets ready[i] for each worker the call reported. */
static void wait_answers(enum wait_call call, const int *fds, int nw, char *ready)
{
	static int ep = -1;
	static struct pollfd *p;
	static struct epoll_event *evs;
	static char *in_set;
	int i, k;
	memset(ready, 0, (size_t)nw);
	switch (call) {
	case WAIT_SELECT: {
		fd_set rd;
		int maxfd = -1;
		FD_ZERO(&rd);
		for (i = 0; i < nw; i++)
			if (fds[i] >= 0) {
				FD_SET(fds[i], &rd);
				if (fds[i] > maxfd)
					maxfd = fds[i];
			}
		do
			k = select(maxfd + 1, &rd, NULL, NULL, NULL);
		while (k < 0 && errno == EINTR);
		if (k < 0)
			die("select: %s", strerror(errno));
		for (i = 0; i < nw; i++)
			ready[i] = fds[i] >= 0 && FD_ISSET(fds[i], &rd);
		return;
	}
	case WAIT_POLL:
		if (!p && !(p = calloc((size_t)nw, sizeof *p)))
			die("out of memory");
		for (i = 0; i < nw; i++)
			p[i] = (struct pollfd){.fd = fds[i], .events = POLLIN}; /* a retired fd < 0 is skipped */
		do
			k = poll(p, (nfds_t)nw, -1);
		while (k < 0 && errno == EINTR);
		if (k < 0)
			die("poll: %s", strerror(errno));
		for (i = 0; i < nw; i++)
			ready[i] = fds[i] >= 0 && p[i].revents != 0;
		return;
	case WAIT_EPOLL:
		/* One set for the whole run; a retired worker's fd leaves it. */
		if (ep < 0) {
			if ((ep = epoll_create1(EPOLL_CLOEXEC)) < 0)
				die("epoll_create1: %s", strerror(errno));
			if (!(evs = calloc((size_t)nw, sizeof *evs)) || !(in_set = calloc((size_t)nw, 1)))
				die("out of memory");
			for (i = 0; i < nw; i++) {
				struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
				if (fds[i] >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev) < 0)
					die("epoll_ctl: %s", strerror(errno));
				in_set[i] = fds[i] >= 0;
			}
		}
		for (i = 0; i < nw; i++)
			if (fds[i] < 0 && in_set[i]) {
				if (epoll_ctl(ep, EPOLL_CTL_DEL, -fds[i] - 1, NULL) < 0)
					die("epoll_ctl: %s", strerror(errno));
				in_set[i] = 0;
			}
		do
			k = epoll_wait(ep, evs, nw, -1);
		while (k < 0 && errno == EINTR);
		if (k < 0)
			die("epoll_wait: %s", strerror(errno));
		for (i = 0; i < k; i++)
			ready[evs[i].data.u32] = fds[evs[i].data.u32] >= 0;
		return;
	}
}

int main(int argc, char **argv)
{
	struct job j;
	int i, verbose = 0, nw, next = 0, done = 0, active;
	enum wait_call call = WAIT_SELECT;
	int *fds, *count;
	char *ready;
	uint32_t *img;
	uint64_t digest = FNV_OFFSET;
	double t0;

	for (i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--verbose")) {
			verbose = 1;
			continue;
		}
		if (!strcmp(a, "--nonblocking-connect")) {
			job_connect_nonblock = 1;
			continue;
		}
		if (i + 1 >= argc)
			usage();
		i++;
		if (!strcmp(a, "--tasks"))
			tasks = atoi(argv[i]);
		else if (!strcmp(a, "--width"))
			width = atoi(argv[i]);
		else if (!strcmp(a, "--maxiter"))
			maxiter = atoi(argv[i]);
		else if (!strcmp(a, "--pause-ms"))
			pause_ms = atoi(argv[i]);
		else if (!strcmp(a, "--listen-delay-ms"))
			listen_delay_ms = atoi(argv[i]);
		else if (!strcmp(a, "--wait") && !strcmp(argv[i], "select"))
			call = WAIT_SELECT;
		else if (!strcmp(a, "--wait") && !strcmp(argv[i], "poll"))
			call = WAIT_POLL;
		else if (!strcmp(a, "--wait") && !strcmp(argv[i], "epoll"))
			call = WAIT_EPOLL;
		else
			usage();
	}
	if (tasks < 1 || width < 1 || maxiter < 1 || pause_ms < 0 || listen_delay_ms < 0)
		usage();
	job_init(&j, "farm");
	if (j.rank > 0) {
		worker(&j);
		return 0;
	}

	img = calloc((size_t)tasks * (size_t)width, sizeof *img);
	nw = j.size - 1;
	fds = calloc((size_t)nw + 1, sizeof *fds);
	count = calloc((size_t)nw + 1, sizeof *count);
	ready = calloc((size_t)nw + 1, 1);
	if (!img || !fds || !count || !ready)
		die("out of memory");
	t0 = now_s();
	if (nw == 0) {
		for (i = 0; i < tasks; i++)
			compute_row(i, img + (size_t)i * (size_t)width);
	} else {
		int lfd;
		if (listen_delay_ms > 0)
			usleep((useconds_t)listen_delay_ms * 1000);
		lfd = job_listen(&j);
		for (i = 0; i < nw; i++) {
			uint32_t from, kind;
			int fd = job_accept(lfd, &from, &kind);
			if (kind != KIND_WORKER || from == 0 || from > (uint32_t)nw || fds[from - 1])
				die("unexpected connection from rank %u (kind %u)", from, kind);
			if (fd >= FD_SETSIZE)
				die("fd %d does not fit in select's fd_set", fd);
			set_nodelay(fd);
			fds[from - 1] = fd;
		}
		close(lfd);
		/* One task to each worker, then the next one to whoever answers. */
		active = 0;
		for (i = 0; i < nw; i++) {
			if (next < tasks) {
				send_msg(fds[i], MSG_TASK, (uint32_t)next++, NULL, 0);
				active++;
			} else {
				send_msg(fds[i], MSG_STOP, 0, NULL, 0);
				fds[i] = -fds[i] - 1; /* retired */
			}
		}
		while (done < tasks) {
			wait_answers(call, fds, nw, ready);
			for (i = 0; i < nw; i++) {
				struct hdr h;
				if (!ready[i])
					continue;
				recv_hdr(fds[i], &h);
				if (h.type != MSG_RESULT || h.task >= (uint32_t)tasks || h.len != (uint32_t)width * sizeof *img)
					die("bad message from rank %d: type %u task %u len %u", i + 1, h.type, h.task, h.len);
				read_full(fds[i], img + (size_t)h.task * (size_t)width, h.len, "result");
				done++;
				count[i]++;
				if (next < tasks) {
					send_msg(fds[i], MSG_TASK, (uint32_t)next++, NULL, 0);
				} else {
					send_msg(fds[i], MSG_STOP, 0, NULL, 0);
					fds[i] = -fds[i] - 1;
				}
			}
		}
	}
	if (pause_ms > 0)
		usleep((useconds_t)pause_ms * 1000);
	for (i = 0; i < tasks; i++)
		digest = fnv1a(digest, img + (size_t)i * (size_t)width, (size_t)width * sizeof *img);
	if (verbose) {
		fprintf(stderr, "farm: %d tasks in %.3f s;", tasks, now_s() - t0);
		for (i = 0; i < nw; i++)
			fprintf(stderr, " rank %d: %d", i + 1, count[i]);
		fprintf(stderr, "\n");
	}
	printf("farm tasks=%d width=%d maxiter=%d digest=%016llx\n", tasks, width, maxiter, (unsigned long long)digest);
	return 0;
}
