/*
 * signals — what a program sees of its own signals (issue 9).
 *
 * Usage: signals CASE [ROUNDS]. Each case repeats ROUNDS times and prints
 * one transcript line with counts that are the same in every bare run; a
 * preloaded run must print the same. The preload must not let a thread of
 * its own take a signal the program has blocked, nor change where a signal
 * is delivered, nor how SIGPIPE ends a writer.
 *
 *   chld-section   SIGCHLD blocked around fork + child exit (bash does this):
 *                  the handler must run on the main thread, after the unblock
 *   signalfd       SIGUSR1 blocked, sent with kill(), read from a signalfd
 *   runtime-sigs   the same for the faults and SIGURG (which Go's runtime
 *                  keeps unblocked on its threads unless told otherwise)
 *   chld-signalfd  SIGCHLD blocked, read from a signalfd after a child exits
 *   chld-sigwait   the same with sigtimedwait
 *   term-sigwait   SIGTERM blocked, sent with kill(), taken with sigwait
 *   timer          a 1 ms setitimer; SIGALRM blocked except in sigsuspend:
 *                  every tick must wake the sigsuspend of the main thread
 *   kinds          kill, raise, pthread_kill, sigqueue (with its value) with
 *                  the main thread blocking SIGUSR1 and a worker thread
 *                  not: each must reach the thread it reaches bare
 *   sigpipe        a child writes to a pipe and to a unix socket whose
 *                  reader is gone: killed by SIGPIPE with the default
 *                  action, EPIPE with SIG_IGN
 *   first-fds      the first open() returns 3; dup2 onto 3 and 4 stays
 */
#include "common.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>

static pid_t tid(void) { return (pid_t)syscall(SYS_gettid); }

static void block(int sig, int how)
{
	sigset_t s;
	sigemptyset(&s);
	sigaddset(&s, sig);
	CHECK(sigprocmask(how, &s, NULL) == 0, "sigprocmask");
}

/* ---- chld-section ---------------------------------------------------------- */

static pid_t main_tid;
static volatile sig_atomic_t in_section, handled, wrong_thread, during_section;

static void on_chld(int sig)
{
	handled++;
	if (tid() != main_tid)
		wrong_thread++;
	if (in_section)
		during_section++;
}

static void chld_section(int rounds)
{
	signal(SIGCHLD, on_chld);
	for (int i = 0; i < rounds; i++) {
		block(SIGCHLD, SIG_BLOCK);
		in_section = 1;
		pid_t p = CHECK_SYS(fork());
		if (p == 0)
			_exit(3);
		struct timespec ts = {0, 1000000};
		while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
			;
		in_section = 0;
		block(SIGCHLD, SIG_UNBLOCK);
		int st;
		CHECK_SYS(waitpid(p, &st, 0));
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 3, "child status %d", st);
	}
	out("chld-section: %d rounds, handler ran %s, %d times on another thread, %d times in "
	    "the blocked section",
	    rounds, handled > 0 ? "yes" : "no", (int)wrong_thread, (int)during_section);
}

/* ---- signalfd, sigwait ------------------------------------------------------ */

static int read_signalfd(int fd, int timeout_ms)
{
	struct pollfd p = {fd, POLLIN, 0};
	if (poll(&p, 1, timeout_ms) != 1)
		return 0;
	struct signalfd_siginfo si;
	if (read(fd, &si, sizeof si) != sizeof si)
		return 0;
	return (int)si.ssi_signo;
}

static void sigusr_signalfd(int rounds)
{
	block(SIGUSR1, SIG_BLOCK);
	sigset_t s;
	sigemptyset(&s);
	sigaddset(&s, SIGUSR1);
	int fd = CHECK_SYS(signalfd(-1, &s, SFD_CLOEXEC));
	int got = 0;
	for (int i = 0; i < rounds; i++) {
		CHECK_SYS(kill(getpid(), SIGUSR1));
		if (read_signalfd(fd, 2000) == SIGUSR1)
			got++;
	}
	out("signalfd: %d/%d SIGUSR1 read", got, rounds);
}

/* The signals Go's runtime keeps for itself on its threads (the faults, and
 * SIGURG for preemption), sent to the process with kill() and sigqueue()
 * while the program blocks them and reads them from a signalfd: a Go
 * thread that took one crashed the process (a "fault" that was no fault)
 * or swallowed it (SIGURG, as a preemption request). */
static void runtime_sigs(int rounds)
{
	static const int sigs[] = {SIGILL, SIGTRAP, SIGBUS, SIGFPE, SIGSEGV, SIGURG};
	sigset_t s;
	sigemptyset(&s);
	for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
		sigaddset(&s, sigs[i]);
	CHECK(sigprocmask(SIG_BLOCK, &s, NULL) == 0, "sigprocmask");
	int fd = CHECK_SYS(signalfd(-1, &s, SFD_CLOEXEC));
	int got = 0, sent = 0;
	for (int r = 0; r < rounds; r++) {
		for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++, sent++) {
			if (r % 2 == 0)
				CHECK_SYS(kill(getpid(), sigs[i]));
			else
				CHECK_SYS(sigqueue(getpid(), sigs[i], (union sigval){.sival_int = r}));
			if (read_signalfd(fd, 2000) == sigs[i])
				got++;
		}
	}
	out("runtime-sigs: %d/%d ILL, TRAP, BUS, FPE, SEGV and URG read", got, sent);
}

static void chld_wait(int rounds, int use_fd)
{
	block(SIGCHLD, SIG_BLOCK);
	sigset_t s;
	sigemptyset(&s);
	sigaddset(&s, SIGCHLD);
	int fd = use_fd ? CHECK_SYS(signalfd(-1, &s, SFD_CLOEXEC | SFD_NONBLOCK)) : -1;
	int got = 0;
	for (int i = 0; i < rounds; i++) {
		pid_t p = CHECK_SYS(fork());
		if (p == 0)
			_exit(0);
		if (use_fd) {
			got += read_signalfd(fd, 2000) == SIGCHLD;
		} else {
			struct timespec t = {2, 0};
			got += sigtimedwait(&s, NULL, &t) == SIGCHLD;
		}
		CHECK_SYS(waitpid(p, NULL, 0));
	}
	out("chld-%s: %d/%d SIGCHLD taken", use_fd ? "signalfd" : "sigwait", got, rounds);
}

static void term_sigwait(int rounds)
{
	block(SIGTERM, SIG_BLOCK);
	sigset_t s;
	sigemptyset(&s);
	sigaddset(&s, SIGTERM);
	int got = 0;
	for (int i = 0; i < rounds; i++) {
		CHECK_SYS(kill(getpid(), SIGTERM));
		int sig = 0;
		if (sigwait(&s, &sig) == 0 && sig == SIGTERM)
			got++;
	}
	out("term-sigwait: %d/%d SIGTERM taken", got, rounds);
}

/* ---- timer ------------------------------------------------------------------ */

static volatile sig_atomic_t ticks, ticks_elsewhere;

static void on_alrm(int sig)
{
	ticks++;
	if (tid() != main_tid)
		ticks_elsewhere++;
}

static void timer(int rounds)
{
	struct sigaction a;
	memset(&a, 0, sizeof a);
	a.sa_handler = on_alrm;
	sigemptyset(&a.sa_mask);
	CHECK_SYS(sigaction(SIGALRM, &a, NULL));
	block(SIGALRM, SIG_BLOCK);
	struct itimerval it = {{0, 1000}, {0, 1000}};
	CHECK_SYS(setitimer(ITIMER_REAL, &it, NULL));
	sigset_t none;
	sigemptyset(&none);
	int woken = 0;
	for (int i = 0; i < rounds; i++) {
		/* Busy outside sigsuspend for a while, as a program between
		 * its waits: a tick then is pending until the next wait. */
		struct timespec t0, t1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		do
			clock_gettime(CLOCK_MONOTONIC, &t1);
		while ((t1.tv_sec - t0.tv_sec) * 1000000000L + t1.tv_nsec - t0.tv_nsec < 1500000);
		sig_atomic_t before = ticks;
		sigsuspend(&none);
		if (ticks > before)
			woken++;
	}
	struct itimerval off = {{0, 0}, {0, 0}};
	CHECK_SYS(setitimer(ITIMER_REAL, &off, NULL));
	out("timer: %d/%d waits woken by a tick, %d ticks on another thread", woken, rounds,
	    (int)ticks_elsewhere);
}

/* ---- kinds ------------------------------------------------------------------ */

static volatile pid_t last_tid;
static volatile int last_value;

static void on_usr1(int sig, siginfo_t *si, void *ctx)
{
	last_tid = tid();
	last_value = si->si_code == SI_QUEUE ? si->si_value.sival_int : -1;
}

static pid_t worker_tid;
static volatile int worker_stop;

static void *worker(void *arg)
{
	worker_tid = tid();
	block(SIGUSR1, SIG_UNBLOCK);
	while (!worker_stop)
		pause();
	return NULL;
}

static void on_usr2(int sig) {}

/* Waits until the handler has run (last_tid set) or 2 s have passed. */
static pid_t wait_handler(void)
{
	for (int i = 0; i < 2000 && last_tid == 0; i++) {
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	return last_tid;
}

static void kinds(int rounds)
{
	struct sigaction a;
	memset(&a, 0, sizeof a);
	a.sa_sigaction = on_usr1;
	a.sa_flags = SA_SIGINFO;
	sigemptyset(&a.sa_mask);
	CHECK_SYS(sigaction(SIGUSR1, &a, NULL));
	signal(SIGUSR2, on_usr2); /* ends the worker's pause */
	block(SIGUSR1, SIG_BLOCK); /* the worker, made next, unblocks it */
	pthread_t w;
	CHECK(pthread_create(&w, NULL, worker, NULL) == 0, "pthread_create");
	while (__atomic_load_n(&worker_tid, __ATOMIC_ACQUIRE) == 0)
		sched_yield();
	int kill_ok = 0, queue_ok = 0, value_ok = 0, thread_ok = 0, raise_ok = 0;
	for (int i = 0; i < rounds; i++) {
		last_tid = 0;
		CHECK_SYS(kill(getpid(), SIGUSR1));
		kill_ok += wait_handler() == worker_tid;

		last_tid = 0;
		union sigval v = {.sival_int = 1000 + i};
		CHECK_SYS(sigqueue(getpid(), SIGUSR1, v));
		queue_ok += wait_handler() == worker_tid;
		value_ok += last_value == 1000 + i;

		last_tid = 0;
		CHECK(pthread_kill(w, SIGUSR1) == 0, "pthread_kill");
		thread_ok += wait_handler() == worker_tid;

		/* raise() from the main thread, which blocks SIGUSR1: the
		 * signal waits for the main thread, not for anyone else. */
		last_tid = 0;
		CHECK_SYS(raise(SIGUSR1));
		struct timespec ts = {0, 2000000};
		nanosleep(&ts, NULL);
		int early = last_tid != 0;
		block(SIGUSR1, SIG_UNBLOCK);
		raise_ok += !early && last_tid == main_tid;
		block(SIGUSR1, SIG_BLOCK);
	}
	worker_stop = 1;
	pthread_kill(w, SIGUSR2);
	pthread_join(w, NULL);
	out("kinds: kill %d/%d, sigqueue %d/%d (value %d/%d), pthread_kill %d/%d on the "
	    "thread not blocking it; raise %d/%d on the raising thread",
	    kill_ok, rounds, queue_ok, rounds, value_ok, rounds, thread_ok, rounds, raise_ok,
	    rounds);
}

/* ---- sigpipe ---------------------------------------------------------------- */

/* In a child: write to fds[1] after fds[0] is closed; returns the status. */
static int broken_write(int unix_socket, int ignore)
{
	int fds[2];
	if (unix_socket)
		CHECK_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, fds));
	else
		CHECK_SYS(pipe(fds));
	int rd = unix_socket ? 1 : 0, wr = unix_socket ? 0 : 1;
	close(fds[rd]); /* before the fork: no reader anywhere */
	pid_t p = CHECK_SYS(fork());
	if (p == 0) {
		signal(SIGPIPE, ignore ? SIG_IGN : SIG_DFL);
		ssize_t n = write(fds[wr], "x", 1);
		_exit(n < 0 && errno == EPIPE ? 32 : 1);
	}
	close(fds[wr]);
	int st;
	CHECK_SYS(waitpid(p, &st, 0));
	return st;
}

static void sigpipe(int rounds)
{
	int killed[2] = {0, 0}, epipe[2] = {0, 0};
	for (int i = 0; i < rounds; i++)
		for (int u = 0; u < 2; u++) {
			int st = broken_write(u, 0);
			killed[u] += WIFSIGNALED(st) && WTERMSIG(st) == SIGPIPE;
			st = broken_write(u, 1);
			epipe[u] += WIFEXITED(st) && WEXITSTATUS(st) == 32;
		}
	out("sigpipe: pipe killed by SIGPIPE %d/%d, EPIPE when ignored %d/%d; "
	    "unix socket killed %d/%d, EPIPE %d/%d",
	    killed[0], rounds, epipe[0], rounds, killed[1], rounds, epipe[1], rounds);
}

/* ---- first-fds -------------------------------------------------------------- */

static void first_fds(void)
{
	int fd = CHECK_SYS(open("/dev/null", O_RDONLY));
	int d3 = dup2(fd, 3), d4 = dup2(fd, 4);
	struct timespec ts = {0, 20000000}; /* whatever runs beside us has run */
	nanosleep(&ts, NULL);
	char t[64] = "";
	ssize_t n = readlink("/proc/self/fd/4", t, sizeof t - 1);
	if (n > 0)
		t[n] = 0;
	out("first-fds: first open %d, dup2 onto 3 %s, onto 4 %s, fd 4 is %s", fd,
	    d3 == 3 ? "ok" : "failed", d4 == 4 ? "ok" : "failed", t);
}

int main(int argc, char **argv)
{
	prog_name = "signals";
	main_tid = tid();
	const char *c = argc > 1 ? argv[1] : "";
	int rounds = argc > 2 ? atoi(argv[2]) : 1;
	if (strcmp(c, "chld-section") == 0)
		chld_section(rounds);
	else if (strcmp(c, "runtime-sigs") == 0)
		runtime_sigs(rounds);
	else if (strcmp(c, "signalfd") == 0)
		sigusr_signalfd(rounds);
	else if (strcmp(c, "chld-signalfd") == 0)
		chld_wait(rounds, 1);
	else if (strcmp(c, "chld-sigwait") == 0)
		chld_wait(rounds, 0);
	else if (strcmp(c, "term-sigwait") == 0)
		term_sigwait(rounds);
	else if (strcmp(c, "timer") == 0)
		timer(rounds);
	else if (strcmp(c, "kinds") == 0)
		kinds(rounds);
	else if (strcmp(c, "sigpipe") == 0)
		sigpipe(rounds);
	else if (strcmp(c, "first-fds") == 0)
		first_fds();
	else {
		fprintf(stderr, "usage: signals chld-section|signalfd|chld-signalfd|chld-sigwait|"
				"term-sigwait|timer|kinds|sigpipe|first-fds [ROUNDS]\n");
		return 2;
	}
	return 0;
}
