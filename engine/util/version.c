#include "version.h"

#include <stdio.h>

#ifndef LLM_GIT_REV
#define LLM_GIT_REV "unknown"
#endif

const char *llm_engine_build(void)
{
    static char buf[160];
    if (!buf[0])
        snprintf(buf, sizeof buf, "%s (git %s, gcc %s, %s)", LLM_ENGINE_VERSION,
                 LLM_GIT_REV, __VERSION__,
#ifdef LLM_HAVE_CUDA
                 "cuda"
#else
                 "cpu only"
#endif
        );
    return buf;
}
