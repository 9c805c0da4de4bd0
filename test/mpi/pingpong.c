/*
 * pingpong: MPI ping-pong between ranks 0 and 1, the benchmark of the
 * preload under an MPI library.
 *
 *   pingpong [SMALL_ITERS [BIG_ITERS]]
 *
 * Rank 0 prints
 *
 *   lat_us=L    half the mean 8 B round trip, in microseconds
 *   bw_MBps=B   1 MiB ping-pong bandwidth, 2 * bytes / time, in MB/s
 *
 * The first tenth of each phase is warm-up. The first and last message of
 * each size are checked byte for byte.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BIG (1 << 20)

static int rank;

static double phase(char *buf, int n, int iters)
{
	double t0 = 0;
	for (int i = 0; i < iters; i++) {
		if (i == iters / 10) {
			MPI_Barrier(MPI_COMM_WORLD);
			t0 = MPI_Wtime();
		}
		if (i == 0 || i == iters - 1)
			for (int k = 0; k < n; k++)
				buf[k] = rank == 0 ? (char)(k * 7 + i) : 0;
		if (rank == 0) {
			MPI_Send(buf, n, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
			MPI_Recv(buf, n, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		} else if (rank == 1) {
			MPI_Recv(buf, n, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			MPI_Send(buf, n, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
		}
		if ((i == 0 || i == iters - 1) && rank < 2)
			for (int k = 0; k < n; k++)
				if (buf[k] != (char)(k * 7 + i)) {
					fprintf(stderr, "pingpong: FAIL rank %d byte %d of %d\n", rank, k, n);
					MPI_Abort(MPI_COMM_WORLD, 1);
				}
	}
	return (MPI_Wtime() - t0) / (iters - iters / 10);
}

int main(int argc, char **argv)
{
	int size;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	int small = argc > 1 ? atoi(argv[1]) : 10000;
	int big = argc > 2 ? atoi(argv[2]) : 200;
	if (size < 2 || small < 10 || big < 10) {
		if (rank == 0)
			fprintf(stderr, "pingpong: needs 2 ranks and >= 10 iterations\n");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	char *buf = malloc(BIG);
	double rtt = phase(buf, 8, small);
	double rtt_big = phase(buf, BIG, big);
	if (rank == 0) {
		printf("lat_us=%.3f\n", rtt / 2 * 1e6);
		printf("bw_MBps=%.1f\n", 2.0 * BIG / rtt_big / 1e6);
	}
	free(buf);
	MPI_Finalize();
	return 0;
}
