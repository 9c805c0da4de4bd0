/*
 * shim.h — libradic.so, the C library that is preloaded.
 *
 * The preload library interposes libc's socket, I/O, waiting and process
 * calls. Every trampoline first asks one question in C: is this fd managed?
 * An fd-indexed byte table answers it with one load. Unmanaged fds (pipes,
 * files, eventfds, unix sockets, TCP to peers outside the job) take the real
 * libc call at once and never enter Go. Managed fds go to the Go side
 * through radic_enter(), which Go may handle or hand back ("pass").
 *
 * Go is entered only when all of these hold: the fd is managed, the Go
 * runtime has finished init, this thread is not already inside the shim
 * (reentrancy guard), and this is the process that loaded the library (not a
 * fork or vfork child: Go's threads do not exist there).
 *
 * The Go control plane is a library of its own, libradic-go.so, which this
 * one loads only in a process that is to be managed (RADIC_JOB or
 * RADIC_TEST_MANAGE=1; see radic_load_go in core.c). Every other process
 * runs C only: no Go runtime, no threads, fds or signal handlers of its.
 * The Go library links against the radic_* symbols exported here; this one
 * reaches Go through the pointers in radic_go.
 */
#ifndef RADIC_SHIM_H
#define RADIC_SHIM_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <stdlib.h>
#include <unistd.h>

#define RADIC_LIKELY(x) __builtin_expect(!!(x), 1)
#define RADIC_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define RADIC_TLS __thread __attribute__((tls_model("initial-exec")))

/* For the few variables that every preloaded process touches as it starts
 * and exits (the real-symbol table, the owner pid, Go's readiness). In .bss
 * they share pages with the big tables and each page touched costs a page
 * fault that zeroes it; in .data they sit on the page the loader writes
 * anyway (it zeroes the start of .bss there). */
#define RADIC_START_DATA __attribute__((section(".data.radic_start")))

/* ---- the real libc functions ------------------------------------------
 * One table, resolved lazily with dlsym(RTLD_NEXT): other libraries'
 * constructors (libucs) call read() before ours has run. X(ret, name, args).
 */
#define RADIC_REAL_FUNCS(X)                                                              \
	X(ssize_t, read, (int, void *, size_t))                                              \
	X(ssize_t, write, (int, const void *, size_t))                                       \
	X(ssize_t, readv, (int, const struct iovec *, int))                                  \
	X(ssize_t, writev, (int, const struct iovec *, int))                                 \
	X(ssize_t, send, (int, const void *, size_t, int))                                   \
	X(ssize_t, sendto, (int, const void *, size_t, int, const struct sockaddr *,         \
			    socklen_t))                                                      \
	X(ssize_t, sendmsg, (int, const struct msghdr *, int))                               \
	X(ssize_t, recv, (int, void *, size_t, int))                                         \
	X(ssize_t, recvfrom, (int, void *, size_t, int, struct sockaddr *, socklen_t *))     \
	X(ssize_t, recvmsg, (int, struct msghdr *, int))                                     \
	X(int, sendmmsg, (int, struct mmsghdr *, unsigned int, int))                         \
	X(int, recvmmsg, (int, struct mmsghdr *, unsigned int, int, struct timespec *))      \
	X(ssize_t, sendfile, (int, int, off_t *, size_t))                                    \
	X(ssize_t, sendfile64, (int, int, off_t *, size_t))                                  \
	X(ssize_t, splice, (int, off_t *, int, off_t *, size_t, unsigned int))               \
	X(ssize_t, __read_chk, (int, void *, size_t, size_t))                                \
	X(ssize_t, __recv_chk, (int, void *, size_t, size_t, int))                           \
	X(ssize_t, __recvfrom_chk, (int, void *, size_t, size_t, int, struct sockaddr *,     \
				    socklen_t *))                                            \
	X(int, socket, (int, int, int))                                                      \
	X(int, connect, (int, const struct sockaddr *, socklen_t))                           \
	X(int, accept, (int, struct sockaddr *, socklen_t *))                                \
	X(int, accept4, (int, struct sockaddr *, socklen_t *, int))                          \
	X(int, bind, (int, const struct sockaddr *, socklen_t))                              \
	X(int, listen, (int, int))                                                           \
	X(int, shutdown, (int, int))                                                         \
	X(int, close, (int))                                                                 \
	X(int, close_range, (unsigned int, unsigned int, int))                               \
	X(void, closefrom, (int))                                                            \
	X(int, dup, (int))                                                                   \
	X(int, dup2, (int, int))                                                             \
	X(int, dup3, (int, int, int))                                                        \
	X(int, fcntl, (int, int, ...))                                                       \
	X(int, fcntl64, (int, int, ...))                                                     \
	X(int, ioctl, (int, unsigned long, ...))                                             \
	X(int, setsockopt, (int, int, int, const void *, socklen_t))                         \
	X(int, getsockopt, (int, int, int, void *, socklen_t *))                             \
	X(int, getsockname, (int, struct sockaddr *, socklen_t *))                           \
	X(int, getpeername, (int, struct sockaddr *, socklen_t *))                           \
	X(int, poll, (struct pollfd *, nfds_t, int))                                         \
	X(int, ppoll, (struct pollfd *, nfds_t, const struct timespec *, const sigset_t *))  \
	X(int, select, (int, fd_set *, fd_set *, fd_set *, struct timeval *))                \
	X(int, pselect, (int, fd_set *, fd_set *, fd_set *, const struct timespec *,         \
			 const sigset_t *))                                                  \
	X(int, epoll_create, (int))                                                          \
	X(int, epoll_create1, (int))                                                         \
	X(int, epoll_ctl, (int, int, int, struct epoll_event *))                             \
	X(int, epoll_wait, (int, struct epoll_event *, int, int))                            \
	X(int, epoll_pwait, (int, struct epoll_event *, int, int, const sigset_t *))         \
	X(int, epoll_pwait2, (int, struct epoll_event *, int, const struct timespec *,       \
			      const sigset_t *))                                             \
	X(pid_t, fork, (void))                                                               \
	X(pid_t, _Fork, (void))                                                              \
	X(int, posix_spawn, (pid_t *, const char *, const posix_spawn_file_actions_t *,      \
			     const posix_spawnattr_t *, char *const[], char *const[]))       \
	X(int, posix_spawnp, (pid_t *, const char *, const posix_spawn_file_actions_t *,     \
			      const posix_spawnattr_t *, char *const[], char *const[]))      \
	X(int, execve, (const char *, char *const[], char *const[]))                        \
	X(int, execv, (const char *, char *const[]))                                         \
	X(int, execvp, (const char *, char *const[]))                                        \
	X(int, execvpe, (const char *, char *const[], char *const[]))                       \
	X(int, fexecve, (int, char *const[], char *const[]))                                \
	X(void, _exit, (int))                                                                \
	X(int, sigaction, (int, const struct sigaction *, struct sigaction *))              \
	X(int, kill, (pid_t, int))                                                           \
	X(int, sigqueue, (pid_t, int, const union sigval))                                   \
	X(int, tgkill, (pid_t, pid_t, int))                                                  \
	X(int, gethostname, (char *, size_t))                                                \
	X(int, uname, (struct utsname *))                                                    \
	X(int, pthread_create, (pthread_t *, const pthread_attr_t *, void *(*)(void *), void *)) \
	X(int, __libc_start_main, (int (*)(int, char **, char **), int, char **,            \
				   void (*)(void), void (*)(void), void (*)(void), void *))

#define RADIC_X_PTR(ret, name, args) ret(*name) args;
struct radic_real_table {
	RADIC_REAL_FUNCS(RADIC_X_PTR)
};
#undef RADIC_X_PTR
extern struct radic_real_table radic_real;

void *radic_resolve(const char *name, void **slot);

/* REAL(name) is the libc function behind our wrapper, resolved on first use. */
#define REAL(name)                                                                       \
	(RADIC_LIKELY(__atomic_load_n(&radic_real.name, __ATOMIC_RELAXED) != NULL)       \
		 ? radic_real.name                                                       \
		 : (__typeof__(radic_real.name))radic_resolve(#name, (void **)&radic_real.name))

/* ---- the fd table -------------------------------------------------------- */

/* fds at or above this are never managed (and cost one compare). */
#define RADIC_FD_MAX (1 << 16)

enum {
	RADIC_FD_MANAGED = 1 << 0,      /* calls on it go to Go */
	RADIC_FD_PRIVATE = 1 << 1,      /* the library's own: protected from close/dup2 */
	RADIC_FD_APP_EPOLL = 1 << 2,    /* an epoll fd the application created */
	RADIC_FD_EPOLL_MANAGED = 1 << 3, /* an epoll fd watching a managed fd (test mode) */
	RADIC_FD_CANDIDATE = 1 << 4,     /* a TCP socket that may become managed */
	RADIC_FD_LISTENER = 1 << 5,      /* a listener registered with radicd */
	RADIC_FD_EPOLL_CONN = 1 << 6,    /* an epoll set watching a safe socket with recovery on (waits
					    logged) or one-shot (reports seen): radic_conn_epoll_wait */
	RADIC_FD_EPOLL_NOTED = 1 << 7    /* a plain fd whose epoll registration is noted (recovery) */
};

extern unsigned char radic_fdflags[RADIC_FD_MAX];
extern int radic_managed_count; /* how many fds are managed: 0 skips set scans */

static inline unsigned radic_fd_get(int fd)
{
	if (RADIC_UNLIKELY((unsigned)fd >= RADIC_FD_MAX))
		return 0;
	return __atomic_load_n(&radic_fdflags[fd], __ATOMIC_RELAXED);
}

static inline int radic_is_managed(int fd) { return radic_fd_get(fd) & RADIC_FD_MANAGED; }

void radic_fd_set(int fd, unsigned flags);   /* or-in flags */
void radic_fd_clear(int fd, unsigned flags); /* clear flags */
void radic_fd_forget(int fd);                /* the fd number was closed or reused */
int radic_fd_private_in_range(unsigned lo, unsigned hi, int *out, int max);

/* ---- the switch into Go -------------------------------------------------- */

/* Operations Go can be asked about, named after the libc call. */
#define RADIC_OPS(X)                                                                     \
	X(read) X(write) X(readv) X(writev) X(send) X(sendto) X(sendmsg) X(recv)            \
	X(recvfrom) X(recvmsg) X(sendmmsg) X(recvmmsg) X(sendfile) X(splice) X(socket)     \
	X(connect) X(accept) X(bind) X(listen) X(shutdown) X(close) X(dup) X(fcntl)        \
	X(ioctl) X(setsockopt) X(getsockopt) X(getsockname) X(getpeername) X(poll)         \
	X(select) X(epoll_ctl) X(epoll_wait)

#define RADIC_X_ENUM(name) RADIC_OP_##name,
enum radic_op { RADIC_OPS(RADIC_X_ENUM) RADIC_OP_COUNT };
#undef RADIC_X_ENUM

/* One call handed to Go. args are the call's arguments as machine words. */
struct radic_call {
	int op;
	int fd;
	long args[6];
	long ret; /* set by Go when it handles the call */
	int err;  /* errno to report when ret < 0 */
};

enum { RADIC_PASS = 0, RADIC_DONE = 1 };

/* Go's verdict on an accepted fd the app must not see (and C's return for
 * it inside the accept trampolines; never a valid fd). */
#define RADIC_ACCEPT_HIDE (-2)

/* Management policy, set by Go at init. */
enum {
	RADIC_MANAGE_NONE = 0,       /* nothing is managed (pass-through) */
	RADIC_MANAGE_INET_STREAM = 1, /* test mode: every TCP socket is managed */
	RADIC_MANAGE_JOB = 2          /* safe sockets between the job's processes */
};
extern int radic_manage_policy;

/* Go's entry points, found with dlsym once libradic-go.so is loaded. Only
 * called when radic_go_allowed(). */
struct radic_conn;
struct radic_go_table {
	int (*call)(struct radic_call *);  /* radicGoCall */
	void (*ping)(void);                /* radicGoPing: waits for Go's init */
	void (*exit)(void);                /* radicGoExit */
	int (*broken)(struct radic_conn *, uint32_t, int, int, int); /* radic_go_broken */
	void (*wait_room)(struct radic_conn *);                      /* radic_go_wait_room */
	void (*ack_due)(struct radic_conn *);                        /* radic_go_ack_due */
};
extern struct radic_go_table radic_go;

extern int radic_go_ready; /* Go is loaded, its init has run, radic_go is filled */
extern int radic_in_child; /* a fork child: C-only, plain calls */
extern char radic_lpid[64]; /* this process's logical id in its job ("" outside one) */
extern pid_t radic_owner_pid;
extern RADIC_TLS int radic_in_shim;

const char *radic_op_name(int op);
int radic_enter(struct radic_call *c);
void radic_set_ready(int policy); /* Go's init: the policy it chose */
void radic_protect_runtime_fds(void);
void radic_reserve_low_fds(void);
void radic_release_low_fds(void);
void radic_before_exit(void);
int radic_open_append(const char *path);
void radic_real_close(int fd);
void radic_real_write_all(int fd, const void *p, size_t n);
void radic_logf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* This process's pid as the kernel knows it. getpid() is the program's
 * (identity.c: a restarted process keeps its first run's). */
static inline pid_t radic_real_pid(void) { return (pid_t)syscall(SYS_getpid); }

/* A restarted process's identity from its log (identity.c). */
void radic_set_identity(int pid, const char *host);

/* May Go be entered from here, now? The cheap part (managed) is checked by
 * the caller first; this is the rest. */
static inline int radic_go_allowed(void)
{
	return __atomic_load_n(&radic_go_ready, __ATOMIC_ACQUIRE) && !radic_in_shim &&
	       radic_real_pid() == radic_owner_pid;
}

#ifdef RADIC_FAULT_DROP_BYTES
ssize_t radic_fault_drop(int fd, ssize_t n, int flags);
#else
static inline ssize_t radic_fault_drop(int fd, ssize_t n, int flags) { return n; }
#endif

#endif
