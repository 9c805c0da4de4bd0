/*
 * forksig: fork while other threads are busy with sockets, with a signal
 * handler writing to a self-pipe every 2 ms (what orterun does with
 * SIGCHLD/SIGURG) — the situations that kill a Go runtime loaded into a
 * process that forks.
 *
 * Two worker threads exchange checked 64 KiB messages over TCP; a third
 * thread serves a listener; the main thread forks 20 children without
 * exec, each of which opens a new TCP connection, sends 10 KiB, checks the
 * echo and _exits. Blocking calls are restarted (SA_RESTART) or retried
 * on EINTR.
 */
#include "common.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/time.h>
#include <time.h>
#include <sys/wait.h>

enum { WORKERS = 2, ROUNDS = 300, MSG = 65536, CHILDREN = 20, CMSG = 10240 };

static int selfpipe[2];
static atomic_long signals;

static void on_alarm(int sig)
{
	int e = errno;
	(void)sig;
	char c = 's';
	if (write(selfpipe[1], &c, 1) == 1)
		atomic_fetch_add(&signals, 1);
	errno = e;
}

static void *drain(void *arg)
{
	(void)arg;
	char b[256];
	for (;;) {
		ssize_t r = read(selfpipe[0], b, sizeof b);
		if (r == 0)
			return NULL;
		if (r < 0 && errno != EINTR)
			return NULL;
	}
}

static long ms_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* xrecv: n bytes or EOF; a byte that never comes fails after 10 s instead
 * of hanging (SO_RCVTIMEO would restart with every signal). */
static ssize_t xrecv(int fd, void *p, size_t n)
{
	size_t got = 0;
	long deadline = ms_now() + 10000;
	while (got < n) {
		struct pollfd pf = {fd, POLLIN, 0};
		long left = deadline - ms_now();
		int pr = poll(&pf, 1, left > 0 ? (int)left : 0);
		if (pr < 0 && errno == EINTR)
			continue;
		CHECK(pr == 1, "no data for 10 s (%zu of %zu bytes)", got, n);
		ssize_t r = recv(fd, (char *)p + got, n - got, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return r;
		got += (size_t)r;
	}
	return (ssize_t)got;
}

static void xsend(int fd, const void *p, size_t n)
{
	size_t done = 0;
	while (done < n) {
		ssize_t r = send(fd, (const char *)p + done, n - done, MSG_NOSIGNAL);
		if (r < 0 && errno == EINTR)
			continue;
		CHECK(r > 0, "send");
		done += (size_t)r;
	}
}

struct worker {
	int id, c, s;
};

static void *worker(void *arg)
{
	struct worker *w = arg;
	static __thread char buf[MSG], in[MSG];
	for (int i = 0; i < ROUNDS; i++) {
		uint32_t sid = (uint32_t)(w->id * 1000 + i);
		fill(buf, MSG, sid, 0);
		xsend(w->c, buf, MSG);
		CHECK(xrecv(w->s, in, MSG) == MSG, "worker recv");
		VERIFY(in, MSG, sid, 0);
		xsend(w->s, in, MSG);
		CHECK(xrecv(w->c, buf, MSG) == MSG, "worker echo");
		VERIFY(buf, MSG, sid, 0);
	}
	return NULL;
}

static int listen_fd;

static void *acceptor(void *arg)
{
	(void)arg;
	static char buf[CMSG];
	for (int i = 0; i < CHILDREN; i++) {
		int a;
		while ((a = accept(listen_fd, NULL, NULL)) < 0 && errno == EINTR)
			;
		CHECK(a >= 0, "accept");
		CHECK(xrecv(a, buf, CMSG) == CMSG, "acceptor recv");
		xsend(a, buf, CMSG);
		CHECK_SYS(close(a));
	}
	return NULL;
}

static void child(uint16_t port, int i)
{
	static char buf[CMSG], in[CMSG];
	int c = connect_to(AF_INET, port);
	fill(buf, CMSG, 5000 + (uint32_t)i, 0);
	xsend(c, buf, CMSG);
	CHECK(xrecv(c, in, CMSG) == CMSG, "child echo");
	VERIFY(in, CMSG, 5000 + (uint32_t)i, 0);
	struct pollfd p = {c, POLLIN, 0};
	CHECK(poll(&p, 1, 5000) == 1, "child poll for EOF");
	CHECK(xrecv(c, in, 1) == 0, "child EOF");
	CHECK_SYS(close(c));
	_exit(0);
}

int main(void)
{
	prog_name = "forksig";
	CHECK_SYS(pipe2(selfpipe, O_CLOEXEC));
	CHECK_SYS(fcntl(selfpipe[1], F_SETFL, O_NONBLOCK));
	struct sigaction sa = {0};
	sa.sa_handler = on_alarm;
	sa.sa_flags = SA_RESTART;
	CHECK_SYS(sigaction(SIGALRM, &sa, NULL));
	pthread_t dt, at, wt[WORKERS];
	CHECK(pthread_create(&dt, NULL, drain, NULL) == 0, "thread");

	uint16_t port;
	listen_fd = listener(AF_INET, SOCK_STREAM, &port);
	struct worker w[WORKERS];
	for (int i = 0; i < WORKERS; i++) {
		w[i].id = i;
		tcp_pair(i % 2 ? AF_INET6 : AF_INET, &w[i].c, &w[i].s);
	}
	struct itimerval it = {{0, 2000}, {0, 2000}};
	CHECK_SYS(setitimer(ITIMER_REAL, &it, NULL));
	CHECK(pthread_create(&at, NULL, acceptor, NULL) == 0, "thread");
	for (int i = 0; i < WORKERS; i++)
		CHECK(pthread_create(&wt[i], NULL, worker, &w[i]) == 0, "thread");

	int ok = 0;
	for (int i = 0; i < CHILDREN; i++) {
		pid_t pid = fork();
		CHECK(pid >= 0, "fork");
		if (pid == 0)
			child(port, i);
		int st;
		pid_t r;
		while ((r = waitpid(pid, &st, 0)) < 0 && errno == EINTR)
			;
		CHECK(r == pid, "waitpid");
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d: status %#x", i, st);
		ok++;
	}
	for (int i = 0; i < WORKERS; i++)
		CHECK(pthread_join(wt[i], NULL) == 0, "join");
	CHECK(pthread_join(at, NULL) == 0, "join");
	struct itimerval off = {{0, 0}, {0, 0}};
	CHECK_SYS(setitimer(ITIMER_REAL, &off, NULL));
	CHECK_SYS(close(selfpipe[1]));
	CHECK(pthread_join(dt, NULL) == 0, "join");
	out("workers: %d x %d messages of %d bytes checked both ways", WORKERS, ROUNDS, MSG);
	out("forks: %d children did checked TCP I/O and exited 0", ok);
	out("signal handler wrote to its pipe: %s", atomic_load(&signals) > 0 ? "yes" : "no");
	CHECK(atomic_load(&signals) > 0, "no signals");
	out("forksig: all checks passed");
	return 0;
}
