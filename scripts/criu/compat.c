/*
 * compat.c: preloaded into CRIU 4.1 by the wrapper that scripts/criu.sh
 * writes. Linux 6.16 restricted SO_PASSCRED, SO_PASSSEC and SO_PASSPIDFD to
 * AF_UNIX, AF_NETLINK and AF_BLUETOOTH sockets (kernel commit 7d8d93fdde50b):
 * on a TCP socket getsockopt now fails with EOPNOTSUPP, and CRIU 4.1 gives
 * up the whole dump ("sockets: Can't get 1:34 opt: Operation not
 * supported", checkpoint-restore/criu#2718). Upstream's fix skips those
 * options for other families; this does the same from outside: such an
 * option reads as 0 (off, which is all it can be on such a socket) and
 * setting it to 0 succeeds. Every other call is the plain system call.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SO_PASSPIDFD
#define SO_PASSPIDFD 76
#endif

static int restricted(int level, int opt)
{
	return level == SOL_SOCKET &&
	       (opt == SO_PASSCRED || opt == SO_PASSSEC || opt == SO_PASSPIDFD);
}

int getsockopt(int fd, int level, int opt, void *val, socklen_t *len)
{
	int saved = errno;
	long r = syscall(SYS_getsockopt, fd, level, opt, val, len);
	if (r < 0 && errno == EOPNOTSUPP && restricted(level, opt) && val &&
	    len && *len >= sizeof(int)) {
		*(int *)val = 0;
		*len = sizeof(int);
		errno = saved;
		return 0;
	}
	return (int)r;
}

int setsockopt(int fd, int level, int opt, const void *val, socklen_t len)
{
	int saved = errno;
	long r = syscall(SYS_setsockopt, fd, level, opt, val, len);
	if (r < 0 && errno == EOPNOTSUPP && restricted(level, opt) && val &&
	    len >= sizeof(int) && *(const int *)val == 0) {
		errno = saved;
		return 0;
	}
	return (int)r;
}
