/*
 * process.c — process calls: fork, spawn, exec, _exit, and signal handlers.
 *
 * A fork or vfork child has none of Go's threads; entering Go there hangs or
 * crashes. The child therefore runs C-only until exec: radic_go_allowed()
 * compares radic_real_pid() with the pid that loaded the library, which also covers
 * children made without these wrappers (vfork, clone, posix_spawn's internal
 * clone). vfork itself is not wrapped: a C wrapper around vfork would return
 * in the child through a frame the parent still needs.
 */
#include "shim.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- logical process ids of children -----------------------------------
 *
 * A process of a radic job has a logical id (RADIC_LPID, else its rank),
 * which names its connections. A child that runs a new program (fork or
 * vfork then exec, or posix_spawn) gets "<parent's id>.<n>", n counting the
 * parent's children from 1: the same in every run of the job, never a pid.
 * An exec without a fork keeps the id: it is the same logical process.
 */
char radic_lpid[64]; /* set by Go at init; empty outside a job */
static unsigned children;
static unsigned fork_index; /* in a fork child: which child it is */

static unsigned next_child(void) { return __atomic_add_fetch(&children, 1, __ATOMIC_RELAXED); }

/* envp with RADIC_LPID set for child n, or NULL when nothing changes.
 * malloc'd: an exec replaces the process, a spawn frees it (spawn_env_free). */
static char **child_env(char *const envp[], unsigned n)
{
	if (radic_lpid[0] == 0 || n == 0)
		return NULL;
	size_t k = 0;
	while (envp != NULL && envp[k] != NULL)
		k++;
	char **e = malloc((k + 2) * sizeof *e);
	char *v = malloc(96);
	if (e == NULL || v == NULL) {
		free(e);
		free(v);
		return NULL;
	}
	snprintf(v, 96, "RADIC_LPID=%s.%u", radic_lpid, n);
	size_t j = 0;
	for (size_t i = 0; i < k; i++)
		if (strncmp(envp[i], "RADIC_LPID=", 11) != 0)
			e[j++] = envp[i];
	e[j++] = v;
	e[j] = NULL;
	return e;
}

static void spawn_env_free(char **e)
{
	if (e == NULL)
		return;
	for (char **p = e; *p != NULL; p++)
		if (strncmp(*p, "RADIC_LPID=", 11) == 0)
			free(*p);
	free(e);
}

/* The environment an exec from this process should pass on: NULL (keep it)
 * unless this is a child about to run its own program. */
static char **exec_env(char *const envp[])
{
	if (radic_lpid[0] == 0)
		return NULL;
	if (radic_in_child)
		return child_env(envp, fork_index);
	if (radic_real_pid() != radic_owner_pid) /* a vfork child: the parent waits */
		return child_env(envp, next_child());
	return NULL;
}

/* A fork child shares the parent's safe sockets but none of its Go side:
 * from here on it makes plain calls (radic_in_child). */
pid_t fork(void)
{
	unsigned n = next_child();
	pid_t p = REAL(fork)();
	if (p == 0) {
		radic_in_child = 1;
		fork_index = n;
	}
	return p;
}

pid_t _Fork(void)
{
	unsigned n = next_child();
	pid_t p = REAL(_Fork)();
	if (p == 0) {
		radic_in_child = 1;
		fork_index = n;
	}
	return p;
}

int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
		const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	char **e = radic_lpid[0] ? child_env(envp, next_child()) : NULL;
	int r = REAL(posix_spawn)(pid, path, fa, attr, argv, e ? e : envp);
	spawn_env_free(e);
	return r;
}

int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
		 const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	char **e = radic_lpid[0] ? child_env(envp, next_child()) : NULL;
	int r = REAL(posix_spawnp)(pid, file, fa, attr, argv, e ? e : envp);
	spawn_env_free(e);
	return r;
}

/* exec and _exit run no destructors: give Go its end-of-process call first.
 * If exec fails the process goes on, and Go's state goes on with it. */

int execve(const char *path, char *const argv[], char *const envp[])
{
	radic_before_exit();
	char **e = exec_env(envp);
	return REAL(execve)(path, argv, e ? e : envp);
}

int execv(const char *path, char *const argv[])
{
	radic_before_exit();
	char **e = exec_env(environ);
	return e ? REAL(execve)(path, argv, e) : REAL(execv)(path, argv);
}

int execvp(const char *file, char *const argv[])
{
	radic_before_exit();
	char **e = exec_env(environ);
	return e ? REAL(execvpe)(file, argv, e) : REAL(execvp)(file, argv);
}

int execvpe(const char *file, char *const argv[], char *const envp[])
{
	radic_before_exit();
	char **e = exec_env(envp);
	return REAL(execvpe)(file, argv, e ? e : envp);
}

int fexecve(int fd, char *const argv[], char *const envp[])
{
	radic_before_exit();
	char **e = exec_env(envp);
	return REAL(fexecve)(fd, argv, e ? e : envp);
}

/* The execl family is variadic; gather the list and use the execv forms. */
#define RADIC_EXECL_MAX 4096
#define GATHER_ARGS(first, argv, ap)                                                     \
	do {                                                                             \
		int n_ = 0;                                                              \
		(argv)[n_++] = (char *)(first);                                          \
		while ((argv)[n_ - 1] != NULL) {                                         \
			if (n_ == RADIC_EXECL_MAX) {                                     \
				va_end(ap);                                              \
				errno = E2BIG;                                           \
				return -1;                                               \
			}                                                                \
			(argv)[n_++] = va_arg(ap, char *);                               \
		}                                                                        \
	} while (0)

int execl(const char *path, const char *arg, ...)
{
	char *argv[RADIC_EXECL_MAX];
	va_list ap;
	va_start(ap, arg);
	GATHER_ARGS(arg, argv, ap);
	va_end(ap);
	return execv(path, argv);
}

int execlp(const char *file, const char *arg, ...)
{
	char *argv[RADIC_EXECL_MAX];
	va_list ap;
	va_start(ap, arg);
	GATHER_ARGS(arg, argv, ap);
	va_end(ap);
	return execvp(file, argv);
}

int execle(const char *path, const char *arg, ...)
{
	char *argv[RADIC_EXECL_MAX];
	va_list ap;
	va_start(ap, arg);
	GATHER_ARGS(arg, argv, ap);
	char *const *envp = va_arg(ap, char *const *);
	va_end(ap);
	return execve(path, argv, envp);
}

void _exit(int status)
{
	radic_before_exit();
	REAL(_exit)(status);
	__builtin_unreachable();
}

/*
 * Signal handlers run on whatever thread the kernel picks, Go's included,
 * and a Go thread may be on a small goroutine stack. SA_ONSTACK makes such a
 * handler run on the thread's alternate signal stack (Go gives each of its
 * threads one; on other threads without one the flag does nothing). Without
 * it Go aborts ("signal handler not on alternate stack").
 */
int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
	if (act != NULL && act->sa_handler != SIG_DFL && act->sa_handler != SIG_IGN &&
	    !(act->sa_flags & SA_ONSTACK)) {
		struct sigaction a = *act;
		a.sa_flags |= SA_ONSTACK;
		return REAL(sigaction)(sig, &a, old);
	}
	return REAL(sigaction)(sig, act, old);
}

/* glibc's signal() calls its internal sigaction, so it needs its own wrapper:
 * BSD semantics (SA_RESTART, the signal blocked in its handler), as glibc. */
sighandler_t signal(int sig, sighandler_t handler)
{
	struct sigaction a, old;
	memset(&a, 0, sizeof a);
	a.sa_handler = handler;
	a.sa_flags = SA_RESTART;
	sigemptyset(&a.sa_mask);
	if (sig > 0 && sig < NSIG)
		sigaddset(&a.sa_mask, sig);
	if (sigaction(sig, &a, &old) < 0)
		return SIG_ERR;
	return old.sa_handler;
}
