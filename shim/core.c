/*
 * core.c — the real-symbol table, the fd table, and the switch into Go.
 */
#include "shim.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>

#include "_cgo_export.h"

struct radic_real_table radic_real;
unsigned char radic_fdflags[RADIC_FD_MAX];
int radic_managed_count;
int radic_manage_policy;
int radic_go_ready;
int radic_in_child;
pid_t radic_owner_pid;
RADIC_TLS int radic_in_shim;

/* Straight to the kernel: used for diagnostics, which must work before any
 * symbol is resolved and must not re-enter the shim. */
static void raw_write_all(int fd, const char *p, size_t n)
{
	while (n > 0) {
		long r = syscall(SYS_write, fd, p, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return;
		p += r;
		n -= (size_t)r;
	}
}

void radic_logf(const char *fmt, ...)
{
	char buf[512];
	int saved = errno;
	int n = snprintf(buf, sizeof buf, "radic[%d]: ", (int)getpid());
	va_list ap;
	va_start(ap, fmt);
	n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof buf - 2)
		n = (int)sizeof buf - 2;
	buf[n++] = '\n';
	raw_write_all(2, buf, (size_t)n);
	errno = saved;
}

/* ---- real symbols ---------------------------------------------------------- */

/* Symbols an older libc may lack: calling one fails with ENOSYS instead of
 * aborting. Every other symbol must resolve, since the program linked it. */
static const char *const optional_syms[] = {"close_range", "closefrom", "epoll_pwait2",
					     "_Fork",       "fcntl64",   "sendfile64",
					     "execvpe",     NULL};

static long missing_symbol(void)
{
	errno = ENOSYS;
	return -1;
}

void *radic_resolve(const char *name, void **slot)
{
	void *p = dlsym(RTLD_NEXT, name);
	if (p == NULL) {
		for (const char *const *o = optional_syms; *o != NULL; o++)
			if (strcmp(*o, name) == 0)
				p = (void *)missing_symbol;
		if (p == NULL) {
			radic_logf("cannot resolve libc's %s: %s", name, dlerror());
			abort();
		}
	}
	/* A lookup that lands back in this library would recurse forever. */
	Dl_info self, found;
	if (dladdr((void *)radic_resolve, &self) && dladdr(p, &found) &&
	    self.dli_fbase == found.dli_fbase) {
		radic_logf("libc's %s resolves to radic itself", name);
		abort();
	}
	__atomic_store_n(slot, p, __ATOMIC_RELEASE);
	return p;
}

/* ---- the fd table ---------------------------------------------------------- */

void radic_fd_set(int fd, unsigned flags)
{
	if ((unsigned)fd >= RADIC_FD_MAX)
		return;
	unsigned old = __atomic_fetch_or(&radic_fdflags[fd], (unsigned char)flags, __ATOMIC_RELAXED);
	if ((flags & RADIC_FD_MANAGED) && !(old & RADIC_FD_MANAGED))
		__atomic_fetch_add(&radic_managed_count, 1, __ATOMIC_RELAXED);
}

void radic_fd_clear(int fd, unsigned flags)
{
	if ((unsigned)fd >= RADIC_FD_MAX)
		return;
	unsigned old =
		__atomic_fetch_and(&radic_fdflags[fd], (unsigned char)~flags, __ATOMIC_RELAXED);
	if ((flags & RADIC_FD_MANAGED) && (old & RADIC_FD_MANAGED))
		__atomic_fetch_sub(&radic_managed_count, 1, __ATOMIC_RELAXED);
}

void radic_fd_forget(int fd)
{
	if (radic_fd_get(fd) != 0)
		radic_fd_clear(fd, 0xff);
}

/* The library's own fds are few: keep them in a short list as well, so that
 * close_range and closefrom need not scan the whole table. */
#define RADIC_PRIVATE_MAX 16
static int private_fds[RADIC_PRIVATE_MAX];
static int private_n;

static void protect(int fd)
{
	if ((unsigned)fd >= RADIC_FD_MAX || (radic_fd_get(fd) & RADIC_FD_PRIVATE))
		return;
	if (private_n == RADIC_PRIVATE_MAX) {
		radic_logf("too many private fds; fd %d is not protected", fd);
		return;
	}
	private_fds[private_n++] = fd;
	radic_fd_set(fd, RADIC_FD_PRIVATE);
}

/* Fills out with the private fds in [lo, hi], ascending; returns how many. */
int radic_fd_private_in_range(unsigned lo, unsigned hi, int *out, int max)
{
	int n = 0;
	for (int i = 0; i < private_n && n < max; i++)
		if ((unsigned)private_fds[i] >= lo && (unsigned)private_fds[i] <= hi)
			out[n++] = private_fds[i];
	for (int i = 1; i < n; i++) /* insertion sort: n is tiny */
		for (int j = i; j > 0 && out[j - 1] > out[j]; j--) {
			int t = out[j];
			out[j] = out[j - 1];
			out[j - 1] = t;
		}
	return n;
}

/* Reads a small /proc file into buf; returns its length or -1. */
static ssize_t read_small(const char *path, char *buf, size_t cap)
{
	int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	size_t n = 0;
	while (n < cap - 1) {
		long r = syscall(SYS_read, fd, buf + n, cap - 1 - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		n += (size_t)r;
	}
	syscall(SYS_close, fd);
	buf[n] = 0;
	return (ssize_t)n;
}

/*
 * The Go runtime makes its fds (the netpoller's epoll fd and the eventfd it
 * watches) with raw system calls that this library never sees. Find them:
 * an epoll fd that did not come through our epoll_create wrappers is the
 * runtime's, and so is every fd it watches. Protect them all, so that a
 * program closing "all its fds" (closefrom, close_range, a close loop) does
 * not kill the runtime. Called by Go whenever it may have made new fds.
 */
void radic_protect_runtime_fds(void)
{
	int self = (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/fd",
				O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (self < 0)
		return;
	DIR *d = fdopendir(self);
	if (d == NULL) {
		syscall(SYS_close, self);
		return;
	}
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		int fd = atoi(e->d_name);
		if (e->d_name[0] < '0' || e->d_name[0] > '9' || fd == self)
			continue;
		if (radic_fd_get(fd) & (RADIC_FD_APP_EPOLL | RADIC_FD_PRIVATE))
			continue;
		char path[64], target[64];
		snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
		ssize_t n = readlinkat(AT_FDCWD, path, target, sizeof target - 1);
		if (n <= 0)
			continue;
		target[n] = 0;
		if (strcmp(target, "anon_inode:[eventpoll]") != 0)
			continue;
		protect(fd);
		char info[4096];
		snprintf(path, sizeof path, "/proc/self/fdinfo/%d", fd);
		if (read_small(path, info, sizeof info) < 0)
			continue;
		for (char *l = strstr(info, "tfd:"); l != NULL; l = strstr(l + 4, "tfd:"))
			protect(atoi(l + 4));
	}
	closedir(d);
}

/*
 * The Go runtime's fds would take the lowest free numbers (3 and 4 in most
 * processes), which programs reuse on purpose: a shell's `exec 3>file`
 * dup2()s onto 3. Go cannot be told where to put them, so fill the free
 * numbers below RADIC_FD_LOW with placeholders while Go makes them, then
 * free the placeholders. Only called while the program has not reached
 * main() (managed processes wait for Go there), so no application fd can
 * land in the window.
 */
#define RADIC_FD_LOW 64
static int placeholders[RADIC_FD_LOW];
static int placeholders_n;

void radic_reserve_low_fds(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 4 * RADIC_FD_LOW)
		return; /* too few fds to spare: leave them to the program */
	int null = (int)syscall(SYS_openat, AT_FDCWD, "/dev/null", O_RDONLY | O_CLOEXEC);
	if (null < 0)
		return;
	int fd = null;
	while (fd >= 0 && fd < RADIC_FD_LOW && placeholders_n < RADIC_FD_LOW) {
		placeholders[placeholders_n++] = fd;
		fd = (int)syscall(SYS_fcntl, null, F_DUPFD_CLOEXEC, 3);
	}
	if (fd >= RADIC_FD_LOW)
		syscall(SYS_close, fd);
}

void radic_release_low_fds(void)
{
	while (placeholders_n > 0)
		syscall(SYS_close, placeholders[--placeholders_n]);
}

/* ---- the switch into Go ---------------------------------------------------- */

#define RADIC_X_NAME(name) #name,
static const char *const op_names[] = {RADIC_OPS(RADIC_X_NAME)};
#undef RADIC_X_NAME

const char *radic_op_name(int op)
{
	return op >= 0 && op < RADIC_OP_COUNT ? op_names[op] : "?";
}

/*
 * Hands one call on a managed fd to Go. Returns RADIC_PASS when the caller
 * should make the real call itself (or when Go may not be entered here), or
 * RADIC_DONE with c->ret and errno set. errno is the contract: the caller's
 * errno is left alone unless the call fails.
 */
int radic_enter(struct radic_call *c)
{
	if (!radic_go_allowed())
		return RADIC_PASS;
	int saved = errno;
	radic_in_shim = 1;
	int verdict = radicGoCall(c);
	radic_in_shim = 0;
	if (verdict == RADIC_DONE && c->ret < 0)
		errno = c->err;
	else
		errno = saved;
	return verdict;
}

/* Called by Go's init once the runtime can take calls. */
void radic_set_ready(int policy)
{
	radic_manage_policy = policy;
	__atomic_store_n(&radic_go_ready, 1, __ATOMIC_RELEASE);
}

/* Set when the process is to be managed: main() then waits for Go. */
static int wait_for_go;

/* Runs before Go's runtime starts (priority constructors sort first). */
__attribute__((constructor(101))) static void radic_init(void)
{
	radic_owner_pid = getpid();
	const char *t = getenv("RADIC_TEST_MANAGE");
	const char *job = getenv("RADIC_JOB");
	wait_for_go = (t != NULL && strcmp(t, "1") == 0) || (job != NULL && *job != 0);
}

/*
 * The Go runtime initializes on its own thread while the program runs on, so
 * the first sockets of a program could be made before Go has said what it
 * manages. A process that is to be managed therefore enters main() only once
 * Go's init has run: calling any exported Go function waits for that. Every
 * library constructor, Go's included, has run by the time main() is called,
 * so the wait cannot deadlock. Other processes never wait.
 */
typedef int (*radic_main_fn)(int, char **, char **);
static radic_main_fn program_main;

static int radic_main(int argc, char **argv, char **envp)
{
	if (wait_for_go)
		radicGoPing();
	return program_main(argc, argv, envp);
}

int __libc_start_main(radic_main_fn main, int argc, char **argv, void (*init)(void),
		      void (*fini)(void), void (*rtld_fini)(void), void *stack_end)
{
	program_main = main;
	return REAL(__libc_start_main)(radic_main, argc, argv, init, fini, rtld_fini, stack_end);
}

/* Process end: let Go write what it must (test counters), only in the
 * process that owns the Go runtime. Also called by the exec and _exit
 * wrappers, since neither runs destructors. */
void radic_before_exit(void)
{
	if (radic_go_allowed()) {
		radic_in_shim = 1;
		radicGoExit();
		radic_in_shim = 0;
	}
}

__attribute__((destructor)) static void radic_fini(void) { radic_before_exit(); }

#ifdef RADIC_FAULT_DROP_BYTES
/*
 * The deliberately broken build: on TCP sockets, every 97th read that got
 * more than one byte loses its last byte. Tests run with this library to
 * prove they notice lost data.
 */
ssize_t radic_fault_drop(int fd, ssize_t n, int flags)
{
	static unsigned long calls;
	if (n < 2 || (flags & MSG_PEEK))
		return n;
	int saved = errno, type = 0, domain = 0;
	socklen_t tlen = sizeof type, dlen = sizeof domain;
	int tcp = REAL(getsockopt)(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) == 0 &&
		  type == SOCK_STREAM &&
		  REAL(getsockopt)(fd, SOL_SOCKET, SO_DOMAIN, &domain, &dlen) == 0 &&
		  (domain == AF_INET || domain == AF_INET6);
	errno = saved;
	if (tcp && __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED) % 97 == 0)
		return n - 1;
	return n;
}
#endif

/* Small I/O helpers for Go, through the real calls (Go must not re-enter). */
int radic_open_append(const char *path)
{
	return (int)syscall(SYS_openat, AT_FDCWD, path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC,
			    0644);
}

void radic_real_close(int fd) { syscall(SYS_close, fd); }

void radic_real_write_all(int fd, const void *p, size_t n) { raw_write_all(fd, p, n); }
