/* ticket: a server that numbers its clients in the order it accepts them.
 * Rank 0 listens and the other ranks connect to it. As it accepts each
 * client, rank 0 sends it a ticket: its place in the accept order. Then,
 * round after round, every client sends a number and rank 0 answers it
 * with 3 * number + ticket, serving the clients in ticket order.
 *
 * The answers a client gets depend on its ticket, so they depend on the
 * order of the accepts: a server restarted under radic must accept its
 * clients in the order its first run did (accept order is a determinant),
 * or it sends them other answers than they already received, a
 * divergence. What the ranks print does not depend on the tickets (each
 * client takes its ticket back out of every answer), so two fault-free
 * runs print the same lines whatever order they accepted in.
 *
 *   ticket [--rounds R] [--pause-us P]   (P: a client's pause per round)
 */
#include "common.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { KIND_CLIENT = 4 };

static uint32_t get32(int fd, const char *what)
{
	uint32_t v;
	read_full(fd, &v, sizeof v, what);
	return ntohl(v);
}

static void put32(int fd, uint32_t v, const char *what)
{
	v = htonl(v);
	write_full(fd, &v, sizeof v, what);
}

int main(int argc, char **argv)
{
	struct job j;
	int rounds = 2000, pause_us = 1000;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
			rounds = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--pause-us") && i + 1 < argc)
			pause_us = atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: ticket [--rounds R] [--pause-us P]\n");
			return 2;
		}
	}
	job_init(&j, "ticket");
	if (j.size < 2)
		die("needs 2 ranks or more");
	if (j.rank != 0) {
		int fd = job_connect(&j, 0, KIND_CLIENT, 60);
		uint32_t ticket = get32(fd, "ticket");
		uint64_t digest = FNV_OFFSET;
		for (int r = 0; r < rounds; r++) {
			uint32_t v = (uint32_t)(j.rank * 100000 + r);
			put32(fd, v, "number");
			uint32_t a = get32(fd, "answer") - ticket;
			if (a != 3 * v)
				die("round %d: answer %" PRIu32 " to %" PRIu32 " (ticket %" PRIu32 ")", r, a, v, ticket);
			digest = fnv1a(digest, &a, sizeof a);
			if (pause_us > 0)
				usleep((useconds_t)pause_us);
		}
		printf("client %d: %d rounds digest=%016" PRIx64 "\n", j.rank, rounds, digest);
		close(fd);
		return 0;
	}
	int lfd = job_listen(&j), n = j.size - 1;
	int *fds = calloc((size_t)n, sizeof *fds);
	if (fds == NULL)
		die("out of memory");
	for (int k = 0; k < n; k++) {
		uint32_t from, kind;
		fds[k] = job_accept(lfd, &from, &kind);
		if (kind != KIND_CLIENT)
			die("unexpected connection from rank %u (kind %u)", from, kind);
		put32(fds[k], (uint32_t)k, "ticket");
	}
	close(lfd);
	for (int r = 0; r < rounds; r++)
		for (int k = 0; k < n; k++)
			put32(fds[k], 3 * get32(fds[k], "number") + (uint32_t)k, "answer");
	for (int k = 0; k < n; k++)
		close(fds[k]);
	printf("server: %d clients, %d rounds\n", n, rounds);
	return 0;
}
