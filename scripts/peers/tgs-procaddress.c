/*
 * A stand-in written for dilu (not TGS code): cuGetProcAddress and
 * cuGetProcAddress_v2 for TGS's hijack library, which exports neither.
 * scripts/peers/tgs.sh compiles this file into each hijack library beside
 * TGS's own sources.
 *
 * TGS (pkusys/TGS, 2023) hooks the driver by exporting the driver's
 * functions under their ABI names. Clients that look functions up through
 * cuGetProcAddress (NVIDIA's cudart since 11.3, and 12.x for everything)
 * would otherwise get the driver's own pointers: cudart 12 finds no
 * cuGetProcAddress_v2 at all, and with the hijack linked to the driver
 * (tgs.sh) it would find the driver's and bypass TGS without a word.
 *
 * Each look-up goes to the driver (TGS_DRIVER_LIBRARY, the name tgs.sh
 * links the hijack against); the driver's answer is named with dladdr, and
 * where the hijack library exports a function of that exact name (TGS's
 * hook or pass-through), its pointer is returned instead. Asking for
 * "cuGetProcAddress" itself thus yields these wrappers.
 */
#include <dlfcn.h>
#include <stddef.h>

#ifndef TGS_DRIVER_LIBRARY
#define TGS_DRIVER_LIBRARY "libcuda.so.450.51.06"
#endif

typedef int CUresult;
typedef unsigned long long cuuint64_t;
typedef int CUdriverProcAddressQueryResult;
typedef CUresult (*get_proc_address_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*get_proc_address_v2_fn)(const char *, void **, int, cuuint64_t,
                                           CUdriverProcAddressQueryResult *);

#define CUDA_ERROR_NOT_FOUND 500

/* The driver's handle, or NULL (it is a dependency of this library, so
 * RTLD_NOLOAD finds it already loaded). */
static void *driver(void) {
  static void *handle;
  void *h = __atomic_load_n(&handle, __ATOMIC_ACQUIRE);
  if (h == NULL) {
    h = dlopen(TGS_DRIVER_LIBRARY, RTLD_NOW | RTLD_NOLOAD);
    __atomic_store_n(&handle, h, __ATOMIC_RELEASE);
  }
  return h;
}

/* This library's own handle: a dlsym on it looks here first. */
static void *self(void) {
  static void *handle;
  void *h = __atomic_load_n(&handle, __ATOMIC_ACQUIRE);
  if (h == NULL) {
    Dl_info info;
    if (dladdr((void *)&self, &info) && info.dli_fname != NULL) {
      h = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    }
    __atomic_store_n(&handle, h, __ATOMIC_RELEASE);
  }
  return h;
}

/* The hijack's export of the driver function at `fn`, or `fn`. */
static void *prefer_hijack(void *fn) {
  Dl_info info;
  void *d = driver(), *s = self(), *ours;
  if (fn == NULL || d == NULL || s == NULL) return fn;
  if (!dladdr(fn, &info) || info.dli_sname == NULL) return fn;
  /* The name must be the driver's export at exactly this address. */
  if (dlsym(d, info.dli_sname) != fn) return fn;
  ours = dlsym(s, info.dli_sname);
  return ours != NULL ? ours : fn;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus) {
  void *d = driver();
  get_proc_address_v2_fn real =
      d != NULL ? (get_proc_address_v2_fn)dlsym(d, "cuGetProcAddress_v2") : NULL;
  if (real == NULL) return CUDA_ERROR_NOT_FOUND;
  CUresult result = real(symbol, pfn, cudaVersion, flags, symbolStatus);
  if (result == 0 && pfn != NULL) *pfn = prefer_hijack(*pfn);
  return result;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
  void *d = driver();
  get_proc_address_fn real = d != NULL ? (get_proc_address_fn)dlsym(d, "cuGetProcAddress") : NULL;
  if (real == NULL) return CUDA_ERROR_NOT_FOUND;
  CUresult result = real(symbol, pfn, cudaVersion, flags);
  if (result == 0 && pfn != NULL) *pfn = prefer_hijack(*pfn);
  return result;
}
