/* Recipe loader: the shipped recipes load; each class of mistake is
 * reported as FILE:LINE: KEY: reason. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend_modes.h"
#include "ipc/llm_ipc.h"
#include "recipe.h"
#include "tap.h"

static char tmpdir[] = "/tmp/llm-test-recipe-XXXXXX";

/* Write text to a temporary recipe, load it, return the problem count and
 * the error text in errs. */
static int load_text(const char *text, recipe *r, strbuf *errs)
{
    char path[256];
    snprintf(path, sizeof path, "%s/r.yaml", tmpdir);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    sb_reset(errs);
    return recipe_load(r, path, errs);
}

static void expect_error(const char *text, const char *want, const char *what)
{
    recipe r;
    strbuf e;
    sb_init(&e);
    int n = load_text(text, &r, &e);
    int found = e.data && strstr(e.data, want) != NULL;
    ok(n > 0 && found, "%s", what);
    if (!found) diag("errors were:\n%s\nwanted: %s", e.data ? e.data : "(none)", want);
    recipe_free(&r);
    sb_free(&e);
}

#define BASE "model:\n  path: /m\nmax_model_len: 1024\n"

int main(void)
{
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }

    const char *shipped[] = {
        "conf/recipes/r33-control-131k.yaml", "conf/recipes/r33-candidate-393k.yaml",
        "conf/recipes/v4-flash-1m.yaml", "conf/recipes/tiny-demo.yaml",
        "conf/recipes/v4-flash-6l-1gpu.yaml",
    };
    for (size_t i = 0; i < sizeof shipped / sizeof *shipped; i++) {
        recipe r;
        strbuf e;
        sb_init(&e);
        int n = recipe_load(&r, shipped[i], &e);
        ok(n == 0, "%s loads", shipped[i]);
        if (n) diag("%s", e.data);
        recipe_free(&r);
        sb_free(&e);
    }

    /* the r33 control carries exactly the report's settings */
    {
        recipe r;
        strbuf e;
        sb_init(&e);
        recipe_load(&r, "conf/recipes/r33-control-131k.yaml", &e);
        is_int(r.tensor_parallel_size, 2, "control: tensor_parallel_size 2");
        is_int(r.max_model_len, 131072, "control: max_model_len 131072");
        is_int(r.max_num_seqs, 1, "control: max_num_seqs 1");
        is_int(r.max_num_batched_tokens, 8192, "control: max_num_batched_tokens 8192");
        ok(r.gpu_memory_utilization == 0.975, "control: gpu_memory_utilization 0.975");
        is_int(r.kv_cache_dtype, KV_DTYPE_FP8, "control: fp8 KV");
        is_int(r.backend, BACKEND_CUDA, "control: CUDA backend");
        ok(r.speculative_method == NULL, "control: no speculative decoding");
        recipe_free(&r);
        recipe_load(&r, "conf/recipes/r33-candidate-393k.yaml", &e);
        is_int(r.max_model_len, 393216, "candidate: max_model_len 393216");
        ok(r.kv_offloading_size == 16.0 && !r.kv_offloading_filesystem,
           "candidate: 16 GiB host tier, filesystem off");
        recipe_free(&r);
        sb_free(&e);
    }

    /* defaults and path resolution */
    {
        recipe r;
        strbuf e;
        sb_init(&e);
        int n = load_text("model:\n  path: ckpt\nmax_model_len: 2_048\n", &r, &e);
        is_int(n, 0, "minimal recipe is valid");
        is_int(r.max_model_len, 2048, "YAML 1.1 underscores in integers");
        char want[300];
        snprintf(want, sizeof want, "%s/ckpt", tmpdir);
        is_str(r.model_path, want, "relative model.path resolves against the recipe dir");
        is_str(r.served_model_name[0], "ckpt", "served name defaults to the model dir");
        is_str(r.name, "r", "engine name defaults to the file name");
        ok(r.enable_prefix_caching, "prefix caching is on by default");
        recipe_free(&r);
        n = load_text(BASE "kv_cache_memory_bytes: 1.5GiB\n", &r, &e);
        ok(n == 0 && r.kv_cache_memory_bytes == 1610612736LL, "sizes with units");
        recipe_free(&r);
        n = load_text(BASE "enable_prefix_caching: false\n", &r, &e);
        ok(n == 0 && !r.enable_prefix_caching, "enable_prefix_caching: false turns it off");
        recipe_free(&r);
        sb_free(&e);
    }

    expect_error(BASE "max_num_seqs: many\n", "r.yaml:4: max_num_seqs: expected an integer",
                 "wrong type: max_num_seqs: many");
    expect_error(BASE "tensor_parallel_size: 0\n",
                 "r.yaml:4: tensor_parallel_size: must be between 1 and 64",
                 "impossible value: tensor_parallel_size 0");
    expect_error(BASE "gpu_memory_utilization: 1.5\n",
                 "r.yaml:4: gpu_memory_utilization: must be in (0, 1]",
                 "impossible value: gpu_memory_utilization 1.5");
    expect_error(BASE "gpu_memory_utilization: 0\n", "gpu_memory_utilization: must be in (0, 1]",
                 "impossible value: gpu_memory_utilization 0");
    expect_error(BASE "max_num_sequences: 4\n", "r.yaml:4: max_num_sequences: unknown key",
                 "unknown key");
    expect_error("model:\n  path: /m\n  revision: main\nmax_model_len: 8\n",
                 "r.yaml:3: model.revision: unknown key", "unknown nested key");
    expect_error(BASE "max_model_len: 8\n", "r.yaml:4: max_model_len: duplicate key",
                 "duplicate key");
    expect_error(BASE "kv_cache_dtype: fp4\n", "kv_cache_dtype: expected one of auto, bf16, fp8",
                 "bad enum value");
    expect_error(BASE "gemm_mode: fp16\n", "gemm_mode: expected one of bf16x2, bf16, f32, fp8, got 'fp16'",
                 "bad gemm_mode");
    expect_error(BASE "moe_kernel: fast\n", "moe_kernel: expected one of grouped, cublaslt",
                 "bad moe_kernel");
    expect_error(BASE "attn_tokens: 3\n", "attn_tokens: must be between 1 and 2, got 3",
                 "bad attn_tokens");
    expect_error(BASE "backend: tpu\n", "backend: expected one of cpu, cuda", "bad backend");
    expect_error(BASE "model: x\n", "model: duplicate key", "duplicate mapping key");
    expect_error("max_model_len: 8\n", "model.path: missing", "missing model.path");
    expect_error("model:\n  path: /m\n", "max_model_len: missing", "missing max_model_len");
    expect_error(BASE "max_model_len2: [1,\n", "r.yaml:5: YAML syntax error", "YAML syntax error");
    expect_error("- a\n- b\n", "r.yaml:1: (top): a recipe is a YAML mapping", "top level not a mapping");
    expect_error(BASE "kv_offloading_filesystem: maybe\n",
                 "kv_offloading_filesystem: expected true or false", "bad bool");
    expect_error(BASE "kv_offloading_size: 1\nkv_offloading_filesystem: true\n",
                 "kv_offloading_path: missing", "a disk tier needs its directory");
    expect_error(BASE "kv_offloading_filesystem: true\nkv_offloading_path: /tmp/x\n",
                 "kv_offloading_filesystem: needs the host tier", "a disk tier needs a host tier");
    expect_error(BASE "kv_offloading_size: 1\nkv_offloading_filesystem: true\n"
                 "kv_offloading_path: /tmp/x\nkv_offloading_filesystem_size: 0\n",
                 "kv_offloading_filesystem_size:", "a disk tier of 0 GiB");
    expect_error(BASE "enable_prefix_caching: 1\n",
                 "r.yaml:4: enable_prefix_caching: expected true or false", "bad prefix caching bool");
    expect_error(BASE "kv_cache_memory_bytes: lots\n", "kv_cache_memory_bytes: expected a size",
                 "bad size");
    expect_error(BASE "speculative_config:\n  method: mtp\n  num_speculative_tokens: 1\n",
                 "r.yaml:4: speculative_config: speculative decoding (mtp) is not supported",
                 "speculative decoding refused, not ignored");
    expect_error(BASE "override_generation_config:\n  temperature: hot\n",
                 "r.yaml:5: override_generation_config.temperature: expected a number",
                 "nested wrong type");
    expect_error(BASE "default_chat_template_kwargs:\n  reasoning_effort: extreme\n",
                 "default_chat_template_kwargs.reasoning_effort: expected one of low, high, max",
                 "bad reasoning effort");
    expect_error(BASE "max_num_seqs: 4\nslots: 4\n",
                 "slots: must be at least max_num_seqs + 1 (5: a slot for health probes), got 4",
                 "a slot beyond max_num_seqs for probes");
    expect_error(BASE "max_num_seqs: 8\nslots: 4\n", "slots: must be at least max_num_seqs",
                 "relation between keys");
    {
        char text[400], name[LLM_IPC_MODEL_MAX + 1];
        memset(name, 'x', LLM_IPC_MODEL_MAX);
        name[LLM_IPC_MODEL_MAX] = 0;
        snprintf(text, sizeof text, "model:\n  path: /m\n  served_model_name: %s\n"
                 "max_model_len: 1024\n", name);
        expect_error(text, "model.served_model_name: 'xxxxxxxx",
                     "a served name longer than the segment header holds is refused");
    }
    expect_error(BASE "name: a/b\n", "name: 'a/b' must be 1 to 63 letters", "engine name is a safe file name");
    expect_error(BASE "model:\n  - 1\n", "model: duplicate key", "duplicates reported once");
    expect_error("model:\n  - 1\nmax_model_len: 3\n", "r.yaml:2: model: expected a mapping",
                 "mapping expected");
    /* Output-changing backend modes are recipe keys, and system_fingerprint
     * follows them and their environment overrides. */
    {
        recipe r;
        strbuf e;
        sb_init(&e);
        ok(load_text(BASE "gemm_mode: f32\nmoe_kernel: cublaslt\nattn_tokens: 2\n", &r, &e) == 0
           && r.modes.gemm == BACKEND_GEMM_F32 && r.modes.moe == BACKEND_MOE_CUBLASLT
           && r.modes.attn_tokens == 2, "gemm_mode, moe_kernel, attn_tokens");
        recipe_free(&r);
        ok(load_text(BASE "backend: cuda\n", &r, &e) == 0 && r.modes.gemm == BACKEND_GEMM_BF16X2
           && r.modes.moe == BACKEND_MOE_GROUPED && r.modes.attn_tokens == 1,
           "defaults: bf16x2, grouped, 1");
        char fa[LLM_IPC_FINGERPRINT], fb[LLM_IPC_FINGERPRINT];
        backend_modes m = r.modes;
        recipe_fingerprint(&r, &m, fa, sizeof fa);
        m.gemm = BACKEND_GEMM_F32;
        recipe_fingerprint(&r, &m, fb, sizeof fb);
        ok(strcmp(fa, fb) != 0, "cuda: system_fingerprint changes with gemm_mode (%s, %s)", fa, fb);
        m = r.modes;
        m.moe = BACKEND_MOE_CUBLASLT;
        recipe_fingerprint(&r, &m, fb, sizeof fb);
        ok(strcmp(fa, fb) != 0, "cuda: ... with moe_kernel");
        m = r.modes;
        m.attn_tokens = 2;
        recipe_fingerprint(&r, &m, fb, sizeof fb);
        ok(strcmp(fa, fb) != 0, "cuda: ... with attn_tokens");
        r.backend = BACKEND_CPU;          /* the float32 reference computes them exactly */
        recipe_fingerprint(&r, &r.modes, fa, sizeof fa);
        recipe_fingerprint(&r, &m, fb, sizeof fb);
        is_str(fa, fb, "cpu: the modes do not change the fingerprint");
        m.gemm = BACKEND_GEMM_FP8;        /* ... except fp8, which the CPU honours */
        recipe_fingerprint(&r, &m, fb, sizeof fb);
        ok(strcmp(fa, fb) != 0, "cpu: gemm_mode fp8 changes the fingerprint");

        char err[256];
        m = r.modes;
        setenv("LLM_CUDA_GEMM", "bf16", 1);
        setenv("LLM_CUDA_MOE", "cublaslt", 1);
        setenv("LLM_CUDA_ATTN_TOKENS", "2", 1);
        ok(backend_modes_env(&m, err, sizeof err) == 0 && m.gemm == BACKEND_GEMM_BF16
           && m.moe == BACKEND_MOE_CUBLASLT && m.attn_tokens == 2,
           "LLM_CUDA_GEMM, _MOE, _ATTN_TOKENS override the recipe");
        setenv("LLM_CUDA_GEMM", "fp16", 1);
        ok(backend_modes_env(&m, err, sizeof err) < 0
           && strstr(err, "LLM_CUDA_GEMM=fp16: expected one of bf16x2, bf16, f32"),
           "a bad override is refused, named: %s", err);
        setenv("LLM_CUDA_GEMM", "", 1);
        setenv("LLM_CUDA_ATTN_TOKENS", "3", 1);
        ok(backend_modes_env(&m, err, sizeof err) < 0 && strstr(err, "LLM_CUDA_ATTN_TOKENS=3"),
           "attention tokens override checked: %s", err);
        unsetenv("LLM_CUDA_GEMM");
        unsetenv("LLM_CUDA_MOE");
        unsetenv("LLM_CUDA_ATTN_TOKENS");
        recipe_free(&r);
        sb_free(&e);
    }
    {
        recipe r;
        strbuf e;
        sb_init(&e);
        int n = recipe_load(&r, "/nonexistent/recipe.yaml", &e);
        ok(n > 0 && strstr(e.data, "/nonexistent/recipe.yaml: cannot open"), "missing file");
        recipe_free(&r);
        sb_free(&e);
    }

    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd)) diag("could not remove %s", tmpdir);
    return exit_status();
}
