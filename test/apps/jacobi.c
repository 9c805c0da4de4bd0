/* jacobi: SPMD Jacobi heat diffusion on an NX x NY grid, decomposed over
 * RADIC_SIZE ranks in 1-D strips or a 2-D block grid. Every iteration each
 * rank exchanges its boundary rows/columns with its neighbours over
 * non-blocking TCP sockets driven by poll (or epoll), then updates its
 * block; every --check-every iterations the ranks agree on the largest
 * change (a max-allreduce through rank 0), as a convergence check would.
 *
 * Rank 0 prints one line whose digest depends only on the grid, the
 * iteration count and the arithmetic, never on the decomposition or the
 * order messages arrive in: every cell's final value is hashed with its
 * global index and the hashes are summed (mod 2^64) over the ranks.
 *
 *   jacobi [--nx N] [--ny N] [--n N] [--iters I] [--decomp 1d|2d]
 *          [--poller poll|epoll] [--check-every K] [--verbose]
 */
#include "common.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

enum { KIND_HALO = 1, KIND_REDUCE = 2 };
enum { NORTH, SOUTH, WEST, EAST, NDIR };

/* One connection's transfer in flight: at most one send and one receive. */
struct chan {
	int fd;
	int peer;
	const char *sbuf;
	size_t slen, sdone;
	char *rbuf;
	size_t rlen, rdone;
};

static int use_epoll;
static int epfd = -1;

static void progress(struct chan **cs, int n)
{
	struct pollfd pfd[64];
	int i, pending;
	if (n > 64)
		die("too many channels");
	for (;;) {
		pending = 0;
		for (i = 0; i < n; i++) {
			struct chan *c = cs[i];
			short ev = 0;
			if (c->sdone < c->slen)
				ev |= POLLOUT;
			if (c->rdone < c->rlen)
				ev |= POLLIN;
			pfd[i].fd = c->fd;
			pfd[i].events = ev;
			pfd[i].revents = 0;
			if (ev)
				pending++;
			if (use_epoll) {
				struct epoll_event e = {.events = (ev & POLLIN ? EPOLLIN : 0) | (ev & POLLOUT ? EPOLLOUT : 0),
							.data.u32 = (uint32_t)i};
				if (epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &e) < 0 &&
				    (errno != ENOENT || epoll_ctl(epfd, EPOLL_CTL_ADD, c->fd, &e) < 0))
					die("epoll_ctl: %s", strerror(errno));
			}
		}
		if (!pending)
			return;
		if (use_epoll) {
			struct epoll_event evs[64];
			int k = epoll_wait(epfd, evs, 64, -1);
			if (k < 0 && errno == EINTR)
				continue;
			if (k < 0)
				die("epoll_wait: %s", strerror(errno));
			for (i = 0; i < k; i++) {
				uint32_t e = evs[i].events;
				pfd[evs[i].data.u32].revents = (short)((e & EPOLLIN ? POLLIN : 0) | (e & EPOLLOUT ? POLLOUT : 0) |
								       (e & EPOLLERR ? POLLERR : 0) | (e & EPOLLHUP ? POLLHUP : 0));
			}
		} else {
			int k = poll(pfd, (nfds_t)n, -1);
			if (k < 0 && errno == EINTR)
				continue;
			if (k < 0)
				die("poll: %s", strerror(errno));
		}
		for (i = 0; i < n; i++) {
			struct chan *c = cs[i];
			short re = pfd[i].revents;
			if ((re & (POLLOUT | POLLERR | POLLHUP)) && c->sdone < c->slen) {
				ssize_t w = send(c->fd, c->sbuf + c->sdone, c->slen - c->sdone, MSG_NOSIGNAL);
				if (w < 0 && errno != EAGAIN && errno != EINTR)
					die("send to rank %d: %s", c->peer, strerror(errno));
				if (w > 0)
					c->sdone += (size_t)w;
			}
			if ((re & (POLLIN | POLLERR | POLLHUP)) && c->rdone < c->rlen) {
				ssize_t r = recv(c->fd, c->rbuf + c->rdone, c->rlen - c->rdone, 0);
				if (r == 0)
					die("recv from rank %d: the peer closed the connection", c->peer);
				if (r < 0 && errno != EAGAIN && errno != EINTR)
					die("recv from rank %d: %s", c->peer, strerror(errno));
				if (r > 0)
					c->rdone += (size_t)r;
			}
		}
	}
}

static void post(struct chan *c, const void *s, size_t slen, void *r, size_t rlen)
{
	c->sbuf = s;
	c->slen = slen;
	c->sdone = 0;
	c->rbuf = r;
	c->rlen = rlen;
	c->rdone = 0;
}

static int split_lo(int n, int parts, int i)
{
	return i * (n / parts) + (i < n % parts ? i : n % parts);
}

static void usage(void)
{
	fprintf(stderr, "usage: jacobi [--n N | --nx N --ny N] [--iters I] [--decomp 1d|2d] [--poller poll|epoll] [--check-every K] [--verbose]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	struct job j;
	int nx = 512, ny = 512, iters = 200, check = 10, twod = 1, verbose = 0;
	int pr, pc, ri, ci, r0, r1, c0, c1, lr, lc, w, i, k, it;
	int nbr[NDIR];
	struct chan halo[NDIR], *red = NULL, *act[64];
	int lfd, nred = 0;
	double *u, *v, *sb[NDIR], *rb[NDIR], t0;
	double resid = 0;
	uint64_t digest = 0;

	for (i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *val = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--verbose")) {
			verbose = 1;
			continue;
		}
		if (!val)
			usage();
		i++;
		if (!strcmp(a, "--n"))
			nx = ny = atoi(val);
		else if (!strcmp(a, "--nx"))
			nx = atoi(val);
		else if (!strcmp(a, "--ny"))
			ny = atoi(val);
		else if (!strcmp(a, "--iters"))
			iters = atoi(val);
		else if (!strcmp(a, "--check-every"))
			check = atoi(val);
		else if (!strcmp(a, "--decomp"))
			twod = !strcmp(val, "2d") ? 1 : !strcmp(val, "1d") ? 0 : (usage(), 0);
		else if (!strcmp(a, "--poller"))
			use_epoll = !strcmp(val, "epoll") ? 1 : !strcmp(val, "poll") ? 0 : (usage(), 0);
		else
			usage();
	}
	job_init(&j, "jacobi");
	if (nx < 3 || ny < 3 || iters < 0 || check < 1)
		usage();

	/* The process grid: pr rows x pc columns of ranks, as square as the
	 * rank count allows (1-D: strips of rows). */
	pr = j.size;
	pc = 1;
	if (twod)
		for (k = 1; k * k <= j.size; k++)
			if (j.size % k == 0) {
				pr = k;
				pc = j.size / k;
			}
	ri = j.rank / pc;
	ci = j.rank % pc;
	if (nx < pr || ny < pc)
		die("a %dx%d grid cannot be split over %dx%d ranks", nx, ny, pr, pc);
	r0 = split_lo(nx, pr, ri);
	r1 = split_lo(nx, pr, ri + 1);
	c0 = split_lo(ny, pc, ci);
	c1 = split_lo(ny, pc, ci + 1);
	lr = r1 - r0;
	lc = c1 - c0;
	w = lc + 2;
	nbr[NORTH] = ri > 0 ? j.rank - pc : -1;
	nbr[SOUTH] = ri < pr - 1 ? j.rank + pc : -1;
	nbr[WEST] = ci > 0 ? j.rank - 1 : -1;
	nbr[EAST] = ci < pc - 1 ? j.rank + 1 : -1;

	/* Connections: the higher rank of a pair connects, the lower accepts;
	 * every rank but 0 also connects to rank 0 for the reductions. */
	if (j.size > 1) {
		int incoming = 0;
		lfd = job_listen(&j);
		for (k = 0; k < NDIR; k++) {
			halo[k].fd = -1;
			halo[k].peer = nbr[k];
			if (nbr[k] >= 0 && nbr[k] < j.rank)
				halo[k].fd = job_connect(&j, nbr[k], KIND_HALO, 60);
			else if (nbr[k] > j.rank)
				incoming++;
		}
		if (j.rank == 0) {
			incoming += j.size - 1;
			red = calloc((size_t)j.size, sizeof *red);
			nred = j.size - 1;
		} else {
			red = calloc(1, sizeof *red);
			red[0].fd = job_connect(&j, 0, KIND_REDUCE, 60);
			red[0].peer = 0;
			nred = 1;
		}
		while (incoming-- > 0) {
			uint32_t from, kind;
			int fd = job_accept(lfd, &from, &kind);
			int placed = 0;
			if (kind == KIND_REDUCE && j.rank == 0 && from > 0 && from < (uint32_t)j.size) {
				red[from - 1].fd = fd;
				red[from - 1].peer = (int)from;
				placed = 1;
			}
			for (k = 0; k < NDIR && kind == KIND_HALO; k++)
				if (nbr[k] == (int)from && halo[k].fd < 0) {
					halo[k].fd = fd;
					placed = 1;
					break;
				}
			if (!placed)
				die("unexpected connection from rank %u (kind %u)", from, kind);
		}
		close(lfd);
		for (k = 0; k < NDIR; k++)
			if (halo[k].fd >= 0) {
				set_nonblock(halo[k].fd);
				set_nodelay(halo[k].fd);
			}
		for (k = 0; k < nred; k++) {
			set_nonblock(red[k].fd);
			set_nodelay(red[k].fd);
		}
		if (use_epoll && (epfd = epoll_create1(EPOLL_CLOEXEC)) < 0)
			die("epoll_create1: %s", strerror(errno));
	}

	u = calloc((size_t)(lr + 2) * (size_t)w, sizeof *u);
	v = calloc((size_t)(lr + 2) * (size_t)w, sizeof *v);
	for (k = 0; k < NDIR; k++) {
		int len = k < WEST ? lc : lr;
		sb[k] = calloc((size_t)len, sizeof(double));
		rb[k] = calloc((size_t)len, sizeof(double));
	}
	if (!u || !v)
		die("out of memory for a %dx%d block", lr, lc);
#define U(a, i, jj) ((a)[(size_t)(i) * (size_t)w + (size_t)(jj)])
	for (i = 1; i <= lr; i++)
		for (k = 1; k <= lc; k++) {
			int gi = r0 + i - 1, gj = c0 + k - 1;
			double x;
			if (gi == 0)
				x = 100.0;
			else if (gi == nx - 1 || gj == 0 || gj == ny - 1)
				x = 0.0;
			else
				x = (double)((gi * 31 + gj * 17) % 97) / 97.0;
			U(u, i, k) = U(v, i, k) = x;
		}

	t0 = now_s();
	for (it = 0; it < iters; it++) {
		int na = 0;
		double dmax = 0;
		/* Halo exchange. */
		for (k = 0; k < NDIR; k++) {
			int len = k < WEST ? lc : lr, q;
			if (nbr[k] < 0)
				continue;
			for (q = 0; q < len; q++)
				sb[k][q] = k == NORTH ? U(u, 1, q + 1) : k == SOUTH ? U(u, lr, q + 1) : k == WEST ? U(u, q + 1, 1) : U(u, q + 1, lc);
			post(&halo[k], sb[k], (size_t)len * sizeof(double), rb[k], (size_t)len * sizeof(double));
			act[na++] = &halo[k];
		}
		progress(act, na);
		for (k = 0; k < NDIR; k++) {
			int len = k < WEST ? lc : lr, q;
			if (nbr[k] < 0)
				continue;
			for (q = 0; q < len; q++) {
				if (k == NORTH)
					U(u, 0, q + 1) = rb[k][q];
				else if (k == SOUTH)
					U(u, lr + 1, q + 1) = rb[k][q];
				else if (k == WEST)
					U(u, q + 1, 0) = rb[k][q];
				else
					U(u, q + 1, lc + 1) = rb[k][q];
			}
		}
		/* Update the interior of the global grid. */
		for (i = 1; i <= lr; i++) {
			int gi = r0 + i - 1;
			if (gi == 0 || gi == nx - 1)
				continue;
			for (k = 1; k <= lc; k++) {
				int gj = c0 + k - 1;
				double x, d;
				if (gj == 0 || gj == ny - 1)
					continue;
				x = ((U(u, i - 1, k) + U(u, i + 1, k)) + (U(u, i, k - 1) + U(u, i, k + 1))) * 0.25;
				d = fabs(x - U(u, i, k));
				if (d > dmax)
					dmax = d;
				U(v, i, k) = x;
			}
		}
		{
			double *t = u;
			u = v;
			v = t;
		}
		/* Convergence check: max-allreduce through rank 0. */
		if ((it + 1) % check == 0 || it == iters - 1) {
			if (j.size > 1) {
				double *vals = calloc((size_t)j.size, sizeof(double));
				if (j.rank == 0) {
					for (k = 0; k < nred; k++) {
						post(&red[k], NULL, 0, &vals[k + 1], sizeof(double));
						act[k] = &red[k];
					}
					progress(act, nred);
					for (k = 1; k < j.size; k++)
						if (vals[k] > dmax)
							dmax = vals[k];
					for (k = 0; k < nred; k++) {
						post(&red[k], &dmax, sizeof dmax, NULL, 0);
						act[k] = &red[k];
					}
					progress(act, nred);
				} else {
					double mine = dmax;
					post(&red[0], &mine, sizeof mine, &dmax, sizeof dmax);
					act[0] = &red[0];
					progress(act, 1);
				}
				free(vals);
			}
			resid = dmax;
		}
	}

	/* Digest: order-independent sum of per-cell hashes. */
	for (i = 1; i <= lr; i++)
		for (k = 1; k <= lc; k++) {
			uint64_t bits, idx = (uint64_t)(r0 + i - 1) * (uint64_t)ny + (uint64_t)(c0 + k - 1);
			memcpy(&bits, &U(u, i, k), sizeof bits);
			digest += mix64(idx * 0x9e3779b97f4a7c15ULL ^ mix64(bits));
		}
	if (j.size > 1) {
		if (j.rank == 0) {
			uint64_t *parts = calloc((size_t)j.size, sizeof(uint64_t));
			for (k = 0; k < nred; k++) {
				post(&red[k], NULL, 0, &parts[k + 1], sizeof(uint64_t));
				act[k] = &red[k];
			}
			progress(act, nred);
			for (k = 1; k < j.size; k++)
				digest += parts[k];
			free(parts);
		} else {
			post(&red[0], &digest, sizeof digest, NULL, 0);
			act[0] = &red[0];
			progress(act, 1);
		}
	}
	if (verbose)
		fprintf(stderr, "jacobi[rank %d]: block %dx%d at (%d,%d) of a %dx%d process grid, %d iterations in %.3f s\n",
			j.rank, lr, lc, r0, c0, pr, pc, iters, now_s() - t0);
	if (j.rank == 0)
		printf("jacobi nx=%d ny=%d iters=%d residual=%a digest=%016llx\n", nx, ny, iters, resid,
		       (unsigned long long)digest);
	fflush(stdout);
	/* Leave the connections for the kernel to close at exit: every rank
	 * has everything it needs, and rank 0 has printed. */
	return 0;
}
