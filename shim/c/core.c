/*
 * core.c — the real-symbol table, the fd table, loading the Go control
 * plane, and the switch into Go.
 */
#include "shim.h"

#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <limits.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>

RADIC_START_DATA struct radic_real_table radic_real;
unsigned char radic_fdflags[RADIC_FD_MAX];
int radic_managed_count;
int radic_manage_policy;
RADIC_START_DATA int radic_go_ready;
struct radic_go_table radic_go;
RADIC_START_DATA int radic_in_child;
RADIC_START_DATA pid_t radic_owner_pid;
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
	int n = snprintf(buf, sizeof buf, "radic[%d]: ", (int)radic_real_pid());
	va_list ap;
	va_start(ap, fmt);
	n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof buf - 2)
		n = (int)sizeof buf - 2;
	buf[n++] = '\n';
	/* RADIC_LOG_FILE (radicd sets it for a restarted rank, whose stderr
	 * is compared with its first run's): the line is appended there, the
	 * file opened and closed around it so that the app's fd numbers are
	 * untouched. Read raw: getenv may not be safe this early. */
	static const char *file;
	static int looked;
	if (!looked) {
		file = getenv("RADIC_LOG_FILE");
		looked = 1;
	}
	if (file != NULL && *file != 0) {
		long fd = syscall(SYS_openat, AT_FDCWD, file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
		if (fd >= 0) {
			/* The file's lines are read next to radicd's log (how
			 * long a restarted rank took to reconnect): UTC time,
			 * as radicd's. */
			char line[sizeof buf + 32];
			struct timespec now;
			struct tm tm;
			clock_gettime(CLOCK_REALTIME, &now);
			gmtime_r(&now.tv_sec, &tm);
			size_t k = strftime(line, 32, "%Y-%m-%dT%H:%M:%S", &tm);
			k += (size_t)snprintf(line + k, 32 - k, ".%03ldZ ", now.tv_nsec / 1000000);
			memcpy(line + k, buf, (size_t)n);
			raw_write_all((int)fd, line, k + (size_t)n); /* one write: O_APPEND keeps lines whole */
			syscall(SYS_close, fd);
			errno = saved;
			return;
		}
	}
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

/* This library's extent in memory, defined by the linker. */
extern const char __ehdr_start[] __attribute__((visibility("hidden")));
extern const char _end[] __attribute__((visibility("hidden")));

void *radic_resolve(const char *name, void **slot)
{
	void *p = dlsym(RTLD_NEXT, name);
	/* A lookup that lands back in this library would recurse forever. The
	 * library's own extent comes from the linker (its ELF header to the end
	 * of its bss): dladdr would answer the same, but it scans the whole
	 * symbol table of the object the address is in (libc's: thousands of
	 * symbols, their pages faulted in), which cost every preloaded process
	 * about 10 us per symbol resolved. Checked before the fallback for an
	 * optional symbol, which is in this library on purpose. */
	if ((const char *)p >= __ehdr_start && (const char *)p < _end) {
		radic_logf("libc's %s resolves to radic itself", name);
		abort();
	}
	if (p == NULL) {
		for (const char *const *o = optional_syms; *o != NULL; o++)
			if (strcmp(*o, name) == 0)
				p = (void *)missing_symbol;
		if (p == NULL) {
			radic_logf("cannot resolve libc's %s: %s", name, dlerror());
			abort();
		}
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
 * dup2()s onto 3, and a program may expect its first open() to return 3.
 * Go cannot be told where to put them, so fill the free numbers below
 * RADIC_FD_LOW with placeholders while Go makes them, then free the
 * placeholders. Called only while the program is single-threaded, before
 * main() (radic_load_go), so no fd of the program can land in the window.
 *
 * When the soft RLIMIT_NOFILE leaves too little room above RADIC_FD_LOW,
 * the soft limit is raised towards the hard one for the moment (an fd above
 * the soft limit keeps working once the limit is put back; radic_load_go
 * restores it). If even the hard limit is that low, the placeholders stop
 * RADIC_FD_SPARE short of it, and Go's fds take the highest numbers there
 * are.
 */
#define RADIC_FD_LOW 64
#define RADIC_FD_SPARE 32 /* what Go's init may hold open at once, with room */
static int placeholders[RADIC_FD_LOW];
static int placeholders_n;
static int reserve_depth;

void radic_reserve_low_fds(void)
{
	if (reserve_depth++ > 0)
		return;
	struct rlimit rl;
	rlim_t want = RADIC_FD_LOW + RADIC_FD_SPARE, top = RADIC_FD_LOW;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < want) {
		if (rl.rlim_max > rl.rlim_cur) {
			struct rlimit up = {rl.rlim_max < want ? rl.rlim_max : want, rl.rlim_max};
			if (setrlimit(RLIMIT_NOFILE, &up) == 0)
				rl.rlim_cur = up.rlim_cur;
		}
		if (rl.rlim_cur < want)
			top = rl.rlim_cur > RADIC_FD_SPARE ? rl.rlim_cur - RADIC_FD_SPARE : 0;
	}
	if (top <= 3)
		return;
	int null = (int)syscall(SYS_openat, AT_FDCWD, "/dev/null", O_RDONLY | O_CLOEXEC);
	if (null < 0)
		return;
	int fd = null;
	while (fd >= 0 && (rlim_t)fd < top && placeholders_n < RADIC_FD_LOW) {
		placeholders[placeholders_n++] = fd;
		fd = (int)syscall(SYS_fcntl, null, F_DUPFD_CLOEXEC, 3);
	}
	if (fd >= 0 && (rlim_t)fd >= top)
		syscall(SYS_close, fd);
}

void radic_release_low_fds(void)
{
	if (reserve_depth == 0 || --reserve_depth > 0)
		return;
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
	int verdict = radic_go.call(c);
	radic_in_shim = 0;
	if (verdict == RADIC_DONE && c->ret < 0)
		errno = c->err;
	else
		errno = saved;
	return verdict;
}

/* Called by Go's init with the policy it chose; radic_load_go makes Go
 * callable (radic_go_ready) once that init has returned. */
void radic_set_ready(int policy) { radic_manage_policy = policy; }

/* Set when the process is to be managed: Go is loaded before main(). */
RADIC_START_DATA static int wants_go;

__attribute__((constructor(101))) static void radic_init(void)
{
	radic_owner_pid = radic_real_pid();
	const char *t = getenv("RADIC_TEST_MANAGE");
	const char *job = getenv("RADIC_JOB");
	wants_go = (t != NULL && strcmp(t, "1") == 0) || (job != NULL && *job != 0);
}

/*
 * Go's threads must not take the program's signals. Loading Go with every
 * signal blocked (radic_load_go) keeps all of them blocked on every thread
 * the runtime starts, except the ones its signal table marks "always
 * unblock" (_SigUnblock), and SIGURG, its preemption signal, unless
 * asynchronous preemption is off (godebug_lend turns it off). The table's
 * list: the synchronous faults, which the runtime turns into panics, and
 * SIGCHLD, SIGPROF, SIGSTKFLT and signal 34 (musl's SIGSYNCCALL; SIGRTMIN
 * in glibc), for which a library runtime installs no handler: one taken by
 * a Go thread runs the program's handler there, or its default action (a
 * fault: Go's handler, which crashes), while the program has it blocked
 * (bash's SIGCHLD, a sigwait, a signalfd). Nothing in Go's API
 * changes that table, so it is changed here, in the freshly mapped library,
 * before the runtime starts its first thread: the runtime's initializer
 * starts that thread with pthread_create, which this library interposes.
 * The table is found by name in the library's symbol table
 * (runtime.sigtable, an array of struct {int32 flags; string name}), and
 * each entry is checked against the flags this Go version gives it; if
 * anything differs the table is left alone and one line says so.
 */
#define GO_SIG_UNBLOCK 128 /* _SigUnblock in runtime/runtime2.go */
#define GO_SIGTAB_ENTRY 24 /* sizeof(sigTabT) on 64-bit */
#define GO_SIGTAB_LEN 65

static const struct {
	int sig;
	int32_t flags; /* as Go 1.26 has them */
} go_reblock[] = {
	/* The faults: a real one on a Go thread is a bug of ours, and the
	 * kernel ends the process for it, blocked or not (without Go's
	 * traceback). One sent with kill or sigqueue is the program's: Go's
	 * handler took it for a fault in its own code and crashed the
	 * process, while the program had it blocked for a sigwait. */
	{4, 4 + 128},        /* SIGILL: _SigThrow + _SigUnblock */
	{5, 4 + 128},        /* SIGTRAP: _SigThrow + _SigUnblock */
	{7, 8 + 128},        /* SIGBUS: _SigPanic + _SigUnblock */
	{8, 8 + 128},        /* SIGFPE: _SigPanic + _SigUnblock */
	{11, 8 + 128},       /* SIGSEGV: _SigPanic + _SigUnblock */
	{16, 4 + 128},       /* SIGSTKFLT: _SigThrow + _SigUnblock */
	{17, 1 + 128 + 256}, /* SIGCHLD: _SigNotify + _SigUnblock + _SigIgn */
	{27, 1 + 128},       /* SIGPROF: _SigNotify + _SigUnblock */
	{34, 64 + 128},      /* signal 34: _SigSetStack + _SigUnblock */
};

static uint64_t go_sigtable_value; /* runtime.sigtable's st_value; 0: not found */
static int go_loading;             /* radic_load_go is in dlopen */

/* Finds runtime.sigtable in the ELF symbol table of the file at path. */
static uint64_t find_go_sigtable(const char *path)
{
	int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	struct stat st;
	uint64_t found = 0;
	if (fstat(fd, &st) < 0 || (size_t)st.st_size < sizeof(Elf64_Ehdr)) {
		syscall(SYS_close, fd);
		return 0;
	}
	size_t size = (size_t)st.st_size;
	const unsigned char *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
	syscall(SYS_close, fd);
	if (m == MAP_FAILED)
		return 0;
	const Elf64_Ehdr *eh = (const void *)m;
	if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
	    eh->e_shoff + (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr) > size)
		goto out;
	const Elf64_Shdr *sh = (const void *)(m + eh->e_shoff);
	for (int i = 0; i < eh->e_shnum && found == 0; i++) {
		if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum)
			continue;
		const Elf64_Shdr *strs = &sh[sh[i].sh_link];
		if (sh[i].sh_offset + sh[i].sh_size > size || strs->sh_offset + strs->sh_size > size)
			continue;
		const Elf64_Sym *sym = (const void *)(m + sh[i].sh_offset);
		const char *names = (const char *)(m + strs->sh_offset);
		size_t n = sh[i].sh_size / sizeof(Elf64_Sym);
		for (size_t k = 0; k < n; k++)
			if (sym[k].st_name < strs->sh_size &&
			    strcmp(names + sym[k].st_name, "runtime.sigtable") == 0 &&
			    sym[k].st_size == GO_SIGTAB_ENTRY * GO_SIGTAB_LEN) {
				found = sym[k].st_value;
				break;
			}
	}
out:
	munmap((void *)m, size);
	return found;
}

/* In the runtime's first pthread_create: fn is its thread's start, in the
 * Go library, whose link map gives the load address. */
static void reblock_go_signals(void *fn)
{
	Dl_info info;
	struct link_map *lm = NULL;
	if (go_sigtable_value == 0 || !dladdr1(fn, &info, (void **)&lm, RTLD_DL_LINKMAP) ||
	    lm == NULL) {
		radic_logf("Go's signal table not found: Go's threads can take SIGCHLD and SIGPROF");
		return;
	}
	unsigned char *tab = (unsigned char *)lm->l_addr + go_sigtable_value;
	size_t n = sizeof go_reblock / sizeof go_reblock[0];
	for (size_t i = 0; i < n; i++) {
		int32_t f;
		memcpy(&f, tab + (size_t)go_reblock[i].sig * GO_SIGTAB_ENTRY, sizeof f);
		if (f != go_reblock[i].flags) {
			radic_logf("Go's signal table is not as expected (signal %d: flags %d, not %d): "
				   "Go's threads can take SIGCHLD and SIGPROF",
				   go_reblock[i].sig, (int)f, (int)go_reblock[i].flags);
			return;
		}
	}
	for (size_t i = 0; i < n; i++) {
		int32_t f = go_reblock[i].flags & ~GO_SIG_UNBLOCK;
		memcpy(tab + (size_t)go_reblock[i].sig * GO_SIGTAB_ENTRY, &f, sizeof f);
	}
}

int pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
	if (RADIC_UNLIKELY(__atomic_load_n(&go_loading, __ATOMIC_RELAXED)) &&
	    __atomic_exchange_n(&go_loading, 0, __ATOMIC_RELAXED))
		reblock_go_signals((void *)fn);
	return REAL(pthread_create)(t, attr, fn, arg);
}

/* The Go library: $RADIC_GO_LIB, else libradic-go.so beside this library. */
static int go_lib_path(char *buf, size_t cap)
{
	const char *env = getenv("RADIC_GO_LIB");
	if (env != NULL && *env != 0)
		return snprintf(buf, cap, "%s", env) < (int)cap;
	Dl_info self;
	if (!dladdr((void *)go_lib_path, &self) || self.dli_fname == NULL)
		return 0;
	const char *slash = strrchr(self.dli_fname, '/');
	int dir = slash != NULL ? (int)(slash - self.dli_fname) : 1;
	const char *base = slash != NULL ? self.dli_fname : ".";
	return snprintf(buf, cap, "%.*s/libradic-go.so", dir, base) < (int)cap;
}

static void *go_sym(void *h, const char *name, const char *path, int *ok)
{
	void *p = dlsym(h, name);
	if (p == NULL && *ok) {
		radic_logf("%s has no %s: running as pass-through", path, name);
		*ok = 0;
	}
	return p;
}

/*
 * Loads the Go control plane, in a process that is to be managed, just
 * before main(): every library constructor has run and no loader lock is
 * held, and the program has no threads of its own yet.
 *
 * Go's runtime starts its first thread from the library's initializer, and
 * that thread, like every thread Go starts after it, takes the signal mask
 * of the thread that loaded the library (runtime: initSigmask), less the
 * signals the runtime cannot do without (its preemption signal, synchronous
 * faults). Loading with every signal blocked therefore keeps Go's threads
 * from ever taking a signal meant for the program: a SIGCHLD the program
 * blocks around a critical section, a signal it reads from a signalfd or
 * sigwait. The calling thread's own mask is put back afterwards.
 *
 * radicGoPing waits until Go's runtime and package init have run, so the
 * files Go opens for itself at init (transparent_hugepage, cgroup files)
 * are closed again before main(), and its long-lived fds (the poller's) are
 * made while the low fd numbers are held by placeholders. Go's init also
 * raises the soft RLIMIT_NOFILE to the hard limit (package syscall); the
 * program keeps the limit it had.
 *
 * If the library cannot be loaded, one line says why and the process runs
 * as pass-through.
 */
/*
 * Asynchronous preemption off for Go's runtime: with it on, the runtime
 * keeps SIGURG, its preemption signal, unblocked on every thread it starts,
 * and a SIGURG sent to the process (out-of-band data, or kill) landed on
 * one and was taken for a preemption request: lost to the program's
 * sigwait or signalfd. Our goroutines are short; cooperative preemption
 * does. There is no //go:debug for it, and the runtime reads GODEBUG from
 * the process's initial environment array (after argv, as the kernel laid
 * it out), not from environ: for the load, an entry of that array is lent
 * to "GODEBUG=...,asyncpreemptoff=1" (the program's own GODEBUG if it has
 * one, else its last entry that the shim does not read, which Go's copy of
 * the environment then lacks), and given back before main.
 */
static char *godebug_lend(char **envv, char ***slot)
{
	*slot = NULL;
	for (char **e = envv; *e != NULL; e++) {
		if (strncmp(*e, "GODEBUG=", 8) == 0) {
			*slot = e;
			break;
		}
		if (strncmp(*e, "RADIC_", 6) != 0 && strncmp(*e, "LD_", 3) != 0)
			*slot = e;
	}
	if (*slot == NULL)
		return NULL;
	char *was = **slot;
	const char *own = strncmp(was, "GODEBUG=", 8) == 0 ? was + 8 : "";
	size_t n = strlen(own) + 40;
	char *lent = malloc(n);
	if (lent == NULL) {
		*slot = NULL;
		return NULL;
	}
	snprintf(lent, n, "GODEBUG=%s%sasyncpreemptoff=1", own, *own ? "," : "");
	**slot = lent;
	return was;
}

static void godebug_return(char **slot, char *was)
{
	if (slot == NULL)
		return;
	free(*slot);
	*slot = was;
}

static void radic_load_go(char **envv)
{
	char path[PATH_MAX];
	if (!go_lib_path(path, sizeof path)) {
		radic_logf("cannot find libradic-go.so beside libradic.so (set RADIC_GO_LIB): "
			   "running as pass-through");
		return;
	}
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	struct rlimit nofile;
	int have_nofile = getrlimit(RLIMIT_NOFILE, &nofile) == 0;
	radic_reserve_low_fds();

	int ok = 1;
	go_sigtable_value = find_go_sigtable(path);
	char **slot, *was = godebug_lend(envv, &slot);
	go_loading = 1;
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	go_loading = 0;
	if (h == NULL) {
		radic_logf("cannot load %s: %s: running as pass-through", path, dlerror());
		ok = 0;
	} else {
		radic_go.call = (int (*)(struct radic_call *))go_sym(h, "radicGoCall", path, &ok);
		radic_go.ping = (void (*)(void))go_sym(h, "radicGoPing", path, &ok);
		radic_go.exit = (void (*)(void))go_sym(h, "radicGoExit", path, &ok);
		radic_go.broken = (int (*)(struct radic_conn *, uint32_t, int, int, int))go_sym(
			h, "radic_go_broken", path, &ok);
		radic_go.wait_room =
			(void (*)(struct radic_conn *))go_sym(h, "radic_go_wait_room", path, &ok);
		radic_go.ack_due = (void (*)(struct radic_conn *))go_sym(h, "radic_go_ack_due", path, &ok);
	}
	if (ok) {
		radic_in_shim = 1;
		radic_go.ping(); /* returns once the runtime has started */
		radic_in_shim = 0;
	}
	godebug_return(slot, was);

	radic_release_low_fds();
	if (ok)
		radic_protect_runtime_fds();
	if (have_nofile)
		setrlimit(RLIMIT_NOFILE, &nofile);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (ok)
		__atomic_store_n(&radic_go_ready, 1, __ATOMIC_RELEASE);
}

typedef int (*radic_main_fn)(int, char **, char **);
RADIC_START_DATA static radic_main_fn program_main;

static int radic_main(int argc, char **argv, char **envp)
{
	if (wants_go && radic_real_pid() == radic_owner_pid)
		radic_load_go(argv + argc + 1);
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
		radic_go.exit();
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
