// What the CUDA runtime sees: used by `llm-engine version` and by backend
// selection.  Safe on machines without a GPU (reports 0 devices).
#include <cuda_runtime.h>
#include <stdio.h>

#include "cuda/device_info.h"

extern "C" int llm_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no device" error
        return 0;
    }
    return n;
}

extern "C" int llm_cuda_device_name(int dev, char *buf, int len)
{
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) return -1;
    snprintf(buf, (size_t)len, "%s (sm_%d%d, %.1f GiB)", p.name, p.major, p.minor,
             p.totalGlobalMem / 1073741824.0);
    return 0;
}
