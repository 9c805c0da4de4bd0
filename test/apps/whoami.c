/* whoami: a two-rank job that uses its own identity, the way test
 * programs and MPI libraries do: each rank prints its pid and host name,
 * seeds the bytes it sends with them, and signals itself through the pid
 * getpid() gave it. A rank re-executed by recovery must be given its first
 * run's pid and host name (issue 10, determinants), and its signals to
 * that pid must reach it: otherwise its output and its bytes differ from
 * its first run's (a divergence), or kill() fails or hits another process.
 *
 *   whoami [ROUNDS [MS]]     (default 400 rounds, 5 ms apart)
 *
 * Each round the ranks exchange 8 bytes: mix64 of the pid, the host
 * name's hash and the round number. Each rank checks what it receives
 * against the pid and host its peer announced in its first message, and
 * kill(getpid(), SIGUSR1)s itself every round, checking its handler ran.
 *
 * Output: "whoami: rank R pid P host H" first, and at the end "whoami ok
 * rank R pid P host H signals S". Exit 1 on a failed check. */
#include "common.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

static volatile sig_atomic_t signals;

static void on_usr1(int sig)
{
	(void)sig;
	signals++;
}

static uint64_t word(uint64_t pid, uint64_t host, uint64_t round) { return mix64(pid * 0x9e3779b97f4a7c15ull ^ host ^ round); }

int main(int argc, char **argv)
{
	struct job j;
	job_init(&j, "whoami");
	int rounds = argc > 1 ? atoi(argv[1]) : 400;
	int ms = argc > 2 ? atoi(argv[2]) : 5;
	if (j.size != 2 || rounds <= 0 || ms < 0)
		die("want 2 ranks, a positive round count and a delay >= 0");
	char host[256];
	if (gethostname(host, sizeof host) != 0)
		die("gethostname");
	struct utsname u;
	if (uname(&u) != 0 || strcmp(u.nodename, host) != 0)
		die("uname's nodename %s is not gethostname's %s", u.nodename, host);
	uint64_t pid = (uint64_t)getpid(), hh = fnv1a(FNV_OFFSET, host, strlen(host));
	printf("whoami: rank %d pid %llu host %s\n", j.rank, (unsigned long long)pid, host);
	fflush(stdout);
	struct sigaction sa = {.sa_handler = on_usr1};
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGUSR1, &sa, NULL) != 0)
		die("sigaction");

	int fd;
	if (j.rank == 0) {
		uint32_t r, k;
		fd = job_accept(job_listen(&j), &r, &k);
	} else {
		fd = job_connect(&j, 0, 1, 60);
	}
	uint64_t me[2] = {pid, hh}, peer[2];
	write_full(fd, me, sizeof me, "identity");
	read_full(fd, peer, sizeof peer, "the peer's identity");
	for (int i = 0; i < rounds; i++) {
		uint64_t w = word(pid, hh, (uint64_t)i), got;
		write_full(fd, &w, sizeof w, "round");
		read_full(fd, &got, sizeof got, "round");
		if (got != word(peer[0], peer[1], (uint64_t)i))
			die("round %d: the peer's word does not match the identity it announced", i);
		sig_atomic_t before = signals;
		if (kill(getpid(), SIGUSR1) != 0)
			die("kill(getpid(), SIGUSR1)");
		if (signals != before + 1)
			die("round %d: SIGUSR1 to getpid() did not reach this process", i);
		if (ms > 0)
			usleep((useconds_t)ms * 1000);
	}
	printf("whoami ok rank %d pid %llu host %s signals %d\n", j.rank, (unsigned long long)pid, host, (int)signals);
	return 0;
}
