/* Test client for the interposer: reaches the (fake) driver the ways real
 * CUDA programs do. Usage: client MODE [ARG]. Prints "ok" lines and exits 0
 * on success; prints "FAIL ..." and exits 1 otherwise. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned int CUresult;
typedef unsigned long long CUdeviceptr;
typedef CUresult (*gpa2_t)(const char *, void **, int, uint64_t, int *);
typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, void *, void **, void **);
typedef CUresult (*sync_t)(void *);
typedef CUresult (*ctxsync_t)(void);
typedef CUresult (*version_t)(int *);

static int failed;
#define CHECK(c) do { if (!(c)) { printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #c); failed = 1; } } while (0)

/* "<object basename>:<symbol>" of a code address, for the test to inspect. */
static const char *where(const void *p) {
    static char buf[4][256];
    static int n;
    char *b = buf[n++ % 4];
    Dl_info info;
    if (!p) return "null";
    if (!dladdr(p, &info) || !info.dli_fname) { snprintf(b, 256, "?:?"); return b; }
    const char *base = strrchr(info.dli_fname, '/');
    snprintf(b, 256, "%s:%s", base ? base + 1 : info.dli_fname, info.dli_sname ? info.dli_sname : "?");
    return b;
}

static void *open_driver(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("FAIL dlopen: %s\n", dlerror()); exit(1); }
    return h;
}

/* cudart's way: one dlsym, then cuGetProcAddress for everything. */
static int mode_gpa(void) {
    void *h = open_driver();
    gpa2_t gpa0 = (gpa2_t)dlsym(h, "cuGetProcAddress_v2");
    CHECK(gpa0 != 0);
    printf("dlsym cuGetProcAddress_v2 -> %s\n", where((void *)gpa0));
    void *p = 0;
    int st = -1;
    CHECK(gpa0("cuGetProcAddress", &p, 11030, 0, &st) == 0 && st == 0);
    printf("gpa cuGetProcAddress@11030 -> %s\n", where(p));
    CHECK(gpa0("cuGetProcAddress", &p, 12000, 0, &st) == 0 && st == 0);
    printf("gpa cuGetProcAddress@12000 -> %s\n", where(p));
    gpa2_t gpa = (gpa2_t)p;

    alloc_t alloc = 0;
    CHECK(gpa("cuMemAlloc", (void **)&alloc, 3020, 0, &st) == 0 && st == 0);
    printf("gpa cuMemAlloc@3020 -> %s\n", where((void *)alloc));
    CUdeviceptr d = 0;
    CHECK(alloc(&d, 4096) == 0 && d == 0x10000 + 4096);

    launch_t lk0 = 0, lk2 = 0;
    CHECK(gpa("cuLaunchKernel", (void **)&lk0, 12000, 0, &st) == 0 && st == 0);
    CHECK(gpa("cuLaunchKernel", (void **)&lk2, 12000, 2, &st) == 0 && st == 0);
    printf("gpa cuLaunchKernel@12000/0 -> %s\n", where((void *)lk0));
    printf("gpa cuLaunchKernel@12000/2 -> %s\n", where((void *)lk2));
    CHECK(lk0((void *)0xf1, 1, 2, 3, 4, 5, 6, 7, (void *)0x5, (void **)0x8, (void **)0x9) == 0);
    CHECK(lk2((void *)0xf2, 11, 12, 13, 14, 15, 16, 17, 0, 0, 0) == 0);

    sync_t ss2 = 0;
    CHECK(gpa("cuStreamSynchronize", (void **)&ss2, 7000, 2, &st) == 0 && st == 0);
    printf("gpa cuStreamSynchronize@7000/2 -> %s\n", where((void *)ss2));
    CHECK(ss2(0) == 0);

    ctxsync_t cs = 0;
    CHECK(gpa("cuCtxSynchronize", (void **)&cs, 2000, 1, &st) == 0 && st == 0);
    CHECK(cs() == 719);

    version_t ver = 0;
    CHECK(gpa("cuDriverGetVersion", (void **)&ver, 2020, 0, &st) == 0 && st == 0);
    printf("gpa cuDriverGetVersion@2020 -> %s\n", where((void *)ver));
    int v = 0;
    CHECK(ver(&v) == 0 && v == 12090);

    p = (void *)0x1;
    st = -1;
    CHECK(gpa("cuNoSuchFunction", &p, 12000, 0, &st) == 500 && st == 1 && p == 0);
    CHECK(gpa("cuLaunchKernel", &p, 3000, 0, &st) == 500 && st == 2);
    return failed;
}

/* cudarc/CuPy's way: dlsym exact ABI names on the handle. */
static int mode_dlsym(void) {
    void *h = open_driver();
    alloc_t alloc = (alloc_t)dlsym(h, "cuMemAlloc_v2");
    launch_t lk2 = (launch_t)dlsym(h, "cuLaunchKernel_ptsz");
    version_t ver = (version_t)dlsym(h, "cuDriverGetVersion");
    CHECK(dlsym(h, "cuMemAllocAsync") == 0); /* the fake lacks it: stays null */
    printf("dlsym cuMemAlloc_v2 -> %s\n", where((void *)alloc));
    printf("dlsym cuLaunchKernel_ptsz -> %s\n", where((void *)lk2));
    printf("dlsym cuDriverGetVersion -> %s\n", where((void *)ver));
    CUdeviceptr d = 0;
    CHECK(alloc && alloc(&d, 77) == 0 && d == 0x10000 + 77);
    CHECK(lk2 && lk2((void *)0xf3, 21, 22, 23, 24, 25, 26, 27, (void *)0x2, 0, 0) == 0);
    int v = 0;
    CHECK(ver && ver(&v) == 0 && v == 12090);
    /* RTLD_NEXT must be resolved relative to the caller (this executable). */
    printf("dlsym RTLD_NEXT dlsym -> %s\n", where(dlsym(RTLD_NEXT, "dlsym")));
    return failed;
}

/* Replays a recorded cuGetProcAddress request list, printing each answer. */
static int mode_replay(const char *path) {
    void *h = open_driver();
    gpa2_t gpa0 = (gpa2_t)dlsym(h, "cuGetProcAddress_v2");
    void *p = 0;
    int st = -1;
    CHECK(gpa0("cuGetProcAddress", &p, 12000, 0, &st) == 0);
    gpa2_t gpa = (gpa2_t)p;
    FILE *f = fopen(path, "r");
    if (!f) { printf("FAIL open %s\n", path); return 1; }
    char line[512], name[256];
    int ver;
    unsigned long long flags;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "\"%255[^\"]\", ver=%d, flags=%llu", name, &ver, &flags) != 3) {
            if (strncmp(line, "\"\"", 2) == 0) { name[0] = 0; sscanf(line, "\"\", ver=%d, flags=%llu", &ver, &flags); }
            else continue;
        }
        p = 0;
        st = -1;
        CUresult r = gpa(name, &p, ver, flags, &st);
        printf("%s %d %llu -> %u %d %s\n", name, ver, flags, r, st, where(p));
    }
    fclose(f);
    return failed;
}

/* Real work through cudart's path against a driver that implements it
 * (simgpu): context, memory accounting, synchronisation. */
typedef CUresult (*init_t)(unsigned);
typedef CUresult (*devget_t)(int *, int);
typedef CUresult (*retain_t)(void **, int);
typedef CUresult (*setcur_t)(void *);
typedef CUresult (*info_t)(size_t *, size_t *);
typedef CUresult (*free_t)(CUdeviceptr);
static void *lookup(gpa2_t gpa, const char *name, int ver, uint64_t flags) {
    void *p = 0;
    int st = -1;
    CUresult r = gpa(name, &p, ver, flags, &st);
    if (r != 0 || st != 0 || !p) { printf("FAIL lookup %s: %u %d\n", name, r, st); exit(1); }
    printf("gpa %s@%d/%llu -> %s\n", name, ver, (unsigned long long)flags, where(p));
    return p;
}
static int mode_sim(void) {
    void *h = open_driver();
    gpa2_t gpa0 = (gpa2_t)dlsym(h, "cuGetProcAddress_v2");
    gpa2_t gpa = (gpa2_t)lookup(gpa0, "cuGetProcAddress", 12000, 0);
    init_t init = (init_t)lookup(gpa, "cuInit", 2000, 0);
    devget_t devget = (devget_t)lookup(gpa, "cuDeviceGet", 2000, 0);
    retain_t retain = (retain_t)lookup(gpa, "cuDevicePrimaryCtxRetain", 7000, 0);
    setcur_t setcur = (setcur_t)lookup(gpa, "cuCtxSetCurrent", 4000, 0);
    info_t info = (info_t)lookup(gpa, "cuMemGetInfo", 3020, 0);
    alloc_t alloc = (alloc_t)lookup(gpa, "cuMemAlloc", 3020, 0);
    free_t mfree = (free_t)lookup(gpa, "cuMemFree", 3020, 0);
    sync_t ss2 = (sync_t)lookup(gpa, "cuStreamSynchronize", 7000, 2);
    ctxsync_t cs = (ctxsync_t)lookup(gpa, "cuCtxSynchronize", 2000, 0);
    int dev = -1;
    void *ctx = 0;
    CHECK(init(0) == 0);
    CHECK(devget(&dev, 0) == 0);
    CHECK(retain(&ctx, dev) == 0 && ctx);
    CHECK(setcur(ctx) == 0);
    size_t free0 = 0, free1 = 0, total = 0;
    CHECK(info(&free0, &total) == 0 && total > 0 && free0 <= total);
    CUdeviceptr d = 0;
    CHECK(alloc(&d, 64 << 20) == 0 && d != 0);
    CHECK(info(&free1, &total) == 0 && free1 + (64 << 20) <= free0);
    printf("mem free %zu -> %zu of %zu\n", free0, free1, total);
    CHECK(ss2(0) == 0);
    CHECK(cs() == 0);
    CHECK(mfree(d) == 0);
    CHECK(mfree(d) != 0); /* double free is an error, and the code comes back unchanged */
    return failed;
}

/* Programs linked with -lcuda: first calls race from several threads. */
extern CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
static void *thread_main(void *arg) {
    CUdeviceptr d = 0;
    for (int i = 0; i < 100; i++)
        if (cuMemAlloc_v2(&d, (size_t)(uintptr_t)arg) != 0 || d != 0x10000 + (uintptr_t)arg) failed = 1;
    return 0;
}
static int mode_linked(void) {
    pthread_t t[8];
    for (uintptr_t i = 0; i < 8; i++) pthread_create(&t[i], 0, thread_main, (void *)(i + 1));
    for (int i = 0; i < 8; i++) pthread_join(t[i], 0);
    CHECK(!failed);
    printf("linked cuMemAlloc_v2 -> %s\n", where((void *)cuMemAlloc_v2));
    return failed;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    int rc;
    if (!strcmp(argv[1], "gpa")) rc = mode_gpa();
    else if (!strcmp(argv[1], "dlsym")) rc = mode_dlsym();
    else if (!strcmp(argv[1], "replay") && argc > 2) rc = mode_replay(argv[2]);
    else if (!strcmp(argv[1], "linked")) rc = mode_linked();
    else if (!strcmp(argv[1], "sim")) rc = mode_sim();
    else return 2;
    if (!rc) printf("ok\n");
    return rc;
}
