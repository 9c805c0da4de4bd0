/*
 * mpicheck: a ping-pong and an allreduce with checked answers.
 *
 * Ranks are paired (0-1, 2-3, ...; an odd last rank pairs with nobody) and
 * exchange messages of 8 B, 4 KiB (eager), 256 KiB and 1 MiB (rendezvous)
 * whose every byte is checked; then MPI_Allreduce of integers and doubles
 * whose sums are known exactly, and a ring shift. Rank 0 prints the
 * transcript; any wrong byte or sum aborts the job with a message.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size;

static void fail(const char *what, long a, long b)
{
	fprintf(stderr, "mpicheck: FAIL rank %d: %s (%ld vs %ld)\n", rank, what, a, b);
	MPI_Abort(MPI_COMM_WORLD, 1);
}

static uint8_t pat(uint32_t s, uint64_t i)
{
	uint64_t x = i * 0x9e3779b97f4a7c15ull + s * 0xbf58476d1ce4e5b9ull + 1;
	x ^= x >> 31;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 29;
	return (uint8_t)(x >> 24);
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	int iters = argc > 1 ? atoi(argv[1]) : 20;
	static const unsigned sizes[] = {8, 4096, 256 << 10, 1 << 20};
	uint8_t *buf = malloc(1 << 20);
	if (!buf)
		fail("malloc", 0, 0);
	int peer = rank ^ 1;
	long checked = 0;
	if (peer < size) {
		for (int k = 0; k < 4; k++) {
			int n = (int)sizes[k];
			for (int it = 0; it < iters; it++) {
				uint32_t s = (uint32_t)(k * 1000 + it);
				if (rank % 2 == 0) {
					for (int i = 0; i < n; i++)
						buf[i] = pat(s, (uint64_t)i);
					MPI_Send(buf, n, MPI_BYTE, peer, k, MPI_COMM_WORLD);
					memset(buf, 0, sizes[k]);
					MPI_Recv(buf, n, MPI_BYTE, peer, k, MPI_COMM_WORLD,
						 MPI_STATUS_IGNORE);
					for (int i = 0; i < n; i++) {
						unsigned want = 0xffu ^ pat(s, (uint64_t)i);
						if (buf[i] != want)
							fail("ping-pong byte", i, n);
					}
				} else {
					MPI_Status st;
					int cnt;
					MPI_Recv(buf, n, MPI_BYTE, peer, k, MPI_COMM_WORLD, &st);
					MPI_Get_count(&st, MPI_BYTE, &cnt);
					if (cnt != n)
						fail("ping-pong count", cnt, n);
					for (int i = 0; i < n; i++) {
						if (buf[i] != pat(s, (uint64_t)i))
							fail("ping byte", i, n);
						buf[i] = (uint8_t)(0xff ^ buf[i]);
					}
					MPI_Send(buf, n, MPI_BYTE, peer, k, MPI_COMM_WORLD);
				}
				checked += n;
			}
		}
	}
	long total = 0;
	MPI_Reduce(&checked, &total, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);

	/* Allreduce: integers and doubles with exact sums, many times. */
	enum { N = 4096 };
	static long iv[N], io[N];
	static double dv[N], dout[N];
	for (int round = 0; round < iters; round++) {
		for (int i = 0; i < N; i++) {
			iv[i] = (long)(rank + 1) * (i + 1) + round;
			dv[i] = (double)(rank + 1) * 0.5 * (double)(i % 97);
		}
		MPI_Allreduce(iv, io, N, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
		MPI_Allreduce(dv, dout, N, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
		long tri = (long)size * (size + 1) / 2;
		for (int i = 0; i < N; i++) {
			if (io[i] != tri * (i + 1) + (long)size * round)
				fail("allreduce long", io[i], tri * (i + 1) + (long)size * round);
			if (dout[i] != (double)tri * 0.5 * (double)(i % 97))
				fail("allreduce double", (long)dout[i], i);
		}
	}
	/* A ring shift of the rank numbers. */
	int left = (rank + size - 1) % size, right = (rank + 1) % size, got = -1;
	MPI_Sendrecv(&rank, 1, MPI_INT, right, 9, &got, 1, MPI_INT, left, 9,
		     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
	if (got != left)
		fail("ring", got, left);
	long sum0 = 0;
	MPI_Allreduce(&io[0], &sum0, 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
	if (rank == 0) {
		printf("ranks=%d pingpong bytes checked=%ld (both ways)\n", size, total);
		printf("allreduce %d rounds of %d longs and %d doubles: exact\n", iters, N, N);
		printf("ring shift: ok\n");
		printf("mpicheck: all checks passed\n");
		fflush(stdout);
	}
	free(buf);
	MPI_Barrier(MPI_COMM_WORLD);
	MPI_Finalize();
	return 0;
}
