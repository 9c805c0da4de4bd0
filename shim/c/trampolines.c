/*
 * trampolines.c — the interposed libc entry points.
 *
 * Shape of every data trampoline:
 *
 *	if (managed(fd) && Go handled it)  return Go's result;
 *	return real(fd, ...);
 *
 * The unmanaged path is one byte load, one branch and the real call. Calls
 * that create fds (socket, accept, dup) make the real call first and then
 * tell Go about the new fd; calls that retire fds (close, dup2 onto an fd,
 * close_range, closefrom) tell Go first. The fd table is only written by the
 * process that owns the Go runtime: a vfork child shares our memory and must
 * leave it alone.
 */
#include "shim.h"
#include "conn.h"
#include "logring.h"

#include <fcntl.h>
#include <string.h>
#include <stdarg.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/syscall.h>
#include <time.h>

/* Asks Go about a call; returns 1 with *ret set when Go handled it. */
static inline int go_call(int op, int fd, long a0, long a1, long a2, long a3, long a4, long a5,
			  long *ret)
{
	struct radic_call c = {.op = op, .fd = fd, .args = {a0, a1, a2, a3, a4, a5}};
	if (radic_enter(&c) != RADIC_DONE)
		return 0;
	*ret = c.ret;
	return 1;
}

/* Tells Go about something that already happened (a new fd); no verdict. */
static inline void go_notify(int op, int fd, long a0, long a1, long a2)
{
	struct radic_call c = {.op = op, .fd = fd, .args = {a0, a1, a2}};
	(void)radic_enter(&c);
}

static inline int owner(void) { return radic_real_pid() == radic_owner_pid; }

/* A new fd number came back from the kernel: whatever the table said about
 * that number belonged to an fd that is gone. */
static inline void fresh_fd(int fd)
{
	if (RADIC_UNLIKELY(radic_fd_get(fd) != 0) && owner()) {
		radic_conn_detach(fd);
		radic_fd_forget(fd);
	}
}

/* The fd number is about to be closed (explicitly or by dup2 onto it). */
static void retire_fd(int fd)
{
	unsigned f = radic_fd_get(fd);
	if (f == 0 || !owner())
		return;
	/* A close of a connection sends its close marker: held like a send
	 * until what this process received is logged. */
	if (f & RADIC_FD_MANAGED)
		radic_log_hold();
	if (f & (RADIC_FD_MANAGED | RADIC_FD_LISTENER))
		go_notify(RADIC_OP_close, fd, 0, 0, 0);
	radic_conn_detach(fd);
	radic_fd_forget(fd);
}

/* newfd is a duplicate of oldfd: it shares oldfd's socket. */
static void dup_fd(int oldfd, int newfd)
{
	fresh_fd(newfd);
	if (radic_fd_get(oldfd) & (RADIC_FD_MANAGED | RADIC_FD_CANDIDATE | RADIC_FD_LISTENER))
		go_notify(RADIC_OP_dup, oldfd, newfd, 0, 0);
}

#define MANAGED(fd) RADIC_UNLIKELY(radic_is_managed(fd))
#define GO(op, fd, ...) go_call(RADIC_OP_##op, fd, __VA_ARGS__, &r)

/* A safe socket's state, for a managed fd of this process (a fork child
 * shares the connection's bytes but not its bookkeeping: plain calls). */
static inline struct radic_conn *conn(int fd)
{
	return RADIC_UNLIKELY(radic_in_child) ? NULL : radic_conn_of(fd);
}

/* Lifecycle calls on these go to Go: a managed connection, a TCP socket not
 * yet connected (it may become one), a radic listener. */
#define CONTROLLED(fd)                                                                   \
	RADIC_UNLIKELY(radic_fd_get(fd) & (RADIC_FD_MANAGED | RADIC_FD_CANDIDATE | RADIC_FD_LISTENER))

static inline ssize_t conn_recv1(struct radic_conn *c, int fd, void *buf, size_t n, int flags)
{
	struct iovec v = {buf, n};
	struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1};
	return radic_conn_recv(c, fd, &m, flags);
}

/* recvfrom on a safe socket: a connected stream names no sender. */
static inline ssize_t conn_recvfrom(struct radic_conn *c, int fd, void *buf, size_t n, int flags,
				    socklen_t *fromlen)
{
	ssize_t k = conn_recv1(c, fd, buf, n, flags);
	if (k >= 0 && fromlen != NULL)
		*fromlen = 0; /* what TCP reports */
	return k;
}

static inline ssize_t conn_send1(struct radic_conn *c, int fd, const void *buf, size_t n,
				 int flags)
{
	struct iovec v = {(void *)buf, n};
	struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1};
	return radic_conn_send(c, fd, &m, flags);
}

/* ---- data ----------------------------------------------------------------- */

ssize_t read(int fd, void *buf, size_t n)
{
	long r;
	if (MANAGED(fd)) {
		struct radic_conn *c = conn(fd);
		if (c)
			return conn_recv1(c, fd, buf, n, 0);
		if (GO(read, fd, (long)buf, (long)n, 0, 0, 0, 0))
			return r;
	}
	return radic_fault_drop(fd, REAL(read)(fd, buf, n), 0);
}

ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen)
{
	long r;
	if (MANAGED(fd) && n <= buflen) {
		struct radic_conn *c = conn(fd);
		if (c)
			return conn_recv1(c, fd, buf, n, 0);
		if (GO(read, fd, (long)buf, (long)n, 0, 0, 0, 0))
			return r;
	}
	return radic_fault_drop(fd, REAL(__read_chk)(fd, buf, n, buflen), 0);
}

ssize_t write(int fd, const void *buf, size_t n)
{
	long r;
	if (MANAGED(fd)) {
		struct radic_conn *c = conn(fd);
		if (c)
			return conn_send1(c, fd, buf, n, 0);
		if (GO(write, fd, (long)buf, (long)n, 0, 0, 0, 0))
			return r;
	}
	return REAL(write)(fd, buf, n);
}

ssize_t readv(int fd, const struct iovec *iov, int cnt)
{
	long r;
	if (MANAGED(fd)) {
		struct radic_conn *c = conn(fd);
		if (c) {
			struct msghdr m = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)cnt};
			return radic_conn_recv(c, fd, &m, 0);
		}
		if (GO(readv, fd, (long)iov, cnt, 0, 0, 0, 0))
			return r;
	}
	return radic_fault_drop(fd, REAL(readv)(fd, iov, cnt), 0);
}

ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
	long r;
	if (MANAGED(fd)) {
		struct radic_conn *c = conn(fd);
		if (c) {
			struct msghdr m = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)cnt};
			return radic_conn_send(c, fd, &m, 0);
		}
		if (GO(writev, fd, (long)iov, cnt, 0, 0, 0, 0))
			return r;
	}
	return REAL(writev)(fd, iov, cnt);
}

ssize_t send(int fd, const void *buf, size_t n, int flags)
{
	long r;
	if (MANAGED(fd)) {
		struct radic_conn *c = conn(fd);
		if (c)
			return conn_send1(c, fd, buf, n, flags);
		if (GO(send, fd, (long)buf, (long)n, flags, 0, 0, 0))
			return r;
	}
	return REAL(send)(fd, buf, n, flags);
}

ssize_t sendto(int fd, const void *buf, size_t n, int flags, const struct sockaddr *to,
	       socklen_t tolen)
{
	long r;
	if (MANAGED(fd)) {
		struct radic_conn *c = conn(fd);
		if (c) /* a connected stream ignores the address */
			return conn_send1(c, fd, buf, n, flags);
		if (GO(sendto, fd, (long)buf, (long)n, flags, (long)to, tolen, 0))
			return r;
	}
	return REAL(sendto)(fd, buf, n, flags, to, tolen);
}

ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
	long r;
	if (MANAGED(fd)) {
		struct radic_conn *c = conn(fd);
		if (c)
			return radic_conn_send(c, fd, msg, flags);
		if (GO(sendmsg, fd, (long)msg, flags, 0, 0, 0, 0))
			return r;
	}
	return REAL(sendmsg)(fd, msg, flags);
}

int sendmmsg(int fd, struct mmsghdr *vec, unsigned int vlen, int flags)
{
	long r;
	if (MANAGED(fd)) {
		struct radic_conn *c = conn(fd);
		if (c) {
			unsigned int i;
			for (i = 0; i < vlen; i++) {
				ssize_t k = radic_conn_send(c, fd, &vec[i].msg_hdr, flags);
				if (k < 0)
					return i > 0 ? (int)i : -1;
				vec[i].msg_len = (unsigned int)k;
			}
			return (int)i;
		}
		if (GO(sendmmsg, fd, (long)vec, vlen, flags, 0, 0, 0))
			return (int)r;
	}
	return REAL(sendmmsg)(fd, vec, vlen, flags);
}

ssize_t recv(int fd, void *buf, size_t n, int flags)
{
	long r;
	if (MANAGED(fd)) {
		struct radic_conn *c = conn(fd);
		if (c)
			return conn_recv1(c, fd, buf, n, flags);
		if (GO(recv, fd, (long)buf, (long)n, flags, 0, 0, 0))
			return r;
	}
	return radic_fault_drop(fd, REAL(recv)(fd, buf, n, flags), flags);
}

ssize_t __recv_chk(int fd, void *buf, size_t n, size_t buflen, int flags)
{
	long r;
	if (MANAGED(fd) && n <= buflen) {
		struct radic_conn *c = conn(fd);
		if (c)
			return conn_recv1(c, fd, buf, n, flags);
		if (GO(recv, fd, (long)buf, (long)n, flags, 0, 0, 0))
			return r;
	}
	return radic_fault_drop(fd, REAL(__recv_chk)(fd, buf, n, buflen, flags), flags);
}

ssize_t recvfrom(int fd, void *buf, size_t n, int flags, struct sockaddr *from,
		 socklen_t *fromlen)
{
	long r;
	if (MANAGED(fd)) {
		struct radic_conn *c = conn(fd);
		if (c)
			return conn_recvfrom(c, fd, buf, n, flags, fromlen);
		if (GO(recvfrom, fd, (long)buf, (long)n, flags, (long)from, (long)fromlen, 0))
			return r;
	}
	return radic_fault_drop(fd, REAL(recvfrom)(fd, buf, n, flags, from, fromlen), flags);
}

ssize_t __recvfrom_chk(int fd, void *buf, size_t n, size_t buflen, int flags,
		       struct sockaddr *from, socklen_t *fromlen)
{
	long r;
	if (MANAGED(fd) && n <= buflen) {
		struct radic_conn *c = conn(fd);
		if (c)
			return conn_recvfrom(c, fd, buf, n, flags, fromlen);
		if (GO(recvfrom, fd, (long)buf, (long)n, flags, (long)from, (long)fromlen, 0))
			return r;
	}
	return radic_fault_drop(
		fd, REAL(__recvfrom_chk)(fd, buf, n, buflen, flags, from, fromlen), flags);
}

ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
	long r;
	if (MANAGED(fd)) {
		struct radic_conn *c = conn(fd);
		if (c)
			return radic_conn_recv(c, fd, msg, flags);
		if (GO(recvmsg, fd, (long)msg, flags, 0, 0, 0, 0))
			return r;
	}
	return radic_fault_drop(fd, REAL(recvmsg)(fd, msg, flags), flags);
}

int recvmmsg(int fd, struct mmsghdr *vec, unsigned int vlen, int flags, struct timespec *tmo)
{
	long r;
	if (MANAGED(fd)) {
		struct radic_conn *c = conn(fd);
		if (c) {
			if (vlen == 0)
				return 0;
			ssize_t k = radic_conn_recv(c, fd, &vec[0].msg_hdr, flags & ~MSG_WAITFORONE);
			if (k < 0)
				return -1;
			vec[0].msg_len = (unsigned int)k;
			return 1; /* one message at a time: a stream has no boundaries */
		}
		if (GO(recvmmsg, fd, (long)vec, vlen, flags, (long)tmo, 0, 0))
			return (int)r;
	}
	return REAL(recvmmsg)(fd, vec, vlen, flags, tmo);
}

/* sendfile or splice onto (or splice off) a safe socket: the bytes must
 * pass through the retransmit ring, so copy them through a buffer. */
static ssize_t bounce(int in, off_t *inoff, int out, off_t *outoff, size_t n)
{
	char buf[64 << 10];
	size_t want = n < sizeof buf ? n : sizeof buf;
	struct radic_conn *ci = MANAGED(in) ? conn(in) : NULL;
	ssize_t got = ci ? conn_recv1(ci, in, buf, want, 0)
			 : inoff ? pread(in, buf, want, *inoff) : REAL(read)(in, buf, want);
	if (got <= 0)
		return got;
	struct radic_conn *co = MANAGED(out) ? conn(out) : NULL;
	size_t put = 0;
	while (put < (size_t)got) {
		ssize_t w = co ? conn_send1(co, out, buf + put, (size_t)got - put, 0)
			       : outoff ? pwrite(out, buf + put, (size_t)got - put, *outoff + (off_t)put)
					: REAL(write)(out, buf + put, (size_t)got - put);
		if (w < 0) {
			if (put == 0)
				return -1;
			break;
		}
		put += (size_t)w;
	}
	if (inoff)
		*inoff += (off_t)put;
	if (outoff)
		*outoff += (off_t)put;
	return (ssize_t)put;
}

static inline int bounce_needed(int a, int b)
{
	return (MANAGED(a) && conn(a)) || (MANAGED(b) && conn(b));
}

ssize_t sendfile(int out, int in, off_t *off, size_t n)
{
	long r;
	if (RADIC_UNLIKELY(bounce_needed(out, in)))
		return bounce(in, off, out, NULL, n);
	if ((MANAGED(out) || MANAGED(in)) &&
	    GO(sendfile, MANAGED(out) ? out : in, out, in, (long)off, (long)n, 0, 0))
		return r;
	return REAL(sendfile)(out, in, off, n);
}

ssize_t sendfile64(int out, int in, off_t *off, size_t n)
{
	long r;
	if (RADIC_UNLIKELY(bounce_needed(out, in)))
		return bounce(in, off, out, NULL, n);
	if ((MANAGED(out) || MANAGED(in)) &&
	    GO(sendfile, MANAGED(out) ? out : in, out, in, (long)off, (long)n, 0, 0))
		return r;
	return REAL(sendfile64)(out, in, off, n);
}

ssize_t splice(int in, off_t *inoff, int out, off_t *outoff, size_t n, unsigned int flags)
{
	long r;
	if (RADIC_UNLIKELY(bounce_needed(in, out)))
		return bounce(in, inoff, out, outoff, n);
	if ((MANAGED(in) || MANAGED(out)) &&
	    GO(splice, MANAGED(in) ? in : out, in, (long)inoff, out, (long)outoff, (long)n, flags))
		return r;
	return REAL(splice)(in, inoff, out, outoff, n, flags);
}

/* ---- lifecycle ------------------------------------------------------------- */

int socket(int domain, int type, int proto)
{
	int fd = REAL(socket)(domain, type, proto);
	if (fd < 0)
		return fd;
	fresh_fd(fd);
	if (RADIC_LIKELY(radic_manage_policy == RADIC_MANAGE_NONE) || radic_in_child ||
	    (type & 0xf) != SOCK_STREAM)
		return fd;
	if (radic_manage_policy == RADIC_MANAGE_JOB) {
		/* Whether it is managed is decided at connect or listen. */
		if (domain == AF_INET)
			radic_fd_set(fd, RADIC_FD_CANDIDATE);
	} else if (domain == AF_INET || domain == AF_INET6) {
		go_notify(RADIC_OP_socket, fd, domain, type, proto);
	}
	return fd;
}

int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	long r;
	if (CONTROLLED(fd) && GO(connect, fd, (long)addr, len, 0, 0, 0, 0))
		return (int)r;
	return REAL(connect)(fd, addr, len);
}

/* The accepted fd is new: Go hears of it after the real accept (it decides
 * whether the connection is managed, or that the app must not see it at
 * all: RADIC_ACCEPT_HIDE, a second stream of a connection the app has). */
static int accepted(int lfd, int fd, struct sockaddr *addr, socklen_t *len)
{
	if (fd < 0)
		return fd;
	fresh_fd(fd);
	if (CONTROLLED(lfd)) {
		struct radic_call call = {.op = RADIC_OP_accept, .fd = lfd, .args = {fd}};
		if (radic_enter(&call) == RADIC_DONE && call.ret == RADIC_ACCEPT_HIDE) {
			syscall(SYS_close, fd);
			return RADIC_ACCEPT_HIDE;
		}
		/* A managed peer is known by its logical address. */
		struct radic_conn *c = MANAGED(fd) ? conn(fd) : NULL;
		if (c != NULL && addr != NULL && len != NULL) {
			int saved = errno;
			radic_conn_name(c, 1, addr, len);
			errno = saved;
		}
	}
	return fd;
}

/* A hidden connection is followed by the next one, as the kernel would
 * have: a blocking listener waits for it, a non-blocking one says EAGAIN. */
int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
	socklen_t room = len != NULL ? *len : 0;
	int r;
	while ((r = accepted(fd, REAL(accept)(fd, addr, len), addr, len)) == RADIC_ACCEPT_HIDE)
		if (len != NULL)
			*len = room;
	return r;
}

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
	socklen_t room = len != NULL ? *len : 0;
	int r;
	while ((r = accepted(fd, REAL(accept4)(fd, addr, len, flags), addr, len)) == RADIC_ACCEPT_HIDE)
		if (len != NULL)
			*len = room;
	return r;
}

int bind(int fd, const struct sockaddr *addr, socklen_t len)
{
	long r;
	if (CONTROLLED(fd) && GO(bind, fd, (long)addr, len, 0, 0, 0, 0))
		return (int)r;
	return REAL(bind)(fd, addr, len);
}

int listen(int fd, int backlog)
{
	long r;
	if (CONTROLLED(fd) && GO(listen, fd, backlog, 0, 0, 0, 0, 0))
		return (int)r;
	return REAL(listen)(fd, backlog);
}

int shutdown(int fd, int how)
{
	long r;
	if (MANAGED(fd) && how != SHUT_RD)
		radic_log_hold(); /* the close marker, like a send */
	if (MANAGED(fd) && GO(shutdown, fd, how, 0, 0, 0, 0, 0))
		return (int)r;
	return REAL(shutdown)(fd, how);
}

int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
	long r;
	if (CONTROLLED(fd) && GO(setsockopt, fd, level, name, (long)val, len, 0, 0))
		return (int)r;
	return REAL(setsockopt)(fd, level, name, val, len);
}

int getsockopt(int fd, int level, int name, void *val, socklen_t *len)
{
	long r;
	if (MANAGED(fd) && GO(getsockopt, fd, level, name, (long)val, (long)len, 0, 0))
		return (int)r;
	return REAL(getsockopt)(fd, level, name, val, len);
}

int getsockname(int fd, struct sockaddr *addr, socklen_t *len)
{
	long r;
	if (MANAGED(fd)) {
		struct radic_conn *c = conn(fd);
		int k = c ? radic_conn_name(c, 0, addr, len) : -1;
		if (k != -1)
			return k == 0 ? 0 : -1;
		if (GO(getsockname, fd, (long)addr, (long)len, 0, 0, 0, 0))
			return (int)r;
	} else if (CONTROLLED(fd) && GO(getsockname, fd, (long)addr, (long)len, 0, 0, 0, 0)) {
		return (int)r; /* a socket bound to the node's logical address */
	}
	return REAL(getsockname)(fd, addr, len);
}

int getpeername(int fd, struct sockaddr *addr, socklen_t *len)
{
	long r;
	if (MANAGED(fd)) {
		struct radic_conn *c = conn(fd);
		int k = c ? radic_conn_name(c, 1, addr, len) : -1;
		if (k != -1)
			return k == 0 ? 0 : -1;
		if (GO(getpeername, fd, (long)addr, (long)len, 0, 0, 0, 0))
			return (int)r;
	}
	return REAL(getpeername)(fd, addr, len);
}

/* A private fd of the library (the Go runtime's poller): closing it would kill
 * the runtime, so the process is told it worked. Only the owner protects it:
 * in a fork child Go is gone and the fd is just an inherited copy. */
static int is_protected(int fd)
{
	return RADIC_UNLIKELY(radic_fd_get(fd) & RADIC_FD_PRIVATE) && owner();
}

int close(int fd)
{
	if (RADIC_LIKELY(radic_fd_get(fd) == 0))
		return REAL(close)(fd);
	if (is_protected(fd))
		return 0;
	retire_fd(fd);
	return REAL(close)(fd);
}

/* The fds in [lo, hi] are about to be closed: forget what the table knew. */
static void retire_range(unsigned lo, unsigned hi)
{
	if (!owner())
		return;
	unsigned top = hi < RADIC_FD_MAX - 1 ? hi : RADIC_FD_MAX - 1;
	for (unsigned fd = lo; fd <= top; fd++)
		if (radic_fdflags[fd] != 0 && !(radic_fdflags[fd] & RADIC_FD_PRIVATE))
			retire_fd((int)fd);
}

/* close_range(2) over [lo, hi], stepping around the private fds. */
static int close_range_around_private(unsigned lo, unsigned hi, int flags)
{
	int keep[16];
	int n = owner() ? radic_fd_private_in_range(lo, hi, keep, 16) : 0;
	if (!(flags & CLOSE_RANGE_CLOEXEC))
		retire_range(lo, hi);
	unsigned from = lo;
	for (int i = 0; i < n; i++) {
		if ((unsigned)keep[i] > from &&
		    REAL(close_range)(from, (unsigned)keep[i] - 1, flags) < 0)
			return -1;
		from = (unsigned)keep[i] + 1;
	}
	return from <= hi ? REAL(close_range)(from, hi, flags) : 0;
}

int close_range(unsigned int lo, unsigned int hi, int flags)
{
	if (lo > hi) {
		errno = EINVAL;
		return -1;
	}
	return close_range_around_private(lo, hi, flags);
}

void closefrom(int lo)
{
	int keep[1];
	if (lo < 0)
		lo = 0;
	if (owner() && radic_fd_private_in_range((unsigned)lo, ~0U, keep, 1) > 0) {
		int saved = errno;
		close_range_around_private((unsigned)lo, ~0U, 0);
		errno = saved;
		return;
	}
	retire_range((unsigned)lo, ~0U);
	REAL(closefrom)(lo);
}

int dup(int fd)
{
	int nfd = REAL(dup)(fd);
	if (nfd >= 0)
		dup_fd(fd, nfd);
	return nfd;
}

/* dup2 or dup3 onto a private fd would silently replace the Go runtime's
 * poller under it: refuse, loudly. */
static int refuse_private_target(int newfd)
{
	radic_logf("refusing to replace fd %d: it belongs to radic's runtime", newfd);
	errno = EBADF;
	return -1;
}

/* dup2 and dup3: newfd is closed and becomes a duplicate of oldfd. */
static int dup_onto(int oldfd, int newfd, int flags, int is_dup3)
{
#define REAL_DUP_ONTO() (is_dup3 ? REAL(dup3)(oldfd, newfd, flags) : REAL(dup2)(oldfd, newfd))
	if (oldfd == newfd || (radic_fd_get(oldfd) | radic_fd_get(newfd)) == 0)
		return REAL_DUP_ONTO();
	if (is_protected(newfd))
		return refuse_private_target(newfd);
	retire_fd(newfd);
	int r = REAL_DUP_ONTO();
	if (r >= 0)
		dup_fd(oldfd, r);
	return r;
#undef REAL_DUP_ONTO
}

int dup2(int oldfd, int newfd) { return dup_onto(oldfd, newfd, 0, 0); }

int dup3(int oldfd, int newfd, int flags) { return dup_onto(oldfd, newfd, flags, 1); }

/* fcntl's third argument is an int or a pointer depending on cmd; on the
 * supported ABI (x86-64, aarch64) both travel in one register, so reading
 * it as a pointer and passing it on is exact. */
static int do_fcntl(int (*real)(int, int, ...), int fd, int cmd, void *arg)
{
	long r;
	if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) {
		int nfd = real(fd, cmd, arg);
		if (nfd >= 0)
			dup_fd(fd, nfd);
		return nfd;
	}
	if (MANAGED(fd)) {
		struct radic_conn *c = conn(fd);
		if (c) {
			int k = real(fd, cmd, arg);
			if (k == 0 && cmd == F_SETFL)
				radic_conn_fcntl_flags(c, (int)(long)arg);
			return k;
		}
		if (GO(fcntl, fd, cmd, (long)arg, 0, 0, 0, 0))
			return (int)r;
	}
	return real(fd, cmd, arg);
}

int fcntl(int fd, int cmd, ...)
{
	va_list ap;
	va_start(ap, cmd);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	return do_fcntl(REAL(fcntl), fd, cmd, arg);
}

int fcntl64(int fd, int cmd, ...)
{
	va_list ap;
	va_start(ap, cmd);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	return do_fcntl(REAL(fcntl64), fd, cmd, arg);
}

int ioctl(int fd, unsigned long req, ...)
{
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	long r;
	if (MANAGED(fd)) {
		struct radic_conn *c = conn(fd);
		if (c) {
			int k = REAL(ioctl)(fd, req, arg);
			if (k == 0 && req == FIONBIO && arg != NULL)
				radic_conn_fcntl_flags(c, *(int *)arg ? O_NONBLOCK : 0);
			return k;
		}
		if (GO(ioctl, fd, (long)req, (long)arg, 0, 0, 0, 0))
			return (int)r;
	}
	return REAL(ioctl)(fd, req, arg);
}

/* ---- waiting --------------------------------------------------------------- */

/*
 * Test mode hands waiting calls to Go just before they wait. The Go runtime
 * preempts with SIGURG, and one aimed at this thread while it was in Go can
 * land in the wait that follows: an EINTR the program did not cause. So the
 * wait that follows a trip through Go blocks SIGURG (test mode only; a
 * program's own SIGURG is delivered when the wait returns).
 */
static const sigset_t *without_urg(const sigset_t *mask, sigset_t *buf)
{
	if (mask != NULL)
		*buf = *mask;
	else
		pthread_sigmask(SIG_BLOCK, NULL, buf);
	sigaddset(buf, SIGURG);
	return buf;
}

/* Does a poll set hold a managed fd? Skipped outright while none exist. */
static inline int poll_has_managed(const struct pollfd *fds, nfds_t n)
{
	if (RADIC_LIKELY(__atomic_load_n(&radic_managed_count, __ATOMIC_RELAXED) == 0))
		return 0;
	for (nfds_t i = 0; i < n; i++)
		if (radic_is_managed(fds[i].fd))
			return 1;
	return 0;
}

static inline int select_has_managed(int nfds, const fd_set *a, const fd_set *b,
				     const fd_set *c)
{
	if (RADIC_LIKELY(__atomic_load_n(&radic_managed_count, __ATOMIC_RELAXED) == 0))
		return 0;
	if (nfds > FD_SETSIZE)
		nfds = FD_SETSIZE;
	for (int fd = 0; fd < nfds; fd++)
		if (radic_is_managed(fd) && ((a && FD_ISSET(fd, a)) || (b && FD_ISSET(fd, b)) ||
					     (c && FD_ISSET(fd, c))))
			return 1;
	return 0;
}

/* Is a safe socket not UP? (The test mode's waits go to Go only if not.) */
static inline int conns_unready(void)
{
	return RADIC_UNLIKELY(__atomic_load_n(&radic_unready, __ATOMIC_RELAXED) > 0) &&
	       !radic_in_child;
}

static int timespec_ms(const struct timespec *t)
{
	if (t == NULL)
		return -1;
	long ms = t->tv_sec * 1000 + (t->tv_nsec + 999999) / 1000000;
	return ms > 0x7fffffff ? 0x7fffffff : (int)ms;
}

/* glibc declares poll's and ppoll's set write-only (for fortify), so GCC
 * takes our reading of it (the app filled it in) for reading garbage. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

/*
 * A wait on a set with a safe socket is answered by radic_conn_poll (in
 * the job: the test mode hands it to Go), whatever the connections'
 * states: it puts a BROKEN connection's wake fd in its place, and it does
 * not take a socket's word for an end of stream or an error that a break
 * made (the peer's, or one of ours under the wait) for readiness. A
 * blocking read told so would wait for ever on the resumed socket.
 */
static inline int conn_wait(void) { return !radic_in_child; }

int poll(struct pollfd *fds, nfds_t n, int timeout)
{
	long r;
	if (RADIC_UNLIKELY(poll_has_managed(fds, n))) {
		if (radic_manage_policy != RADIC_MANAGE_JOB && !conns_unready()) {
			if (go_call(RADIC_OP_poll, -1, (long)fds, (long)n, timeout, 0, 0, 0, &r))
				return (int)r;
			sigset_t m;
			struct timespec ts = {timeout / 1000, (timeout % 1000) * 1000000L};
			return REAL(ppoll)(fds, n, timeout < 0 ? NULL : &ts, without_urg(NULL, &m));
		}
		if (conn_wait())
			return radic_conn_poll(fds, n, timeout, NULL);
	}
	return REAL(poll)(fds, n, timeout);
}

int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *tmo, const sigset_t *mask)
{
	long r;
	if (RADIC_UNLIKELY(poll_has_managed(fds, n))) {
		if (radic_manage_policy != RADIC_MANAGE_JOB && !conns_unready() &&
		    go_call(RADIC_OP_poll, -1, (long)fds, (long)n, -1, (long)tmo, (long)mask, 1, &r))
			return (int)r;
		if (conn_wait())
			return radic_conn_poll(fds, n, timespec_ms(tmo), mask);
	}
	return REAL(ppoll)(fds, n, tmo, mask);
}

#pragma GCC diagnostic pop

/* select over a set with a safe socket that is not UP: done as a poll. */
static int select_as_poll(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, int timeout_ms,
			  const sigset_t *mask)
{
	struct pollfd p[FD_SETSIZE];
	nfds_t n = 0;
	if (nfds > FD_SETSIZE)
		nfds = FD_SETSIZE;
	for (int fd = 0; fd < nfds; fd++) {
		short ev = (rd && FD_ISSET(fd, rd) ? POLLIN : 0) |
			   (wr && FD_ISSET(fd, wr) ? POLLOUT : 0) |
			   (ex && FD_ISSET(fd, ex) ? POLLPRI : 0);
		if (ev)
			p[n++] = (struct pollfd){.fd = fd, .events = ev};
	}
	int r = radic_conn_poll(p, n, timeout_ms, mask);
	if (r < 0)
		return r;
	if (rd)
		FD_ZERO(rd);
	if (wr)
		FD_ZERO(wr);
	if (ex)
		FD_ZERO(ex);
	int count = 0;
	for (nfds_t i = 0; i < n; i++) {
		short re = p[i].revents;
		if (re & POLLNVAL) {
			errno = EBADF;
			return -1;
		}
		if (rd && (p[i].events & POLLIN) && (re & (POLLIN | POLLHUP | POLLERR)))
			FD_SET(p[i].fd, rd), count++;
		if (wr && (p[i].events & POLLOUT) && (re & (POLLOUT | POLLERR)))
			FD_SET(p[i].fd, wr), count++;
		if (ex && (p[i].events & POLLPRI) && (re & POLLPRI))
			FD_SET(p[i].fd, ex), count++;
	}
	return count;
}

int select(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, struct timeval *tv)
{
	long r;
	if (RADIC_UNLIKELY(select_has_managed(nfds, rd, wr, ex))) {
		int ms = tv ? (int)(tv->tv_sec * 1000 + (tv->tv_usec + 999) / 1000) : -1;
		if (radic_manage_policy != RADIC_MANAGE_JOB && !conns_unready() &&
		    go_call(RADIC_OP_select, -1, nfds, (long)rd, (long)wr, (long)ex, (long)tv, 0, &r))
			return (int)r;
		if (conn_wait())
			return select_as_poll(nfds, rd, wr, ex, ms, NULL);
	}
	return REAL(select)(nfds, rd, wr, ex, tv);
}

int pselect(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, const struct timespec *tmo,
	    const sigset_t *mask)
{
	long r;
	if (RADIC_UNLIKELY(select_has_managed(nfds, rd, wr, ex))) {
		if (radic_manage_policy != RADIC_MANAGE_JOB && !conns_unready() &&
		    go_call(RADIC_OP_select, -1, nfds, (long)rd, (long)wr, (long)ex, (long)tmo,
			    (long)mask, &r))
			return (int)r;
		if (conn_wait())
			return select_as_poll(nfds, rd, wr, ex, timespec_ms(tmo), mask);
	}
	return REAL(pselect)(nfds, rd, wr, ex, tmo, mask);
}

/*
 * How many managed fds each epoll set watches, so that epoll_wait on a set
 * that watches none takes the fast path. A managed fd closed while still
 * registered leaves the count high (the kernel drops it silently): that
 * costs a trip through Go, never a missed event.
 */
static unsigned short epoll_managed[RADIC_FD_MAX];

static void count_epoll_managed(int epfd, int op)
{
	if ((unsigned)epfd >= RADIC_FD_MAX || !owner())
		return;
	if (op == EPOLL_CTL_ADD) {
		if (__atomic_add_fetch(&epoll_managed[epfd], 1, __ATOMIC_RELAXED) == 1)
			radic_fd_set(epfd, RADIC_FD_EPOLL_MANAGED);
	} else if (op == EPOLL_CTL_DEL && epoll_managed[epfd] > 0) {
		if (__atomic_sub_fetch(&epoll_managed[epfd], 1, __ATOMIC_RELAXED) == 0)
			radic_fd_clear(epfd, RADIC_FD_EPOLL_MANAGED);
	}
}

static int app_epoll(int epfd)
{
	if (epfd >= 0) {
		fresh_fd(epfd);
		if ((unsigned)epfd < RADIC_FD_MAX && owner())
			__atomic_store_n(&epoll_managed[epfd], 0, __ATOMIC_RELAXED);
		if (owner())
			radic_fd_set(epfd, RADIC_FD_APP_EPOLL);
	}
	return epfd;
}

int epoll_create(int size) { return app_epoll(REAL(epoll_create)(size)); }

int epoll_create1(int flags) { return app_epoll(REAL(epoll_create1)(flags)); }

int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	long r;
	if (!MANAGED(fd)) {
		r = REAL(epoll_ctl)(epfd, op, fd, ev);
		if (RADIC_UNLIKELY(radic_logring != NULL) && r == 0 && conn_wait())
			radic_epoll_note(epfd, op, fd, ev);
		return (int)r;
	}
	struct radic_conn *c = conn(fd);
	if (c)
		return radic_conn_epoll_ctl(c, epfd, op, fd, ev);
	if (!GO(epoll_ctl, epfd, op, fd, (long)ev, 0, 0, 0))
		r = REAL(epoll_ctl)(epfd, op, fd, ev);
	if (r == 0)
		count_epoll_managed(epfd, op);
	return (int)r;
}

#define EPOLL_MANAGED(epfd) RADIC_UNLIKELY(radic_fd_get(epfd) & RADIC_FD_EPOLL_MANAGED)
/* A set watching a safe socket, with recovery on (its waits are
 * determinants) or one-shot (a report disarms the registration). */
#define EPOLL_LOGGED(epfd) \
	RADIC_UNLIKELY((radic_fd_get(epfd) & RADIC_FD_EPOLL_CONN) && conn_wait())

int epoll_wait(int epfd, struct epoll_event *evs, int max, int timeout)
{
	long r;
	if (EPOLL_MANAGED(epfd)) {
		if (GO(epoll_wait, epfd, (long)evs, max, timeout, 0, 0, 0))
			return (int)r;
		sigset_t m;
		return REAL(epoll_pwait)(epfd, evs, max, timeout, without_urg(NULL, &m));
	}
	if (EPOLL_LOGGED(epfd))
		return radic_conn_epoll_wait(epfd, evs, max, timeout, NULL, NULL);
	return REAL(epoll_wait)(epfd, evs, max, timeout);
}

int epoll_pwait(int epfd, struct epoll_event *evs, int max, int timeout, const sigset_t *mask)
{
	long r;
	if (EPOLL_MANAGED(epfd)) {
		if (GO(epoll_wait, epfd, (long)evs, max, timeout, (long)mask, 0, 1))
			return (int)r;
		sigset_t m;
		return REAL(epoll_pwait)(epfd, evs, max, timeout, without_urg(mask, &m));
	}
	if (EPOLL_LOGGED(epfd))
		return radic_conn_epoll_wait(epfd, evs, max, timeout, NULL, mask);
	return REAL(epoll_pwait)(epfd, evs, max, timeout, mask);
}

int epoll_pwait2(int epfd, struct epoll_event *evs, int max, const struct timespec *tmo,
		 const sigset_t *mask)
{
	long r;
	if (EPOLL_MANAGED(epfd) && GO(epoll_wait, epfd, (long)evs, max, -1, (long)mask, (long)tmo, 2))
		return (int)r;
	if (EPOLL_LOGGED(epfd))
		return radic_conn_epoll_wait(epfd, evs, max, timespec_ms(tmo), tmo, mask);
	return REAL(epoll_pwait2)(epfd, evs, max, tmo, mask);
}
