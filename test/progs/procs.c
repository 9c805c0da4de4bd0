/*
 * procs: process calls under the preload
 *
 *   fork (no exec; the child does socket I/O), fork + execve execv execvp
 *   execvpe execl execlp execle fexecve, vfork + execve, vfork + _exit,
 *   posix_spawn, posix_spawnp, popen, _exit.
 *
 * Each child uses a TCP connection it inherited (the fd number is passed in
 * argv across exec) and opens a new one to the parent's listener; the
 * parent echoes and checks everything, and checks the exit status.
 */
#include "common.h"

#include <limits.h>
#include <spawn.h>
#include <sys/wait.h>

extern char **environ;

static uint16_t lport;
static char self[PATH_MAX], selfdir[PATH_MAX];

/* child_io: what every child does, exec'd or not. */
static int child_io(const char *mode, int fd, uint16_t port)
{
	int type = 0;
	socklen_t tl = sizeof type;
	CHECK_SYS(getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl));
	CHECK(type == SOCK_STREAM, "inherited fd is not a stream socket");
	struct timeval tv = {10, 0};
	CHECK_SYS(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
	static char buf[100000];
	uint32_t id = (uint32_t)strlen(mode);
	fill(buf, sizeof buf, id, 0);
	write_all(fd, buf, sizeof buf);
	memset(buf, 0, sizeof buf);
	CHECK(recv(fd, buf, sizeof buf, MSG_WAITALL) == (ssize_t)sizeof buf, "echo");
	VERIFY(buf, sizeof buf, id, 0);
	int c = connect_to(AF_INET, port);
	char msg[64];
	int n = snprintf(msg, sizeof msg, "hello from %s", mode);
	uint8_t len = (uint8_t)n;
	CHECK(send(c, &len, 1, 0) == 1, "send len");
	write_all(c, msg, (size_t)n);
	CHECK_SYS(close(c));
	CHECK_SYS(close(fd));
	out("child %s: inherited socket echo ok, new connection ok", mode);
	return 0;
}

/* serve: the parent's side of one child, then its exit status. */
static void serve(const char *mode, pid_t pid, int s, int l, int want_status)
{
	static char buf[100000];
	uint32_t id = (uint32_t)strlen(mode);
	/* A lost byte must fail, not hang: reads time out after 10 s. */
	struct timeval tv = {10, 0};
	CHECK_SYS(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
	/* Small reads: many calls through the read trampoline. */
	for (size_t got = 0; got < sizeof buf;) {
		size_t want = sizeof buf - got < 997 ? sizeof buf - got : 997;
		ssize_t r = read(s, buf + got, want);
		CHECK(r > 0, "%s: read", mode);
		got += (size_t)r;
	}
	VERIFY(buf, sizeof buf, id, 0);
	write_all(s, buf, sizeof buf);
	int a = CHECK_SYS(accept(l, NULL, NULL));
	uint8_t len;
	read_all(a, &len, 1);
	char msg[256] = {0};
	read_all(a, msg, len);
	CHECK(read(a, buf, 1) == 0, "EOF after the message");
	CHECK_SYS(close(a));
	CHECK_SYS(close(s));
	int st;
	CHECK(waitpid(pid, &st, 0) == pid, "waitpid");
	out("parent %s: got \"%s\", exit status %d", mode, msg,
	    WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == want_status, "%s: status %d", mode, st);
}

static void exec_mode(const char *mode, int fd)
{
	char fds[16], ports[16];
	snprintf(fds, sizeof fds, "%d", fd);
	snprintf(ports, sizeof ports, "%u", lport);
	char *argv[] = {"procs", "child", (char *)mode, fds, ports, NULL};
	char path[PATH_MAX * 2];
	snprintf(path, sizeof path, "%s:/usr/bin:/bin", selfdir);
	if (!strcmp(mode, "execve")) {
		argv[0] = self;
		execve(self, argv, environ);
	} else if (!strcmp(mode, "execv")) {
		execv(self, argv);
	} else if (!strcmp(mode, "execvp")) {
		setenv("PATH", path, 1);
		execvp("procs", argv);
	} else if (!strcmp(mode, "execvpe")) {
		setenv("PATH", path, 1);
		execvpe("procs", argv, environ);
	} else if (!strcmp(mode, "execl")) {
		execl(self, "procs", "child", mode, fds, ports, (char *)NULL);
	} else if (!strcmp(mode, "execlp")) {
		setenv("PATH", path, 1);
		execlp("procs", "procs", "child", mode, fds, ports, (char *)NULL);
	} else if (!strcmp(mode, "execle")) {
		execle(self, "procs", "child", mode, fds, ports, (char *)NULL, environ);
	} else if (!strcmp(mode, "fexecve")) {
		int e = open(self, O_RDONLY | O_CLOEXEC);
		if (e >= 0)
			fexecve(e, argv, environ);
	}
	fprintf(stderr, "procs: %s failed: %s\n", mode, strerror(errno));
	_exit(127);
}

int main(int argc, char **argv)
{
	prog_name = "procs";
	if (argc == 5 && !strcmp(argv[1], "child"))
		return child_io(argv[2], atoi(argv[3]), (uint16_t)atoi(argv[4]));

	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	CHECK(n > 0, "readlink");
	self[n] = 0;
	strcpy(selfdir, self);
	*strrchr(selfdir, '/') = 0;
	int l = listener(AF_INET, SOCK_STREAM, &lport);
	int c, s;

	/* fork without exec: socket I/O in the child, then exit(). */
	tcp_pair(AF_INET, &c, &s);
	pid_t pid = CHECK_SYS(fork());
	if (pid == 0) {
		CHECK_SYS(close(s));
		CHECK_SYS(close(l));
		exit(child_io("fork", c, lport));
	}
	CHECK_SYS(close(c));
	serve("fork", pid, s, l, 0);

	/* fork without exec, ending in _exit with a status. */
	tcp_pair(AF_INET6, &c, &s);
	pid = CHECK_SYS(fork());
	if (pid == 0) {
		child_io("fork+_exit", c, lport);
		_exit(42);
	}
	CHECK_SYS(close(c));
	serve("fork+_exit", pid, s, l, 42);

	/* fork + every exec. */
	static const char *modes[] = {"execve", "execv",  "execvp", "execvpe",
				      "execl",  "execlp", "execle", "fexecve"};
	for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
		tcp_pair(i % 2 ? AF_INET6 : AF_INET, &c, &s);
		pid = CHECK_SYS(fork());
		if (pid == 0) {
			close(s);
			exec_mode(modes[i], c);
		}
		CHECK_SYS(close(c));
		serve(modes[i], pid, s, l, 0);
	}

	/* vfork + execve, vfork + _exit. */
	tcp_pair(AF_INET, &c, &s);
	char fds[16], ports[16];
	snprintf(fds, sizeof fds, "%d", c);
	snprintf(ports, sizeof ports, "%u", lport);
	char *vargv[] = {self, "child", "vfork", fds, ports, NULL};
	pid = vfork();
	if (pid == 0) {
		execve(self, vargv, environ);
		_exit(127);
	}
	CHECK(pid > 0, "vfork");
	CHECK_SYS(close(c));
	serve("vfork", pid, s, l, 0);
	pid = vfork();
	if (pid == 0)
		_exit(7);
	int st;
	CHECK(pid > 0 && waitpid(pid, &st, 0) == pid, "vfork+_exit");
	out("vfork+_exit: status %d", WEXITSTATUS(st));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 7, "vfork _exit status");

	/* posix_spawn and posix_spawnp, the latter with a dup2 file action
	 * putting the socket on fd 9. */
	tcp_pair(AF_INET, &c, &s);
	snprintf(fds, sizeof fds, "%d", c);
	char *sargv[] = {"procs", "child", "posix_spawn", fds, ports, NULL};
	CHECK(posix_spawn(&pid, self, NULL, NULL, sargv, environ) == 0, "posix_spawn");
	CHECK_SYS(close(c));
	serve("posix_spawn", pid, s, l, 0);

	tcp_pair(AF_INET6, &c, &s);
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, c, 9);
	posix_spawn_file_actions_addclose(&fa, s);
	char *pargv[] = {"procs", "child", "posix_spawnp", "9", ports, NULL};
	char path[PATH_MAX * 2];
	snprintf(path, sizeof path, "%s:%s", selfdir, getenv("PATH") ? getenv("PATH") : "/usr/bin");
	setenv("PATH", path, 1);
	CHECK(posix_spawnp(&pid, "procs", &fa, NULL, pargv, environ) == 0, "posix_spawnp");
	posix_spawn_file_actions_destroy(&fa);
	CHECK_SYS(close(c));
	serve("posix_spawnp", pid, s, l, 0);

	/* popen: the shell through glibc's internal spawn. */
	FILE *f = popen("echo popen works; echo and again", "r");
	CHECK(f != NULL, "popen");
	char line[128];
	while (fgets(line, sizeof line, f))
		out("popen: %.*s", (int)strcspn(line, "\n"), line);
	CHECK(pclose(f) == 0, "pclose");

	close(l);
	out("procs: all checks passed");
	/* The parent leaves through _exit too (no atexit, no stdio flush:
	 * out() flushed already). */
	_exit(0);
}
