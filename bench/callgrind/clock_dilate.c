// LD_PRELOAD for callgrind runs (scripts/launch-instructions.sh): the
// monotonic clocks run DILATE (default 50) times slower than real time, so
// that durations measured under valgrind's slowdown (the null driver's
// event timings, hence kernel estimates and how many launches a lease
// covers) come out about as they do natively. Instruction counts are not
// affected otherwise, except the few this wrapper adds to a clock read.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

typedef int (*clock_gettime_t)(clockid_t, struct timespec *);

int clock_gettime(clockid_t clock, struct timespec *ts) {
    static clock_gettime_t real;
    static long long dilate;
    if (!real) {
        real = (clock_gettime_t)dlsym(RTLD_NEXT, "clock_gettime");
        const char *value = getenv("DILATE");
        dilate = value ? atoll(value) : 50;
        if (dilate < 1)
            dilate = 1;
    }
    int rc = real(clock, ts);
    if (rc == 0 && (clock == CLOCK_MONOTONIC || clock == CLOCK_MONOTONIC_RAW ||
                    clock == CLOCK_BOOTTIME)) {
        long long ns = ((long long)ts->tv_sec * 1000000000LL + ts->tv_nsec) / dilate;
        ts->tv_sec = ns / 1000000000LL;
        ts->tv_nsec = ns % 1000000000LL;
    }
    return rc;
}
