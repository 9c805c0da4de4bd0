/*
 * jacobi: a Jacobi solver of Laplace's equation on an N x N grid, rows
 * split across the ranks, with a checked answer.
 *
 * usage: jacobi [ITERS [N [SLEEP_US]]]   (defaults 2000, 128, 0)
 *
 * Every iteration exchanges halo rows with both neighbours (MPI_Sendrecv)
 * and updates the rank's rows; every 50 iterations an MPI_Allreduce sums
 * the squared change (the residual). At the end rank 0 gathers the grid
 * and recomputes it alone, with the same arithmetic: every value must be
 * bit-identical, and the residuals the same. SLEEP_US, slept once per
 * iteration, stretches a run over seconds without using the CPU (to inject
 * faults mid-run). Rank 0 prints "jacobi: running" once every rank has
 * done one exchange, then the transcript; a mismatch aborts the job.
 */
#include <mpi.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RES_EVERY 50

static int rank, size;

static void fail(const char *what)
{
	fprintf(stderr, "jacobi: FAIL rank %d: %s\n", rank, what);
	MPI_Abort(MPI_COMM_WORLD, 1);
}

static void init_rows(double *u, int first, int rows, int n)
{
	for (int i = 0; i < rows; i++)
		for (int j = 0; j < n; j++) {
			int g = first + i;
			u[i * n + j] = g == 0 ? 1.0 : (j == 0 ? 0.5 : 0.0);
		}
}

/* One sweep of rows [1, rows] of u (rows 0 and rows+1 are halos) into v;
 * global row first+i-1 is local row i. Returns the sum of squared changes. */
static double sweep(const double *u, double *v, int first, int rows, int n)
{
	double d = 0;
	for (int i = 1; i <= rows; i++) {
		int g = first + i - 1;
		for (int j = 0; j < n; j++) {
			double x = u[i * n + j];
			if (g > 0 && g < n - 1 && j > 0 && j < n - 1)
				x = 0.25 * (u[(i - 1) * n + j] + u[(i + 1) * n + j] + u[i * n + j - 1] + u[i * n + j + 1]);
			double c = x - u[i * n + j];
			d += c * c;
			v[i * n + j] = x;
		}
	}
	return d;
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	int iters = argc > 1 ? atoi(argv[1]) : 2000;
	int n = argc > 2 ? atoi(argv[2]) : 128;
	int sleep_us = argc > 3 ? atoi(argv[3]) : 0;
	if (n % size != 0 || n < 3)
		fail("N must be a multiple of the number of ranks");
	int rows = n / size, first = rank * rows;
	double *u = calloc((size_t)(rows + 2) * n, sizeof *u);
	double *v = calloc((size_t)(rows + 2) * n, sizeof *v);
	int nres = iters / RES_EVERY + 2;
	double *res = calloc((size_t)nres, sizeof *res);
	if (!u || !v || !res)
		fail("out of memory");
	init_rows(u + n, first, rows, n);
	memcpy(v, u, (size_t)(rows + 2) * n * sizeof *u);
	int up = rank > 0 ? rank - 1 : MPI_PROC_NULL, down = rank < size - 1 ? rank + 1 : MPI_PROC_NULL;
	int k = 0;
	for (int it = 0; it < iters; it++) {
		MPI_Sendrecv(u + n, n, MPI_DOUBLE, up, 1, u + (size_t)(rows + 1) * n, n, MPI_DOUBLE, down, 1,
			     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		MPI_Sendrecv(u + (size_t)rows * n, n, MPI_DOUBLE, down, 2, u, n, MPI_DOUBLE, up, 2,
			     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		if (it == 0) {
			MPI_Barrier(MPI_COMM_WORLD);
			if (rank == 0) {
				printf("jacobi: running (%d ranks, %dx%d, %d iterations)\n", size, n, n, iters);
				fflush(stdout);
			}
		}
		double d = sweep(u, v, first, rows, n);
		double *t = u;
		u = v;
		v = t;
		if (it % RES_EVERY == 0 || it == iters - 1) {
			double sum;
			MPI_Allreduce(&d, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
			if (k >= nres)
				fail("residual table full");
			res[k++] = sum;
		}
		if (sleep_us > 0)
			usleep((useconds_t)sleep_us);
	}
	double *all = rank == 0 ? malloc((size_t)n * n * sizeof *all) : NULL;
	if (rank == 0 && !all)
		fail("out of memory");
	MPI_Gather(u + n, rows * n, MPI_DOUBLE, all, rows * n, MPI_DOUBLE, 0, MPI_COMM_WORLD);
	if (rank == 0) {
		/* The reference: the same sweeps, on one rank. */
		double *a = calloc((size_t)(n + 2) * n, sizeof *a), *b = calloc((size_t)(n + 2) * n, sizeof *b);
		if (!a || !b)
			fail("out of memory");
		init_rows(a + n, 0, n, n);
		memcpy(b, a, (size_t)(n + 2) * n * sizeof *a);
		int kk = 0;
		for (int it = 0; it < iters; it++) {
			double d = 0;
			/* Sum the squared change per block of rows, in rank order,
			 * as the allreduce of SUM adds the ranks' partial sums. */
			double part[size];
			for (int r = 0; r < size; r++) {
				double dr = 0;
				for (int i = 1 + r * rows; i <= (r + 1) * rows; i++)
					for (int j = 0; j < n; j++) {
						double x = a[i * n + j];
						int g = i - 1;
						if (g > 0 && g < n - 1 && j > 0 && j < n - 1)
							x = 0.25 * (a[(i - 1) * n + j] + a[(i + 1) * n + j] + a[i * n + j - 1] + a[i * n + j + 1]);
						double c = x - a[i * n + j];
						dr += c * c;
						b[i * n + j] = x;
					}
				part[r] = dr;
			}
			for (int r = 0; r < size; r++)
				d += part[r];
			double *t = a;
			a = b;
			b = t;
			if (it % RES_EVERY == 0 || it == iters - 1) {
				/* The allreduce may add in another order: allow rounding. */
				double got = res[kk];
				if (fabs(got - d) > 1e-12 * (fabs(d) + 1e-300) + 1e-300) {
					fprintf(stderr, "jacobi: FAIL residual at iteration %d: %.17g, serial %.17g\n", it, got, d);
					MPI_Abort(MPI_COMM_WORLD, 1);
				}
				kk++;
			}
		}
		double sum = 0;
		for (int i = 0; i < n * n; i++) {
			if (all[i] != a[n + i]) {
				fprintf(stderr, "jacobi: FAIL grid value %d,%d: %.17g, serial %.17g\n", i / n, i % n, all[i], a[n + i]);
				MPI_Abort(MPI_COMM_WORLD, 1);
			}
			sum += all[i];
		}
		printf("jacobi: %d iterations on %dx%d: sum %.12f, last residual %.6e: matches the serial answer\n",
		       iters, n, n, sum, res[k - 1]);
		free(a);
		free(b);
	}
	free(all);
	free(u);
	free(v);
	free(res);
	MPI_Finalize();
	return 0;
}
