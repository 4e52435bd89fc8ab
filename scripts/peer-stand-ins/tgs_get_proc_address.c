/*
 * cuGetProcAddress for TGS's hijack libraries, which export none: CUDA 12's
 * runtime finds every driver function through it, and without it either
 * fails or reaches the driver past TGS. Written here, compiled into TGS's
 * libcuda.so.1 by scripts/build-peers.sh. It asks the real driver (the
 * library TGS itself opens, libcuda.so.<driver_version>), names the
 * function the driver returns (dladdr), and hands back this library's
 * function of that name where TGS defines one, else the driver's.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>

typedef int CUresult;
typedef unsigned long long cuuint64_t;
typedef int CUdriverProcAddressQueryResult;

#define CUDA_ERROR_NOT_FOUND 500

/* TGS's loader: the version part of the real driver's file name. */
extern char driver_version[];

typedef CUresult (*GetProcAddress)(const char *, void **, int, cuuint64_t);
typedef CUresult (*GetProcAddressV2)(const char *, void **, int, cuuint64_t,
                                     CUdriverProcAddressQueryResult *);

static void *real_driver(void) {
  static void *handle;
  if (!handle) {
    char name[256];
    snprintf(name, sizeof name, "libcuda.so.%s", driver_version);
    handle = dlopen(name, RTLD_NOW | RTLD_NODELETE);
  }
  return handle;
}

/* This library's own handle and load address. */
static void *own_library(void **base) {
  static void *handle, *own_base;
  if (!handle) {
    Dl_info info;
    if (dladdr((void *)&own_library, &info) && info.dli_fname) {
      handle = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
      own_base = info.dli_fbase;
    }
  }
  *base = own_base;
  return handle;
}

/* TGS's function of the name the driver's `found` has, if TGS has one. */
static void *through_tgs(void *found) {
  void *base, *own = own_library(&base);
  Dl_info info;
  if (!found || !own || !dladdr(found, &info) || !info.dli_sname) return found;
  void *hijack = dlsym(own, info.dli_sname);
  Dl_info where;
  /* dlsym on a handle also searches the library's dependencies. */
  if (hijack && dladdr(hijack, &where) && where.dli_fbase == base) return hijack;
  return found;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version,
                             cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
  void *driver = real_driver();
  GetProcAddressV2 real =
      driver ? (GetProcAddressV2)dlsym(driver, "cuGetProcAddress_v2") : NULL;
  if (!real) return CUDA_ERROR_NOT_FOUND;
  CUresult result = real(symbol, pfn, cuda_version, flags, status);
  if (result == 0 && pfn) *pfn = through_tgs(*pfn);
  return result;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version,
                          cuuint64_t flags) {
  void *driver = real_driver();
  GetProcAddress real =
      driver ? (GetProcAddress)dlsym(driver, "cuGetProcAddress") : NULL;
  if (!real) return CUDA_ERROR_NOT_FOUND;
  CUresult result = real(symbol, pfn, cuda_version, flags);
  if (result == 0 && pfn) *pfn = through_tgs(*pfn);
  return result;
}
