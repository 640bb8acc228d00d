#include "backend_modes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int index_of(const char *const *names, const char *s)
{
    for (int i = 0; names[i]; i++)
        if (!strcmp(names[i], s)) return i;
    return -1;
}

static void expected(char *err, size_t errlen, const char *var, const char *val,
                     const char *const *names)
{
    int n = snprintf(err, errlen, "%s=%s: expected one of ", var, val);
    for (int i = 0; names[i] && n >= 0 && (size_t)n < errlen; i++)
        n += snprintf(err + n, errlen - (size_t)n, "%s%s", i ? ", " : "", names[i]);
}

static int env_name(const char *var, const char *const *names, int *out, char *err,
                    size_t errlen)
{
    const char *v = getenv(var);
    if (!v || !*v) return 0;
    int i = index_of(names, v);
    if (i < 0) {
        expected(err, errlen, var, v, names);
        return -1;
    }
    *out = i;
    return 0;
}

int backend_modes_env(backend_modes *m, char *err, size_t errlen)
{
    if (env_name("LLM_CUDA_GEMM", backend_gemm_names, &m->gemm, err, errlen)
        || env_name("LLM_CUDA_MOE", backend_moe_names, &m->moe, err, errlen))
        return -1;
    const char *v = getenv("LLM_CUDA_ATTN_TOKENS");
    if (v && *v) {
        char *end;
        long t = strtol(v, &end, 10);
        if (*end || t < 1 || t > BACKEND_ATTN_TOKENS_MAX) {
            snprintf(err, errlen, "LLM_CUDA_ATTN_TOKENS=%s: expected 1 to %d", v,
                     BACKEND_ATTN_TOKENS_MAX);
            return -1;
        }
        m->attn_tokens = (int)t;
    }
    return 0;
}

void backend_modes_describe(const backend_modes *m, char *out, size_t len)
{
    snprintf(out, len, "gemm_mode=%s moe_kernel=%s attn_tokens=%d",
             backend_gemm_names[m->gemm], backend_moe_names[m->moe], m->attn_tokens);
}
