// A launch loop for counting instructions per launch under callgrind
// (scripts/launch-instructions.sh). As bench/benches/overhead.rs does, it
// dlopens simgpu and the interposer RTLD_LOCAL, sets up a context and the
// no-op kernel through simgpu, then launches through one of them: WARM
// launches in warm_up() (not counted), N in measured() (counted with
// callgrind's --toggle-collect=measured).
//
// usage: launch_loop direct|dilu WARM N   (SIMGPU_LIB, DILU_LIB: the libraries)
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void *, void **, void **);
typedef int (*init_t)(unsigned);
typedef int (*retain_t)(void **, int);
typedef int (*set_current_t)(void *);
typedef int (*module_load_t)(void **, const void *);
typedef int (*get_function_t)(void **, void *, const char *);

static void *open_library(const char *variable) {
    const char *path = getenv(variable);
    void *handle = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!handle) {
        fprintf(stderr, "launch_loop: %s: %s\n", variable, path ? dlerror() : "not set");
        exit(1);
    }
    return handle;
}

static void *symbol(void *handle, const char *name) {
    void *address = dlsym(handle, name);
    if (!address) {
        fprintf(stderr, "launch_loop: no %s\n", name);
        exit(1);
    }
    return address;
}

static long launches(launch_t launch, void *function, long n) {
    long failed = 0;
    for (long i = 0; i < n; i++)
        failed += launch(function, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) != 0;
    return failed;
}

__attribute__((noinline)) long warm_up(launch_t launch, void *function, long n) {
    return launches(launch, function, n);
}

__attribute__((noinline)) long measured(launch_t launch, void *function, long n) {
    return launches(launch, function, n);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: launch_loop direct|dilu WARM N\n");
        return 2;
    }
    void *direct = open_library("SIMGPU_LIB");
    void *dilu = open_library("DILU_LIB");
    void *context = NULL, *module = NULL, *function = NULL;
    const char *ptx =
        ".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry noop()\n{\n ret;\n}\n";
    if (((init_t)symbol(direct, "cuInit"))(0) ||
        ((retain_t)symbol(direct, "cuDevicePrimaryCtxRetain"))(&context, 0) ||
        ((set_current_t)symbol(direct, "cuCtxSetCurrent"))(context) ||
        ((module_load_t)symbol(direct, "cuModuleLoadData"))(&module, ptx) ||
        ((get_function_t)symbol(direct, "cuModuleGetFunction"))(&function, module, "noop")) {
        fprintf(stderr, "launch_loop: set-up through simgpu failed\n");
        return 1;
    }
    void *side = strcmp(argv[1], "direct") == 0 ? direct : dilu;
    launch_t launch = (launch_t)symbol(side, "cuLaunchKernel");
    long failed = warm_up(launch, function, atol(argv[2]));
    failed += measured(launch, function, atol(argv[3]));
    if (failed) {
        fprintf(stderr, "launch_loop: %ld launches failed\n", failed);
        return 1;
    }
    return 0;
}
