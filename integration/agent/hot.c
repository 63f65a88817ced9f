/*
 * A workload with known hot functions for the agent's end-to-end tests.
 * Built with frame pointers: cc -O2 -g -fno-omit-frame-pointer
 * -fno-optimize-sibling-calls hot.c -o hotc
 *
 *   hotc cpu <seconds>      spins in hot_function, called as
 *                           main -> outer_caller -> middle_caller -> hot_function
 *   hotc syscall <seconds>  writes to /dev/null in a loop (kernel time)
 *   hotc exec <seconds> <program> <args...>
 *                           spins as `cpu` does, then replaces itself with
 *                           <program> (same pid, new comm)
 *
 * <seconds> are seconds of the process's CPU time, not of the wall clock:
 * a sampling profiler sees a process in proportion to the CPU it gets, so
 * a workload that runs until it has had its CPU gives the tests the same
 * number of samples however loaded the machine is (it just takes longer).
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The CPU time (user and system) this process has had, in seconds. */
static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

volatile uint64_t sink;

__attribute__((noinline)) uint64_t hot_function(uint64_t n)
{
	uint64_t x = n;
	for (uint64_t i = 0; i < 20000000; i++)
		x = x * 6364136223846793005ULL + i;
	return x;
}

__attribute__((noinline)) uint64_t middle_caller(uint64_t n)
{
	uint64_t r = hot_function(n);
	sink = r;
	return r + 1;
}

__attribute__((noinline)) uint64_t outer_caller(uint64_t n)
{
	uint64_t r = middle_caller(n);
	sink = r;
	return r + 1;
}

__attribute__((noinline)) void syscall_loop(double until)
{
	char buf[64] = {0};
	int fd = open("/dev/null", O_WRONLY);
	if (fd < 0) {
		perror("open /dev/null");
		exit(1);
	}
	while (now() < until)
		for (int i = 0; i < 1000; i++)
			if (write(fd, buf, sizeof buf) < 0)
				exit(1);
	close(fd);
}

int main(int argc, char **argv)
{
	int exec_after = argc >= 4 && strcmp(argv[1], "exec") == 0;
	if (argc != 3 && !exec_after) {
		fprintf(stderr,
			"usage: %s cpu|syscall <seconds> | exec <seconds> <program> <args...>\n",
			argv[0]);
		return 2;
	}
	double until = now() + atof(argv[2]);
	if (strcmp(argv[1], "syscall") == 0) {
		syscall_loop(until);
		return 0;
	}
	uint64_t n = 1;
	while (now() < until)
		n = outer_caller(n);
	sink = n;
	if (exec_after) {
		execv(argv[3], argv + 3);
		perror("execv");
		return 1;
	}
	return 0;
}
