/*
 * identity.c — the process's identity as the program sees it.
 *
 * A rank re-executed by recovery runs with another pid, and on another
 * node, maybe under another host name. A program that prints its pid or
 * host name, or derives anything from them (a seed, a file name), would
 * then regenerate output or bytes that differ from its first run's, and
 * the job would stop on the divergence. So the first run logs what
 * getpid() and gethostname() answered (RADIC_LOG_VALUE records, written
 * by Go before main()), and a restarted process is given those answers
 * again for the rest of its life (radic_set_identity, from its log):
 * getpid, getppid in its children, gethostname and uname's nodename.
 * Signals the program sends to that pid (kill, sigqueue, tgkill) go to
 * the process's real pid. Without a logged identity every call is the
 * real one, at the cost of one load and branch.
 *
 * Not covered: the raw syscalls (syscall(SYS_getpid)), /proc/self/stat
 * and friends, thread ids, and whatever a program's constructors saw
 * before the library loaded its log.
 */
#include "shim.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

static pid_t vpid;      /* the first run's pid, or 0 */
static char vhost[256]; /* its host name, or "" */

void radic_set_identity(int pid, const char *host)
{
	if (host != NULL) {
		strncpy(vhost, host, sizeof vhost - 1);
		vhost[sizeof vhost - 1] = 0;
	}
	if (pid > 0 && pid != radic_real_pid())
		__atomic_store_n(&vpid, (pid_t)pid, __ATOMIC_RELEASE);
}

/* The pid the program knows this process by, or 0 if it is the real one. */
static inline pid_t virtual_pid(void) { return __atomic_load_n(&vpid, __ATOMIC_ACQUIRE); }

pid_t getpid(void)
{
	pid_t real = radic_real_pid();
	pid_t v = virtual_pid();
	/* A child forked from us has its own pid. */
	return v != 0 && real == radic_owner_pid ? v : real;
}

pid_t getppid(void)
{
	pid_t real = (pid_t)syscall(SYS_getppid);
	pid_t v = virtual_pid();
	return v != 0 && real == radic_owner_pid ? v : real;
}

/* pid as the kernel knows it: the program's name for this process (or
 * its process group, negated) becomes the real one. */
static pid_t real_target(pid_t pid)
{
	pid_t v = virtual_pid();
	if (v == 0)
		return pid;
	if (pid == v)
		return radic_owner_pid;
	if (pid == -v)
		return -radic_owner_pid;
	return pid;
}

int kill(pid_t pid, int sig) { return REAL(kill)(real_target(pid), sig); }

int sigqueue(pid_t pid, int sig, const union sigval value)
{
	return REAL(sigqueue)(real_target(pid), sig, value);
}

int tgkill(pid_t tgid, pid_t tid, int sig)
{
	pid_t real = real_target(tgid);
	/* The main thread's id is the pid: the program knows it as ours. */
	if (real != tgid && tid == tgid)
		tid = real;
	return REAL(tgkill)(real, tid, sig);
}

int gethostname(char *name, size_t len)
{
	if (vhost[0] == 0)
		return REAL(gethostname)(name, len);
	size_t n = strlen(vhost);
	if (n + 1 > len) {
		/* glibc: as much as fits, then ENAMETOOLONG. */
		if (len > 0)
			memcpy(name, vhost, len);
		errno = ENAMETOOLONG;
		return -1;
	}
	memcpy(name, vhost, n + 1);
	return 0;
}

int uname(struct utsname *u)
{
	int r = REAL(uname)(u);
	if (r == 0 && vhost[0] != 0) {
		strncpy(u->nodename, vhost, sizeof u->nodename - 1);
		u->nodename[sizeof u->nodename - 1] = 0;
	}
	return r;
}
