/* Shared plumbing of the radic test applications: the launch environment
 * (RADIC_RANK, RADIC_SIZE, RADIC_PEERS), connection setup that tolerates
 * peers starting in any order, full reads and writes, and hashing for the
 * digests. The applications use sockets the way real SPMD and master/worker
 * codes do; nothing here knows about radic. */
#ifndef RADIC_APPS_COMMON_H
#define RADIC_APPS_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <netinet/in.h>

struct job {
	int rank;
	int size;
	struct sockaddr_in *peers; /* size entries; rank i listens on peers[i] */
};

/* Reads RADIC_RANK, RADIC_SIZE and RADIC_PEERS. With RADIC_SIZE unset the
 * job is one rank. Exits with a message on malformed input. */
void job_init(struct job *j, const char *prog);

/* Listens on peers[rank] (SO_REUSEADDR, large backlog). */
int job_listen(const struct job *j);

/* Connects to peers[to], retrying while the peer is not up yet
 * (ECONNREFUSED and friends) for up to timeout_s seconds, then sends a
 * hello of two 32-bit words: our rank and a connection kind. Blocking fd. */
int job_connect(const struct job *j, int to, uint32_t kind, double timeout_s);
/* How many connects the last job_connect made (refused ones retried);
 * job_connect_nonblock: make them on non-blocking sockets, the strict
 * POSIX way (EINPROGRESS, poll, SO_ERROR). */
extern int job_connect_tries, job_connect_nonblock;

/* Accepts one connection and reads its hello. Blocking fd. */
int job_accept(int lfd, uint32_t *rank, uint32_t *kind);

/* Blocking full write / read; exit with a message on error or EOF. */
void write_full(int fd, const void *buf, size_t len, const char *what);
void read_full(int fd, void *buf, size_t len, const char *what);

void set_nonblock(int fd);
void set_nodelay(int fd);

double now_s(void);

uint64_t mix64(uint64_t x);
uint64_t fnv1a(uint64_t h, const void *p, size_t n);
#define FNV_OFFSET 0xcbf29ce484222325ULL

void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

extern const char *progname;
extern int myrank;

#endif
