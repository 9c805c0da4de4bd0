/*
 * logring.c — appending to the pessimistic log's ring, and holding sends
 * until it is stable (see logring.h and observer/logring for the format).
 *
 * Why a ring and a held send, not a synchronous log per receive: measured
 * in BenchmarkLogCost (README), waiting for the protector on every receive
 * stops the stream while each record is shipped (0.42x bare bandwidth);
 * copying into a ring that radicd drains only when the process is about to
 * let something depend on it out, or when the ring is full, costs a copy
 * (0.85x with no protector at all).
 *
 * No thread of ours ever spins on radicd: a wait for the log sleeps on a
 * futex word in the shared header (cross-process, so the shared futex ops,
 * not the _PRIVATE ones). radicd is woken only by the doorbell, and only
 * when it is asleep (consumer_waiting), so a receive costs no system call.
 */
#include "shim.h"
#include "logring.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>

struct radic_log_hdr *radic_logring;
int radic_log_unsafe;

static unsigned char *log_data;
static uint64_t log_size, log_mask;
static uint64_t log_reserved; /* process-local: bytes reserved by producers */
static uint32_t log_commit_waiters;

static long futex(uint32_t *w, int op, uint32_t v, const struct timespec *ts)
{
	return syscall(SYS_futex, w, op, v, ts, NULL, 0);
}

static inline void relax(void)
{
#if defined(__x86_64__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ volatile("yield");
#endif
}

/* Asks radicd to drain: a FUTEX_WAKE only if it sleeps. */
static void ring_doorbell(struct radic_log_hdr *h)
{
	__atomic_add_fetch(&h->doorbell, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&h->consumer_waiting, __ATOMIC_SEQ_CST))
		futex(&h->doorbell, FUTEX_WAKE, 1, NULL);
}

static uint64_t now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/*
 * Sleeps until stable >= target or timeout_ms passed (-1: for ever, with
 * a log line every 5 s saying what it waits for). Returns 1 if stable.
 */
static int wait_stable(struct radic_log_hdr *h, uint64_t target, int timeout_ms, const char *why)
{
	uint64_t t0 = now_ms(), said = t0;
	for (;;) {
		uint32_t seq = __atomic_load_n(&h->stable_seq, __ATOMIC_SEQ_CST);
		uint64_t st = __atomic_load_n(&h->stable, __ATOMIC_SEQ_CST);
		if (st >= target)
			return 1;
		uint64_t el = now_ms() - t0;
		if (timeout_ms >= 0 && el >= (uint64_t)timeout_ms)
			return 0;
		__atomic_add_fetch(&h->producer_waiting, 1, __ATOMIC_SEQ_CST);
		ring_doorbell(h);
		/* Seen after our waiting count is: radicd either saw the count
		 * or stored stable (and bumped seq) before this load. */
		if (__atomic_load_n(&h->stable, __ATOMIC_SEQ_CST) < target) {
			long ms = timeout_ms >= 0 ? (long)((uint64_t)timeout_ms - el) : 1000;
			if (ms > 1000)
				ms = 1000;
			struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
			futex(&h->stable_seq, FUTEX_WAIT, seq, &ts);
		}
		__atomic_sub_fetch(&h->producer_waiting, 1, __ATOMIC_SEQ_CST);
		if (timeout_ms < 0 && now_ms() - said >= 5000) {
			said = now_ms();
			char err[sizeof h->last_error];
			memcpy(err, (const char *)h->last_error, sizeof err);
			err[sizeof err - 1] = 0;
			radic_logf("%s has waited %llu s for radicd to log %llu received bytes%s%s",
				   why, (unsigned long long)((said - t0) / 1000),
				   (unsigned long long)(target - st), err[0] ? ": " : "", err);
		}
	}
}

void radic_log_hold_slow(uint64_t head)
{
	wait_stable(radic_logring, head, -1, "a send");
}

/* Copies n bytes to ring offset at, wrapping. */
static void ring_write(uint64_t at, const void *p, size_t n)
{
	uint64_t o = at & log_mask, room = log_size - o;
	if (n <= room) {
		memcpy(log_data + o, p, n);
	} else {
		memcpy(log_data + o, p, room);
		memcpy(log_data, (const char *)p + room, n - room);
	}
}

/*
 * Appends one record of plen payload bytes taken from v (skip bytes in).
 * Space is reserved with a fetch-and-add, the copy runs with no lock, and
 * the commit (head) moves in reservation order: a producer whose
 * predecessor is still copying waits for it (briefly spinning, then on a
 * private futex on head's low word: the predecessor may itself be waiting
 * for radicd to make room).
 */
static uint64_t append(int type, int32_t result, uint64_t conn, uint64_t off,
		       const struct iovec *v, size_t n, size_t skip, size_t plen)
{
	struct radic_log_hdr *h = radic_logring;
	uint64_t len = RADIC_LOG_REC_HDR + plen, stride = (len + 7) & ~7ull;
	uint64_t at = __atomic_fetch_add(&log_reserved, stride, __ATOMIC_RELAXED);
	if (at + stride - __atomic_load_n(&h->stable, __ATOMIC_ACQUIRE) > log_size)
		wait_stable(h, at + stride - log_size, -1, "a receive (the log ring is full)");
	unsigned char rh[RADIC_LOG_REC_HDR] = {0};
	uint32_t l32 = (uint32_t)len;
	memcpy(rh, &l32, 4);
	rh[4] = (unsigned char)type;
	rh[5] = RADIC_LOG_VERSION;
	memcpy(rh + 8, &result, 4);
	memcpy(rh + 16, &conn, 8);
	memcpy(rh + 24, &off, 8);
	ring_write(at, rh, sizeof rh);
	uint64_t p = at + RADIC_LOG_REC_HDR;
	for (size_t i = 0; i < n && plen > 0; i++) {
		size_t l = v[i].iov_len;
		if (skip >= l) {
			skip -= l;
			continue;
		}
		size_t take = l - skip < plen ? l - skip : plen;
		ring_write(p, (const char *)v[i].iov_base + skip, take);
		p += take;
		plen -= take;
		skip = 0;
	}
	/* Commit in order. */
	for (int spin = 0; __atomic_load_n(&h->head, __ATOMIC_ACQUIRE) != at; spin++) {
		if (spin < 100) {
			relax();
			continue;
		}
		uint64_t cur = __atomic_load_n(&h->head, __ATOMIC_ACQUIRE);
		if (cur == at)
			break;
		__atomic_add_fetch(&log_commit_waiters, 1, __ATOMIC_SEQ_CST);
		struct timespec ts = {0, 10 * 1000 * 1000};
		futex((uint32_t *)&h->head, FUTEX_WAIT_PRIVATE, (uint32_t)cur, &ts);
		__atomic_sub_fetch(&log_commit_waiters, 1, __ATOMIC_SEQ_CST);
	}
	__atomic_store_n(&h->head, at + stride, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&log_commit_waiters, __ATOMIC_SEQ_CST))
		futex((uint32_t *)&h->head, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL);
	return at + stride;
}

uint64_t radic_log_data(uint64_t conn, const struct iovec *v, size_t n, size_t skip, size_t len,
			uint64_t off, int final)
{
	/* A record takes at most a quarter of the ring, so that a large
	 * receive never waits for room it cannot have. */
	size_t chunk = (size_t)(log_size / 4) - RADIC_LOG_REC_HDR;
	if (final && len <= chunk)
		return append(RADIC_LOG_RECV_DATA, (int32_t)len, conn, off, v, n, skip, len);
	uint64_t end = 0;
	for (size_t done = 0; done < len;) {
		size_t k = len - done < chunk ? len - done : chunk;
		end = append(RADIC_LOG_DATA, 0, conn, off + done, v, n, skip + done, k);
		done += k;
	}
	if (final)
		end = append(RADIC_LOG_RECV, (int32_t)len, conn, off + len, NULL, 0, 0, 0);
	return end;
}

uint64_t radic_log_result(uint64_t conn, long result, uint64_t recvd)
{
	return append(RADIC_LOG_RECV, (int32_t)result, conn, recvd, NULL, 0, 0, 0);
}

void radic_log_conn(int type, uint64_t conn, uint64_t arg, int hold)
{
	if (radic_logring == NULL)
		return;
	append(type, 0, conn, arg, NULL, 0, 0, 0);
	if (hold)
		radic_log_hold();
}

void radic_log_connect_failed(uint64_t peer, int err)
{
	if (radic_logring != NULL)
		append(RADIC_LOG_CONNECT, -err, 0, peer, NULL, 0, 0, 0);
}

void radic_log_ready(int call, const struct radic_log_ready *fds, size_t n, int err)
{
	if (radic_logring == NULL)
		return;
	struct iovec v = {(void *)fds, n * sizeof *fds};
	append(RADIC_LOG_READY, -err, (uint64_t)call, n, &v, 1, 0, v.iov_len);
}

void radic_log_value(int call, const void *v, size_t n)
{
	if (radic_logring == NULL)
		return;
	struct iovec iov = {(void *)v, n};
	append(RADIC_LOG_VALUE, 0, (uint64_t)call, 0, &iov, 1, 0, n);
}

/* Makes the ring file and maps it; the fd is closed at once (the mapping
 * is all the process keeps, so no fd of ours can be closed under us).
 * NULL with errno on failure. */
struct radic_log_hdr *radic_log_create(const char *path, uint64_t data_size, uint64_t owner,
				       uint64_t job)
{
	int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return NULL;
	size_t total = RADIC_LOG_HDR + data_size;
	void *p = MAP_FAILED;
	if (ftruncate(fd, (off_t)total) == 0)
		p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	int e = errno;
	REAL(close)(fd);
	if (p == MAP_FAILED) {
		unlink(path);
		errno = e;
		return NULL;
	}
	struct radic_log_hdr *h = p;
	h->version = RADIC_LOG_VERSION;
	h->hdr_size = RADIC_LOG_HDR;
	h->data_size = data_size;
	h->owner = owner;
	h->pid = (uint64_t)radic_real_pid();
	h->job = job;
	__atomic_store_n(&h->magic, RADIC_LOG_MAGIC, __ATOMIC_RELEASE);
	return h;
}

void radic_log_enable(struct radic_log_hdr *h, int unsafe_acks)
{
	log_data = (unsigned char *)h + RADIC_LOG_HDR;
	log_size = h->data_size;
	log_mask = log_size - 1;
	log_reserved = __atomic_load_n(&h->head, __ATOMIC_RELAXED);
	radic_log_unsafe = unsafe_acks;
	__atomic_store_n(&radic_logring, h, __ATOMIC_RELEASE);
}

int radic_log_flush(uint64_t target, int timeout_ms)
{
	struct radic_log_hdr *h = radic_logring;
	if (h == NULL)
		return 1;
	if (target == 0)
		target = __atomic_load_n(&h->head, __ATOMIC_ACQUIRE);
	return wait_stable(h, target, timeout_ms, "");
}

uint64_t radic_log_stable(void)
{
	return radic_logring ? __atomic_load_n(&radic_logring->stable, __ATOMIC_ACQUIRE) : 0;
}

uint64_t radic_log_head(void)
{
	return radic_logring ? __atomic_load_n(&radic_logring->head, __ATOMIC_ACQUIRE) : 0;
}
