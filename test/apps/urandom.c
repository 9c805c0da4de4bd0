/* urandom: a deliberately nondeterministic two-rank job, for the
 * divergence check of replay (issue 10, contract 8). Rank 1 sends BLOCKS
 * blocks of 64 KiB read from /dev/urandom to rank 0, one every 50 ms; rank
 * 0 answers each with its 4-byte number. A rank that is restarted and
 * replays its log regenerates other bytes than its peer received: radic
 * must stop the job with a divergence error, never let it go on.
 *
 *   urandom [BLOCKS [FIRST_ACK_MS]]     (default 64 blocks, no delay)
 *
 * FIRST_ACK_MS: rank 0 waits this long before its first answer, so that
 * rank 1 can be killed for certain before it has received anything.
 *
 * Output: rank 0 prints "urandom: rank 0 received N blocks, fnv HEX";
 * rank 1 "urandom: rank 1 sent N blocks". */
#include "common.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define BLOCK (64 << 10)

int main(int argc, char **argv)
{
	struct job j;
	job_init(&j, "urandom");
	int blocks = argc > 1 ? atoi(argv[1]) : 64;
	int first_ack_ms = argc > 2 ? atoi(argv[2]) : 0;
	if (j.size != 2 || blocks <= 0)
		die("want 2 ranks and a positive block count");
	static unsigned char buf[BLOCK];
	if (j.rank == 0) {
		int l = job_listen(&j);
		uint32_t r, k;
		int fd = job_accept(l, &r, &k);
		uint64_t h = FNV_OFFSET;
		for (uint32_t i = 0; i < (uint32_t)blocks; i++) {
			read_full(fd, buf, BLOCK, "block");
			h = fnv1a(h, buf, BLOCK);
			if (i == 0 && first_ack_ms > 0)
				usleep((useconds_t)first_ack_ms * 1000);
			write_full(fd, &i, sizeof i, "ack");
		}
		printf("urandom: rank 0 received %d blocks, fnv %016llx\n", blocks, (unsigned long long)h);
		return 0;
	}
	int fd = job_connect(&j, 0, 1, 60);
	int rnd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	if (rnd < 0)
		die("/dev/urandom");
	for (uint32_t i = 0; i < (uint32_t)blocks; i++) {
		read_full(rnd, buf, BLOCK, "/dev/urandom");
		write_full(fd, buf, BLOCK, "block");
		uint32_t a;
		read_full(fd, &a, sizeof a, "ack");
		if (a != i)
			die("ack %u for block %u", a, i);
		usleep(50000);
	}
	printf("urandom: rank 1 sent %d blocks\n", blocks);
	return 0;
}
