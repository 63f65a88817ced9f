/*
 * A workload WITHOUT frame pointers for the agent's unwinding tests. Built
 * the way most C is: clang -O2 -g -fomit-frame-pointer nofp.c -o nofpc
 * (the calls are kept by noinline and by using each result after the call,
 * so none becomes a tail jump).
 *
 *   nofpc cpu <seconds>     spins in c_hot, called as
 *                           main -> c_level1 -> c_level2 -> c_level3 -> c_level4 -> c_hot
 *   nofpc memcpy <seconds>  copies 32 MiB buffers with libc's memcpy, called as
 *                           main -> copy_outer -> copy_middle -> copy_inner -> memcpy
 *   nofpc sleep <seconds>   sleeps in 20 ms steps (wall-clock seconds), called as
 *                           main -> wait_outer -> wait_middle -> nanosleep
 *
 * cpu and memcpy <seconds> are seconds of the process's CPU time (see hot.c).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

volatile uint64_t sink;

__attribute__((noinline)) uint64_t c_hot(uint64_t n)
{
	uint64_t x = n;
	for (uint64_t i = 0; i < 20000000; i++)
		x = x * 6364136223846793005ULL + i;
	return x;
}

#define LEVEL(name, next)                                  \
	__attribute__((noinline)) uint64_t name(uint64_t n) \
	{                                                  \
		uint64_t r = next(n + 1);                  \
		sink = r;                                  \
		return r ^ n;                              \
	}

LEVEL(c_level4, c_hot)
LEVEL(c_level3, c_level4)
LEVEL(c_level2, c_level3)
LEVEL(c_level1, c_level2)

static char *src_buf, *dst_buf;
#define BUF (32u << 20)

__attribute__((noinline)) uint64_t copy_inner(uint64_t n)
{
	memcpy(dst_buf, src_buf, BUF - (n & 63));
	sink = (uint8_t)dst_buf[n & 1023];
	return n + 1;
}

LEVEL(copy_middle, copy_inner)
LEVEL(copy_outer, copy_middle)

__attribute__((noinline)) uint64_t wait_middle(uint64_t n)
{
	struct timespec ts = {0, 20 * 1000 * 1000};
	nanosleep(&ts, NULL);
	sink = n;
	return n + 1;
}

LEVEL(wait_outer, wait_middle)

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s cpu|memcpy|sleep <seconds>\n", argv[0]);
		return 2;
	}
	double secs = atof(argv[2]);
	uint64_t n = 1;
	if (strcmp(argv[1], "cpu") == 0) {
		double until = cpu_now() + secs;
		while (cpu_now() < until)
			n = c_level1(n);
	} else if (strcmp(argv[1], "memcpy") == 0) {
		src_buf = malloc(BUF);
		dst_buf = malloc(BUF);
		if (!src_buf || !dst_buf)
			return 1;
		memset(src_buf, 7, BUF);
		memset(dst_buf, 1, BUF);
		double until = cpu_now() + secs;
		while (cpu_now() < until)
			n = copy_outer(n);
	} else if (strcmp(argv[1], "sleep") == 0) {
		for (int i = 0; i < (int)(secs * 50); i++)
			n = wait_outer(n);
	} else {
		fprintf(stderr, "unknown mode %s\n", argv[1]);
		return 2;
	}
	sink = n;
	return 0;
}
