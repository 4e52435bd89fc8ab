/* A tiny fake CUDA driver for the interposer's tests (no GPU needed).
 * Built by tests/preload.rs as <tmp>/libcuda.so.1 (soname libcuda.so.1).
 * Every call appends one line "<exported name> <details>" to $FAKECUDA_LOG,
 * so tests can check that the real function was reached with the caller's
 * arguments (prefixed by FAKE_TAG when built with -DFAKE_TAG=...).
 * Link it with -Bsymbolic, like the real driver: its own references to its
 * exports must not be interposed. cuGetProcAddress/_v2 honour version and flags the way the real
 * driver does for the few names implemented here. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned int CUresult;
typedef unsigned long long CUdeviceptr;
#define CUDA_SUCCESS 0u
#define CUDA_ERROR_NOT_FOUND 500u

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#include <stdarg.h>
#ifndef FAKE_TAG
#define FAKE_TAG ""
#endif
static void note(const char *fmt, ...) {
    const char *path = getenv("FAKECUDA_LOG");
    if (!path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    fputs(FAKE_TAG, f);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fclose(f);
}

CUresult cuInit(unsigned int flags) { note("cuInit %u", flags); return CUDA_SUCCESS; }
CUresult cuDriverGetVersion(int *v) { note("cuDriverGetVersion"); *v = 12090; return CUDA_SUCCESS; }

/* v1 ABI (32-bit pointers), what version 2000 of "cuMemAlloc" resolves to. */
CUresult cuMemAlloc(unsigned int *p, unsigned int n) { note("cuMemAlloc n=%u", n); *p = 0x100; return CUDA_SUCCESS; }
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { note("cuMemAlloc_v2 n=%zu", n); *p = 0x10000 + n; return CUDA_SUCCESS; }
CUresult cuMemFree_v2(CUdeviceptr p) { note("cuMemFree_v2 p=%#llx", p); return CUDA_SUCCESS; }
CUresult cuDeviceTotalMem_v2(size_t *b, int dev) { note("cuDeviceTotalMem_v2 dev=%d", dev); *b = (size_t)80 << 30; return CUDA_SUCCESS; }

#define LAUNCH_ARGS void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
    unsigned bz, unsigned smem, void *stream, void **params, void **extra
#define LAUNCH_NOTE(name) note(name " f=%p grid=%u,%u,%u block=%u,%u,%u smem=%u stream=%p params=%p extra=%p", \
    f, gx, gy, gz, bx, by, bz, smem, stream, (void *)params, (void *)extra)
CUresult cuLaunchKernel(LAUNCH_ARGS) { LAUNCH_NOTE("cuLaunchKernel"); return CUDA_SUCCESS; }
CUresult cuLaunchKernel_ptsz(LAUNCH_ARGS) { LAUNCH_NOTE("cuLaunchKernel_ptsz"); return CUDA_SUCCESS; }

CUresult cuStreamSynchronize(void *s) { note("cuStreamSynchronize stream=%p", s); return CUDA_SUCCESS; }
CUresult cuStreamSynchronize_ptsz(void *s) { note("cuStreamSynchronize_ptsz stream=%p", s); return CUDA_SUCCESS; }
/* Returns a distinctive error so tests can see return codes pass through. */
CUresult cuCtxSynchronize(void) { note("cuCtxSynchronize"); return 719u; /* LAUNCH_FAILED */ }

CUresult cuGetProcAddress(const char *, void **, int, uint64_t);
CUresult cuGetProcAddress_v2(const char *, void **, int, uint64_t, int *);

struct entry { const char *name; int since; void *fn; void *fn_ptsz; };
static const struct entry table[] = {
    {"cuInit", 2000, (void *)cuInit, 0},
    {"cuDriverGetVersion", 2020, (void *)cuDriverGetVersion, 0},
    {"cuGetProcAddress", 11030, (void *)cuGetProcAddress, 0},
    {"cuGetProcAddress", 12000, (void *)cuGetProcAddress_v2, 0},
    {"cuMemAlloc", 2000, (void *)cuMemAlloc, 0},
    {"cuMemAlloc", 3020, (void *)cuMemAlloc_v2, 0},
    {"cuMemFree", 3020, (void *)cuMemFree_v2, 0},
    {"cuDeviceTotalMem", 3020, (void *)cuDeviceTotalMem_v2, 0},
    {"cuLaunchKernel", 4000, (void *)cuLaunchKernel, (void *)cuLaunchKernel_ptsz},
    {"cuStreamSynchronize", 2000, (void *)cuStreamSynchronize, (void *)cuStreamSynchronize_ptsz},
    {"cuCtxSynchronize", 2000, (void *)cuCtxSynchronize, 0},
};

CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, uint64_t flags, int *status) {
    const struct entry *best = 0;
    int known = 0;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(table[i].name, sym) != 0) continue;
        known = 1;
        if (table[i].since <= ver && (!best || table[i].since > best->since)) best = &table[i];
    }
    if (!best) {
        *pfn = 0;
        if (status) *status = known ? 2 /* VERSION_NOT_SUFFICIENT */ : 1 /* SYMBOL_NOT_FOUND */;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = (flags & 2) && best->fn_ptsz ? best->fn_ptsz : best->fn;
    if (status) *status = 0;
    return CUDA_SUCCESS;
}

CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, uint64_t flags) {
    return cuGetProcAddress_v2(sym, pfn, ver, flags, 0);
}
