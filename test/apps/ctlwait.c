/* ctlwait: iperf3's waiting pattern, for the test of a wait that a break
 * lands in (test/safesock).
 *
 * iperf3 (3.12, one thread) selects on its control connection and its
 * data streams together, and when select says the control connection is
 * readable it reads its one state byte with a blocking read. A readiness
 * that is not true hangs it: that read waits for a byte the peer sends
 * only at the end of the test, while the peer waits for it. Here rank 1
 * opens --conns idle control connections and one data connection to rank
 * 0. Both ranks wait on all of them with select (or poll), in one thread;
 * rank 1 writes a checked byte pattern on the data connection, rank 0
 * reads it, and a control connection said to be readable is read with a
 * blocking read of one byte, as iperf3 does. Every control connection is
 * silent until the end, so each such read before then would block: it is
 * given 5 s (SIGALRM), then the rank stops with
 *
 *   ctlwait: <poller> said control connection K was readable, yet a read of it waited 5 s
 *
 * Each control connection has its own radic control channel, so a cut
 * breaks them one after another, while the wait for the first break is
 * already under way: a later break must not show up as readiness.
 *
 * After --seconds S rank 1 sends 'E' on every control connection (and,
 * on the first, the number of data bytes), rank 0 reads the data to the
 * end and answers 'D' on each; both print
 *
 *   ctlwait rank R bytes B waits W
 *
 *   ctlwait [--seconds S] [--conns N] [--poller poll|select]
 */
#include "common.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAXCONNS 64
#define CHUNK 65536
#define STALL_S 5

static int use_select;
static int nctl;
static int ctl[MAXCONNS];
static int data_fd;
static char stall_msg[256];

static void on_alarm(int sig)
{
	(void)sig;
	(void)!write(2, stall_msg, strlen(stall_msg));
	_exit(1);
}

/* Byte k of the data stream. */
static unsigned char pat(uint64_t k) { return (unsigned char)(mix64(k >> 3) >> (8 * (k & 7))); }

/* Waits for readability of every control connection and, if want_data,
 * for the data connection (readable on rank 0, writable on rank 1).
 * Fills rd[i] (control i readable) and returns whether the data
 * connection is ready. */
static int wait_all(int rank, int want_data, int *rd)
{
	for (;;) {
		int k, dready = 0;
		if (use_select) {
			fd_set r, w;
			FD_ZERO(&r);
			FD_ZERO(&w);
			int max = data_fd;
			for (int i = 0; i < nctl; i++) {
				FD_SET(ctl[i], &r);
				if (ctl[i] > max)
					max = ctl[i];
			}
			if (want_data)
				FD_SET(data_fd, rank == 0 ? &r : &w);
			struct timeval tv = {0, 200 * 1000}; /* iperf3 waits with timeouts */
			k = select(max + 1, &r, &w, NULL, &tv);
			if (k > 0) {
				for (int i = 0; i < nctl; i++)
					rd[i] = FD_ISSET(ctl[i], &r);
				dready = want_data && FD_ISSET(data_fd, rank == 0 ? &r : &w);
			}
		} else {
			struct pollfd p[MAXCONNS + 1];
			for (int i = 0; i < nctl; i++)
				p[i] = (struct pollfd){.fd = ctl[i], .events = POLLIN};
			p[nctl] = (struct pollfd){.fd = want_data ? data_fd : -1,
						  .events = rank == 0 ? POLLIN : POLLOUT};
			k = poll(p, (nfds_t)nctl + 1, 200);
			if (k > 0) {
				for (int i = 0; i < nctl; i++)
					rd[i] = p[i].revents != 0;
				dready = p[nctl].revents != 0;
			}
		}
		if (k > 0)
			return dready;
		if (k < 0 && errno != EINTR)
			die("%s: %s", use_select ? "select" : "poll", strerror(errno));
	}
}

/* The blocking read of one byte from a control connection said to be
 * readable. */
static char read_ctl(int i)
{
	char b;
	snprintf(stall_msg, sizeof stall_msg,
		 "%s: %s said control connection %d was readable, yet a read of it waited %d s\n",
		 progname, use_select ? "select" : "poll", i, STALL_S);
	alarm(STALL_S);
	ssize_t r = read(ctl[i], &b, 1);
	alarm(0);
	if (r == 0)
		die("control connection %d: end of stream", i);
	if (r < 0)
		die("control connection %d: read: %s", i, strerror(errno));
	return b;
}

int main(int argc, char **argv)
{
	double seconds = 10;
	nctl = 16;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
			seconds = atof(argv[++i]);
		else if (!strcmp(argv[i], "--conns") && i + 1 < argc)
			nctl = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--poller") && i + 1 < argc)
			use_select = !strcmp(argv[++i], "select");
		else {
			fprintf(stderr, "usage: ctlwait [--seconds S] [--conns N] [--poller poll|select]\n");
			return 2;
		}
	}
	if (nctl < 1 || nctl > MAXCONNS)
		die("--conns must be 1-%d", MAXCONNS);
	struct job j;
	job_init(&j, "ctlwait");
	if (j.size != 2)
		die("needs 2 ranks, has %d", j.size);
	signal(SIGALRM, on_alarm);

	if (j.rank == 0) {
		int lfd = job_listen(&j);
		for (int n = 0; n <= nctl; n++) {
			uint32_t rank, kind;
			int fd = job_accept(lfd, &rank, &kind);
			if (kind == 0)
				data_fd = fd;
			else if (kind <= (uint32_t)nctl)
				ctl[kind - 1] = fd;
			else
				die("connection of kind %u", kind);
		}
		close(lfd);
	} else {
		for (int i = 0; i < nctl; i++)
			ctl[i] = job_connect(&j, 0, (uint32_t)i + 1, 30);
		data_fd = job_connect(&j, 0, 0, 30);
	}
	/* The data connection never blocks (a readiness that is not true
	 * costs an EAGAIN there); the control connections do, as iperf3's. */
	set_nonblock(data_fd);

	static unsigned char buf[CHUNK];
	uint64_t bytes = 0, waits = 0, total = UINT64_MAX;
	int ends = 0, rd[MAXCONNS];
	if (j.rank == 1) {
		double end = now_s() + seconds;
		while (now_s() < end) {
			int dready = wait_all(1, 1, rd);
			waits++;
			for (int i = 0; i < nctl; i++)
				if (rd[i])
					die("control connection %d: unexpected byte %d from rank 0", i,
					    read_ctl(i));
			if (!dready)
				continue;
			for (size_t k = 0; k < CHUNK; k++)
				buf[k] = pat(bytes + k);
			ssize_t w = send(data_fd, buf, CHUNK, MSG_NOSIGNAL);
			if (w < 0 && errno != EAGAIN && errno != EINTR)
				die("send: %s", strerror(errno));
			if (w > 0)
				bytes += (uint64_t)w;
		}
		for (int i = 0; i < nctl; i++)
			write_full(ctl[i], "E", 1, "end marker");
		write_full(ctl[0], &bytes, sizeof bytes, "byte count");
		while (ends < nctl) {
			wait_all(1, 0, rd);
			waits++;
			for (int i = 0; i < nctl; i++)
				if (rd[i]) {
					char b = read_ctl(i);
					if (b != 'D')
						die("control connection %d: byte %d, want 'D'", i, b);
					ends++;
				}
		}
	} else {
		while (ends < nctl || bytes < total) {
			int dready = wait_all(0, bytes < total, rd);
			waits++;
			for (int i = 0; i < nctl; i++) {
				if (!rd[i])
					continue;
				char b = read_ctl(i);
				if (b != 'E')
					die("control connection %d: byte %d, want 'E'", i, b);
				if (i == 0)
					read_full(ctl[0], &total, sizeof total, "byte count");
				ends++;
			}
			if (!dready)
				continue;
			ssize_t r = recv(data_fd, buf, CHUNK, 0);
			if (r == 0)
				die("data connection: end of stream after %llu bytes",
				    (unsigned long long)bytes);
			if (r < 0 && errno != EAGAIN && errno != EINTR)
				die("data connection: recv: %s", strerror(errno));
			for (ssize_t k = 0; k < r; k++)
				if (buf[k] != pat(bytes + (uint64_t)k))
					die("data byte %llu: %d, want %d",
					    (unsigned long long)(bytes + (uint64_t)k), buf[k],
					    pat(bytes + (uint64_t)k));
			if (r > 0)
				bytes += (uint64_t)r;
		}
		if (bytes != total)
			die("received %llu data bytes, rank 1 sent %llu", (unsigned long long)bytes,
			    (unsigned long long)total);
		for (int i = 0; i < nctl; i++)
			write_full(ctl[i], "D", 1, "done marker");
	}
	printf("ctlwait rank %d bytes %llu waits %llu\n", j.rank, (unsigned long long)bytes,
	       (unsigned long long)waits);
	return 0;
}
