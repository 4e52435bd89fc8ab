/* A client of NVIDIA's own runtime (libcudart.so.12 or .so.13), built
 * without CUDA headers or nvcc: it declares the few runtime prototypes it
 * uses and registers a fatbin (made by the test, read from a file) the way
 * nvcc-generated code does, then uses the runtime like a small program.
 *
 *   cudart_client FATBIN basic         every feature once, one JSON line
 *   cudart_client FATBIN alloc BYTES   one cudaMalloc of BYTES, then a small one
 *   cudart_client FATBIN loop N        N launches of the kernel, synchronised
 *
 * Every step's error is reported by name; the exit status is 0 only when
 * all steps the mode expects to succeed did. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int cudaError_t;
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef struct {
    unsigned x, y, z;
} dim3;

enum { H2D = 1, D2H = 2 };

cudaError_t cudaGetDeviceCount(int *);
cudaError_t cudaDriverGetVersion(int *);
cudaError_t cudaRuntimeGetVersion(int *);
cudaError_t cudaMalloc(void **, size_t);
cudaError_t cudaFree(void *);
cudaError_t cudaMemcpy(void *, const void *, size_t, int);
cudaError_t cudaMemGetInfo(size_t *, size_t *);
cudaError_t cudaMallocAsync(void **, size_t, cudaStream_t);
cudaError_t cudaFreeAsync(void *, cudaStream_t);
cudaError_t cudaStreamCreate(cudaStream_t *);
cudaError_t cudaStreamSynchronize(cudaStream_t);
cudaError_t cudaStreamDestroy(cudaStream_t);
cudaError_t cudaEventCreate(cudaEvent_t *);
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t);
cudaError_t cudaEventSynchronize(cudaEvent_t);
cudaError_t cudaEventElapsedTime(float *, cudaEvent_t, cudaEvent_t);
cudaError_t cudaEventDestroy(cudaEvent_t);
cudaError_t cudaLaunchKernel(const void *, dim3, dim3, void **, size_t, cudaStream_t);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaStreamBeginCapture(cudaStream_t, int);
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t *);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *, cudaGraph_t, unsigned long long);
cudaError_t cudaGraphLaunch(cudaGraphExec_t, cudaStream_t);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t);
cudaError_t cudaGraphDestroy(cudaGraph_t);
cudaError_t cudaMemcpyFromSymbol(void *, const void *, size_t, size_t, int);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorName(cudaError_t);

/* What nvcc's generated host code calls to register device code. */
void **__cudaRegisterFatBinary(void *);
void __cudaRegisterFatBinaryEnd(void **);
void __cudaUnregisterFatBinary(void **);
void __cudaRegisterFunction(void **, const char *, char *, const char *, int, void *, void *,
                            void *, void *, int *);
void __cudaRegisterVar(void **, char *, char *, const char *, int, size_t, int, int);

/* nvcc's __fatBinC_Wrapper_t. */
struct fatbin_wrapper {
    int magic;
    int version;
    const void *data;
    void *filename_or_fatbins;
};

/* Host-side handles: their addresses stand for the kernel and the variable. */
static char kernel_stub;
static char table_var[16];

static int failed;

static int check(const char *step, cudaError_t e) {
    if (e != 0) {
        printf("{\"failed\":\"%s\",\"code\":%d,\"name\":\"%s\"}\n", step, e, cudaGetErrorName(e));
        fflush(stdout);
        failed = 1;
    }
    return e == 0;
}

#define MUST(step, call)                                                                      \
    do {                                                                                      \
        if (!check(step, call))                                                               \
            return 1;                                                                         \
    } while (0)

static void *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = NULL;
    if (posix_memalign(&buf, 8, (size_t)n) != 0 || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        return NULL;
    }
    fclose(f);
    return buf;
}

static void **register_image(const char *path) {
    static struct fatbin_wrapper wrapper;
    wrapper.magic = 0x466243B1;
    wrapper.version = 1;
    wrapper.data = read_file(path);
    wrapper.filename_or_fatbins = NULL;
    if (!wrapper.data) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(2);
    }
    void **handle = __cudaRegisterFatBinary(&wrapper);
    __cudaRegisterFunction(handle, &kernel_stub, "add_one", "add_one", -1, NULL, NULL, NULL, NULL,
                           NULL);
    __cudaRegisterVar(handle, table_var, "table", "table", 0, sizeof table_var, 0, 0);
    __cudaRegisterFatBinaryEnd(handle);
    return handle;
}

static cudaError_t launch(float *data, int n, cudaStream_t s) {
    void *args[] = {&data, &n};
    dim3 grid = {(unsigned)(n + 255) / 256, 1, 1}, block = {256, 1, 1};
    return cudaLaunchKernel(&kernel_stub, grid, block, args, 0, s);
}

static int basic(void) {
    int devices = 0, driver = 0, runtime = 0;
    MUST("cudaGetDeviceCount", cudaGetDeviceCount(&devices));
    MUST("cudaDriverGetVersion", cudaDriverGetVersion(&driver));
    MUST("cudaRuntimeGetVersion", cudaRuntimeGetVersion(&runtime));

    enum { N = 1 << 18 };
    float *host = malloc(N * sizeof(float)), *back = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++)
        host[i] = (float)i * 0.5f;
    float *dev = NULL;
    MUST("cudaMalloc", cudaMalloc((void **)&dev, N * sizeof(float)));
    MUST("cudaMemcpy H2D", cudaMemcpy(dev, host, N * sizeof(float), H2D));
    memset(back, 0, N * sizeof(float));
    MUST("cudaMemcpy D2H", cudaMemcpy(back, dev, N * sizeof(float), D2H));
    int roundtrip = memcmp(host, back, N * sizeof(float)) == 0;

    size_t free_bytes = 0, total = 0;
    MUST("cudaMemGetInfo", cudaMemGetInfo(&free_bytes, &total));

    cudaStream_t s;
    MUST("cudaStreamCreate", cudaStreamCreate(&s));
    void *pooled = NULL;
    MUST("cudaMallocAsync", cudaMallocAsync(&pooled, 1 << 20, s));
    MUST("cudaFreeAsync", cudaFreeAsync(pooled, s));

    cudaEvent_t start, stop;
    MUST("cudaEventCreate", cudaEventCreate(&start));
    MUST("cudaEventCreate", cudaEventCreate(&stop));
    MUST("cudaEventRecord", cudaEventRecord(start, s));
    int launches = 0;
    for (int i = 0; i < 10; i++) {
        MUST("cudaLaunchKernel", launch(dev, N, s));
        launches++;
    }
    MUST("cudaEventRecord", cudaEventRecord(stop, s));
    MUST("cudaEventSynchronize", cudaEventSynchronize(stop));
    float ms = -1;
    MUST("cudaEventElapsedTime", cudaEventElapsedTime(&ms, start, stop));

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    MUST("cudaStreamBeginCapture", cudaStreamBeginCapture(s, 0));
    MUST("cudaLaunchKernel (captured)", launch(dev, N, s));
    MUST("cudaLaunchKernel (captured)", launch(dev, N, s));
    MUST("cudaStreamEndCapture", cudaStreamEndCapture(s, &graph));
    MUST("cudaGraphInstantiate", cudaGraphInstantiate(&exec, graph, 0));
    MUST("cudaGraphLaunch", cudaGraphLaunch(exec, s));
    MUST("cudaStreamSynchronize", cudaStreamSynchronize(s));
    MUST("cudaGraphExecDestroy", cudaGraphExecDestroy(exec));
    MUST("cudaGraphDestroy", cudaGraphDestroy(graph));

    unsigned char table[16];
    memset(table, 0, sizeof table);
    MUST("cudaMemcpyFromSymbol", cudaMemcpyFromSymbol(table, table_var, sizeof table, 0, D2H));
    int symbol_ok = 1;
    for (int i = 0; i < 16; i++)
        symbol_ok &= table[i] == (unsigned char)(i + 1);

    MUST("cudaEventDestroy", cudaEventDestroy(start));
    MUST("cudaEventDestroy", cudaEventDestroy(stop));
    MUST("cudaStreamDestroy", cudaStreamDestroy(s));
    MUST("cudaFree", cudaFree(dev));
    MUST("cudaDeviceSynchronize", cudaDeviceSynchronize());
    printf("{\"devices\":%d,\"driver\":%d,\"runtime\":%d,\"roundtrip\":%s,\"free\":%zu,"
           "\"total\":%zu,\"launches\":%d,\"elapsed_ms\":%.4f,\"graph\":true,\"symbol\":%s}\n",
           devices, driver, runtime, roundtrip ? "true" : "false", free_bytes, total, launches, ms,
           symbol_ok ? "true" : "false");
    return !(roundtrip && symbol_ok);
}

static int alloc(size_t bytes) {
    size_t free_before = 0, total = 0, free_after = 0;
    MUST("cudaMemGetInfo", cudaMemGetInfo(&free_before, &total));
    void *p = NULL;
    cudaError_t big = cudaMalloc(&p, bytes);
    if (big == 0)
        MUST("cudaFree", cudaFree(p));
    (void)cudaGetLastError(); /* clear the sticky-free error of a refusal */
    void *small = NULL;
    MUST("cudaMalloc small", cudaMalloc(&small, 1 << 20));
    MUST("cudaFree small", cudaFree(small));
    MUST("cudaMemGetInfo", cudaMemGetInfo(&free_after, &total));
    printf("{\"big\":%d,\"big_name\":\"%s\",\"free_before\":%zu,\"free_after\":%zu,"
           "\"total\":%zu}\n",
           big, cudaGetErrorName(big), free_before, free_after, total);
    return 0;
}

static int loop(int n) {
    enum { N = 1 << 16 };
    float *dev = NULL;
    MUST("cudaMalloc", cudaMalloc((void **)&dev, N * sizeof(float)));
    for (int i = 0; i < n; i++) {
        MUST("cudaLaunchKernel", launch(dev, N, NULL));
        if (i % 20 == 19)
            MUST("cudaDeviceSynchronize", cudaDeviceSynchronize());
    }
    MUST("cudaDeviceSynchronize", cudaDeviceSynchronize());
    MUST("cudaFree", cudaFree(dev));
    printf("{\"launches\":%d}\n", n);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s FATBIN basic|alloc BYTES|loop N\n", argv[0]);
        return 2;
    }
    void **handle = register_image(argv[1]);
    int rc;
    if (strcmp(argv[2], "basic") == 0)
        rc = basic();
    else if (strcmp(argv[2], "alloc") == 0 && argc > 3)
        rc = alloc(strtoull(argv[3], NULL, 10));
    else if (strcmp(argv[2], "loop") == 0 && argc > 3)
        rc = loop(atoi(argv[3]));
    else
        rc = 2;
    __cudaUnregisterFatBinary(handle);
    return rc || failed;
}
