/* llm-engine version: build identity and the devices this build can use. */
#include <stdio.h>

#include "cli.h"
#include "version.h"
#ifdef LLM_HAVE_CUDA
#include "cuda/device_info.h"
#endif

int cmd_version(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("llm-engine %s\n", llm_engine_build());
#ifdef LLM_HAVE_CUDA
    int n = llm_cuda_device_count();
    printf("cuda devices: %d\n", n);
    for (int i = 0; i < n; i++) {
        char name[128];
        if (llm_cuda_device_name(i, name, sizeof name) == 0) printf("  %d: %s\n", i, name);
    }
#else
    printf("cuda: not compiled in (built with CUDA=0 or without nvcc)\n");
#endif
    return 0;
}
