/*
 * stateful: a program that computes and holds state, for the checkpoint
 * tests. It owns an array of WORDS 64-bit words (8 MiB: a real image), and
 * on each step n rewrites one word per 4 KiB page of a stretch of the array
 * and folds it into a running digest. After every step it sends
 * "step N DIGEST\n" over a TCP connection to 127.0.0.1:PORT (argv[1]).
 *
 * The test computes the same sequence in Go: a reported (N, DIGEST) is
 * right only if the array and the digest were carried intact across a
 * checkpoint and restore. When the connection breaks (a restore with
 * --tcp-close gives the socket back closed), it reconnects and sends the
 * step again, as the shim's safe sockets would resume.
 *
 * Usage: stateful PORT [STEP_MS]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef WORDS
#define WORDS (1u << 20)
#endif
#define STRIDE 512 /* words per 4 KiB page */
#define TOUCH 64   /* pages rewritten per step */

static uint64_t a[WORDS];

static int dial(int port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	for (int i = 0; i < 500; i++) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		if (fd < 0) {
			perror("socket");
			exit(1);
		}
		if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0)
			return fd;
		close(fd);
		usleep(20000);
	}
	fprintf(stderr, "stateful: cannot connect to port %d\n", port);
	exit(1);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: stateful PORT [STEP_MS]\n");
		return 2;
	}
	int port = atoi(argv[1]);
	int ms = argc > 2 ? atoi(argv[2]) : 10;
	signal(SIGPIPE, SIG_IGN);
	for (uint32_t i = 0; i < WORDS; i++)
		a[i] = i * 0x9e3779b97f4a7c15ull;
	uint64_t digest = 14695981039346656037ull;
	int fd = dial(port);
	for (uint64_t n = 1;; n++) {
		uint32_t base = (uint32_t)((n * TOUCH) % (WORDS / STRIDE));
		for (uint32_t p = 0; p < TOUCH; p++) {
			uint32_t w = ((base + p) % (WORDS / STRIDE)) * STRIDE + (uint32_t)(n % STRIDE);
			a[w] = a[w] * 6364136223846793005ull + n;
			digest = (digest ^ a[w]) * 1099511628211ull;
		}
		char line[64];
		int len = snprintf(line, sizeof line, "step %llu %016llx\n",
				   (unsigned long long)n, (unsigned long long)digest);
		while (write(fd, line, len) != len) {
			close(fd);
			fd = dial(port);
		}
		struct timespec ts = {0, ms * 1000000L};
		nanosleep(&ts, NULL);
	}
}
