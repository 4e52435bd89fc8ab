/* Asks NVML for every GPU's memory with nvmlDeviceGetMemoryInfo and _v2, the
 * way programs reach NVML: built with -DLINKED it calls the symbols it was
 * linked against (-lnvidia-ml); built without, it never links NVML and finds
 * everything with dlopen("libnvidia-ml.so.1") + dlsym, as PyTorch and pynvml
 * do. Before that it allocates device memory through the CUDA driver, so the
 * tenant has usage. One JSON line per GPU. Usage: nvml-client ALLOC_BYTES */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "nvml_types.h"

struct nvml {
    nvmlReturn_t (*init)(void);
    nvmlReturn_t (*count)(unsigned int *);
    nvmlReturn_t (*handle)(unsigned int, nvmlDevice_t *);
    nvmlReturn_t (*info)(nvmlDevice_t, nvmlMemory_t *);
    nvmlReturn_t (*info_v2)(nvmlDevice_t, nvmlMemory_v2_t *);
};

static void *must(void *handle, const char *name) {
    void *p = dlsym(handle, name);
    if (!p) {
        fprintf(stderr, "nvml-client: dlsym(%s) failed\n", name);
        exit(1);
    }
    return p;
}

#ifdef LINKED
nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int, nvmlDevice_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t, nvmlMemory_v2_t *);
static const char *VIA = "linked";
static struct nvml open_nvml(void) {
    struct nvml n = {nvmlInit_v2, nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2,
                     nvmlDeviceGetMemoryInfo, nvmlDeviceGetMemoryInfo_v2};
    return n;
}
#else
static const char *VIA = "dlsym";
static struct nvml open_nvml(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "nvml-client: cannot dlopen libnvidia-ml.so.1\n");
        exit(1);
    }
    struct nvml n;
    *(void **)&n.init = must(h, "nvmlInit_v2");
    *(void **)&n.count = must(h, "nvmlDeviceGetCount_v2");
    *(void **)&n.handle = must(h, "nvmlDeviceGetHandleByIndex_v2");
    *(void **)&n.info = must(h, "nvmlDeviceGetMemoryInfo");
    *(void **)&n.info_v2 = must(h, "nvmlDeviceGetMemoryInfo_v2");
    return n;
}
#endif

int main(int argc, char **argv) {
    unsigned long long bytes = argc > 1 ? strtoull(argv[1], NULL, 10) : 0;
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) {
        fprintf(stderr, "nvml-client: cannot dlopen libcuda.so.1\n");
        return 1;
    }
    int (*init)(unsigned int) = must(cuda, "cuInit");
    int (*retain)(void **, int) = must(cuda, "cuDevicePrimaryCtxRetain");
    int (*set_current)(void *) = must(cuda, "cuCtxSetCurrent");
    int (*alloc)(unsigned long long *, size_t) = must(cuda, "cuMemAlloc_v2");
    void *context = 0;
    unsigned long long pointer = 0;
    if (init(0) || retain(&context, 0) || set_current(context) || (bytes && alloc(&pointer, bytes))) {
        fprintf(stderr, "nvml-client: CUDA set-up failed\n");
        return 1;
    }
    struct nvml nvml = open_nvml();
    unsigned int count = 0;
    if (nvml.init() != 0 || nvml.count(&count) != 0) {
        fprintf(stderr, "nvml-client: NVML set-up failed\n");
        return 1;
    }
    for (unsigned int i = 0; i < count; i++) {
        nvmlDevice_t device;
        nvmlMemory_t m1 = {0};
        nvmlMemory_v2_t m2 = {.version = nvmlMemory_v2};
        if (nvml.handle(i, &device) != 0) {
            fprintf(stderr, "nvml-client: no handle for GPU %u\n", i);
            return 1;
        }
        int r1 = nvml.info(device, &m1);
        int r2 = nvml.info_v2(device, &m2);
        printf("{\"via\":\"%s\",\"index\":%u,\"v1\":{\"result\":%d,\"total\":%llu,\"free\":%llu,"
               "\"used\":%llu},\"v2\":{\"result\":%d,\"total\":%llu,\"reserved\":%llu,"
               "\"free\":%llu,\"used\":%llu}}\n",
               VIA, i, r1, m1.total, m1.free, m1.used, r2, m2.total, m2.reserved, m2.free,
               m2.used);
    }
    return 0;
}
