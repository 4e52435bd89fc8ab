/* Asks NVML for every GPU's memory before touching CUDA, forks, and uses CUDA
 * in the child (initialise, retain the primary context, allocate, set and
 * synchronise), as vLLM does when it forks its engine process after asking
 * NVML how big the GPU is. A driver initialised in the parent cannot be used
 * in the child, so this works only if nothing initialised CUDA on the
 * program's behalf before the fork. The parent uses CUDA afterwards too.
 * Prints one JSON line per step; exit status 0 when every step succeeded.
 * Usage: nvml-fork ALLOC_BYTES */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nvml_types.h"

static void *must(void *handle, const char *name) {
    void *p = dlsym(handle, name);
    if (!p) {
        fprintf(stderr, "nvml-fork: dlsym(%s) failed\n", name);
        exit(1);
    }
    return p;
}

/* Every CUDA step in order; prints the first failing call's status. */
static int use_cuda(const char *who, size_t bytes) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) {
        fprintf(stderr, "nvml-fork: cannot dlopen libcuda.so.1\n");
        return 1;
    }
    int (*init)(unsigned int) = must(cuda, "cuInit");
    int (*retain)(void **, int) = must(cuda, "cuDevicePrimaryCtxRetain");
    int (*set_current)(void *) = must(cuda, "cuCtxSetCurrent");
    int (*alloc)(unsigned long long *, size_t) = must(cuda, "cuMemAlloc_v2");
    int (*set)(unsigned long long, unsigned char, size_t) = must(cuda, "cuMemsetD8_v2");
    int (*sync)(void) = must(cuda, "cuCtxSynchronize");
    int (*free_)(unsigned long long) = must(cuda, "cuMemFree_v2");
    void *context = 0;
    unsigned long long pointer = 0;
    const char *step = "cuInit";
    int r = init(0);
    if (!r) step = "cuDevicePrimaryCtxRetain", r = retain(&context, 0);
    if (!r) step = "cuCtxSetCurrent", r = set_current(context);
    if (!r) step = "cuMemAlloc_v2", r = alloc(&pointer, bytes);
    if (!r) step = "cuMemsetD8_v2", r = set(pointer, 7, bytes);
    if (!r) step = "cuCtxSynchronize", r = sync();
    if (!r) step = "cuMemFree_v2", r = free_(pointer);
    printf("{\"step\":\"cuda\",\"who\":\"%s\",\"failed_at\":\"%s\",\"result\":%d}\n", who,
           r ? step : "", r);
    fflush(stdout);
    return r != 0;
}

int main(int argc, char **argv) {
    size_t bytes = argc > 1 ? strtoull(argv[1], NULL, 10) : (1 << 20);
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "nvml-fork: cannot dlopen libnvidia-ml.so.1\n");
        return 1;
    }
    nvmlReturn_t (*nvml_init)(void) = must(h, "nvmlInit_v2");
    nvmlReturn_t (*count)(unsigned int *) = must(h, "nvmlDeviceGetCount_v2");
    nvmlReturn_t (*handle)(unsigned int, nvmlDevice_t *) = must(h, "nvmlDeviceGetHandleByIndex_v2");
    nvmlReturn_t (*info)(nvmlDevice_t, nvmlMemory_t *) = must(h, "nvmlDeviceGetMemoryInfo");
    unsigned int gpus = 0;
    int r = nvml_init();
    if (!r) r = count(&gpus);
    for (unsigned int i = 0; !r && i < gpus; i++) {
        nvmlDevice_t device;
        nvmlMemory_t memory = {0};
        r = handle(i, &device);
        if (!r) r = info(device, &memory);
        printf("{\"step\":\"nvml\",\"index\":%u,\"result\":%d,\"total\":%llu,\"free\":%llu}\n", i,
               r, memory.total, memory.free);
    }
    fflush(stdout);
    if (r || gpus == 0) return 1;
    pid_t child = fork();
    if (child < 0) {
        perror("nvml-fork: fork");
        return 1;
    }
    if (child == 0) _exit(use_cuda("child", bytes));
    int status = 0;
    if (waitpid(child, &status, 0) != child) {
        perror("nvml-fork: waitpid");
        return 1;
    }
    int child_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    int parent_ok = use_cuda("parent", bytes) == 0;
    return child_ok && parent_ok ? 0 : 1;
}
