/* A stand-in libnvidia-ml.so.1 for the agent's tests (no GPU or driver here): NOT NVIDIA's library.
 *
 * The prototypes are written from NVIDIA's public NVML API reference, not taken from nvml.h:
 *   nvmlReturn_t nvmlInit_v2(void);
 *   nvmlReturn_t nvmlShutdown(void);
 *   nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount);
 *   nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
 *   nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
 *                                                        nvmlProcessInfo_t *infos);
 * with nvmlProcessInfo_t { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId;
 * unsigned int computeInstanceId; }, NVML_SUCCESS 0, NVML_ERROR_UNINITIALIZED 1, NVML_ERROR_INVALID_ARGUMENT 2,
 * NVML_ERROR_INSUFFICIENT_SIZE 7 (infoCount then says how many there are).
 *
 * What it reports comes from the file named by GPUFLAME_STANDIN_NVML, read at each call: one line per
 * process and device, "DEVICE PID BYTES".
 */
#include <stdio.h>
#include <stdlib.h>

typedef int nvmlReturn_t;
typedef struct standin_device *nvmlDevice_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

#define MAX_LINES 256
static int initialised;
static struct standin_device { unsigned int index; } devices[8];

static int read_lines(unsigned int dev[], unsigned int pid[], unsigned long long bytes[])
{
    const char *path = getenv("GPUFLAME_STANDIN_NVML");
    FILE *f = path ? fopen(path, "r") : NULL;
    int n = 0;
    if (!f)
        return 0;
    while (n < MAX_LINES && fscanf(f, "%u %u %llu", &dev[n], &pid[n], &bytes[n]) == 3)
        if (dev[n] < 8)
            n++;
    fclose(f);
    return n;
}

nvmlReturn_t nvmlInit_v2(void)
{
    initialised = 1;
    return 0;
}

nvmlReturn_t nvmlShutdown(void)
{
    if (!initialised)
        return 1;
    initialised = 0;
    return 0;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    unsigned int dev[MAX_LINES], pid[MAX_LINES], count = 1;
    unsigned long long bytes[MAX_LINES];
    if (!initialised)
        return 1;
    for (int i = 0, n = read_lines(dev, pid, bytes); i < n; i++)
        if (dev[i] + 1 > count)
            count = dev[i] + 1;
    *deviceCount = count;
    return 0;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!initialised)
        return 1;
    if (index >= 8)
        return 2;
    devices[index].index = index;
    *device = &devices[index];
    return 0;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    unsigned int dev[MAX_LINES], pid[MAX_LINES], found = 0;
    unsigned long long bytes[MAX_LINES];
    if (!initialised)
        return 1;
    int n = read_lines(dev, pid, bytes);
    for (int i = 0; i < n; i++) {
        if (dev[i] != device->index)
            continue;
        if (found < *infoCount) {
            infos[found].pid = pid[i];
            infos[found].usedGpuMemory = bytes[i];
            infos[found].gpuInstanceId = 0xFFFFFFFF;
            infos[found].computeInstanceId = 0xFFFFFFFF;
        }
        found++;
    }
    if (found > *infoCount) {
        *infoCount = found;
        return 7;
    }
    *infoCount = found;
    return 0;
}
