/* A C workload with a known call chain for the server-side symbols tests:
 * main -> outer_caller -> inlined_middle (always inlined) -> spin_leaf.
 * `chainc <seconds>` spins until the process has had <seconds> of CPU.
 * Built with -g and frame pointers, then split and stripped by the test. */
#include <stdlib.h>
#include <time.h>

volatile unsigned long sink;

__attribute__((noinline)) void spin_leaf(unsigned long n) {
    for (unsigned long i = 0; i < n; i++)
        sink += i * i;
}

static inline __attribute__((always_inline)) void inlined_middle(unsigned long n) {
    spin_leaf(n);
    sink ^= n;
}

__attribute__((noinline)) void outer_caller(unsigned long n) {
    inlined_middle(n);
    sink += 1;
}

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 30;
    while (cpu_seconds() < secs)
        outer_caller(2000000);
    return 0;
}
