/* A stand-in for NVIDIA's libnvidia-ml.so.1, for tests: two GPUs on PCI
 * buses 0x18 and 0x19 (where simgpu's devices 0 and 1 sit), 80 GiB each,
 * with per-GPU usage so that a rewritten answer is never mistaken for the
 * real one. Layouts and version tags as in nvml.h. */
#include <stdio.h>
#include <string.h>

#include "nvml_types.h"

struct nvmlDevice_st {
    unsigned int bus;
    unsigned long long used;
};

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define TOTAL (80ULL << 30)
#define RESERVED (512ULL << 20)

static struct nvmlDevice_st gpus[2] = {{0x18, 10ULL << 30}, {0x19, 20ULL << 30}};
static int initialized;

static int valid(nvmlDevice_t d) {
    return initialized && (d == &gpus[0] || d == &gpus[1]);
}

nvmlReturn_t nvmlInit_v2(void) {
    initialized = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void) {
    initialized = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    *count = 2;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (index >= 2 || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &gpus[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    if (!valid(device) || !memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = TOTAL;
    memory->used = device->used + RESERVED; /* v1 counts the reserve as used */
    memory->free = TOTAL - memory->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    if (!valid(device) || !memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = TOTAL;
    memory->reserved = RESERVED;
    memory->used = device->used;
    memory->free = TOTAL - RESERVED - device->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    if (!valid(device) || !pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    pci->domain = 0;
    pci->bus = device->bus;
    pci->device = 0;
    snprintf(pci->busId, sizeof pci->busId, "00000000:%02X:00.0", device->bus);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02X:00.0", device->bus);
    return NVML_SUCCESS;
}
