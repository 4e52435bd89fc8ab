// LD_PRELOAD for callgrind runs (scripts/launch-instructions.sh): a
// virtual CLOCK_MONOTONIC that starts at the real one and advances
// CLOCK_STEP_NS (default 100) at every read, whatever time passes. Under
// valgrind's slowdown, and on a loaded machine, real durations measured by
// the process (the null driver's event timings, hence the interposer's
// kernel estimates and how many launches a lease covers) would vary from run
// to run; counted in clock reads they do not, so neither do the
// instruction counts. Nothing in the runs sleeps on the clock (the token
// bucket is deep enough that no launch waits).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

typedef int (*clock_gettime_t)(clockid_t, struct timespec *);

int clock_gettime(clockid_t clock, struct timespec *ts) {
    static clock_gettime_t real;
    static long long step, start;
    static long long reads;
    if (!real) {
        real = (clock_gettime_t)dlsym(RTLD_NEXT, "clock_gettime");
        const char *value = getenv("CLOCK_STEP_NS");
        step = value ? atoll(value) : 100;
    }
    if (clock != CLOCK_MONOTONIC && clock != CLOCK_MONOTONIC_RAW && clock != CLOCK_BOOTTIME)
        return real(clock, ts);
    if (!start) {
        struct timespec now;
        real(CLOCK_MONOTONIC, &now);
        __atomic_compare_exchange_n(&start, &(long long){0},
                                    (long long)now.tv_sec * 1000000000LL + now.tv_nsec, 0,
                                    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    }
    long long ns = start + __atomic_add_fetch(&reads, 1, __ATOMIC_RELAXED) * step;
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
    return 0;
}
