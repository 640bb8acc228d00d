/* Recipes: one YAML file per engine deployment (ARCHITECTURE.md §4).
 * Field names follow vLLM's where vLLM has one.  docs/RECIPES.md documents
 * every key; recipe_load() reports each problem as "FILE:LINE: KEY: why". */
#ifndef LLM_RECIPE_H
#define LLM_RECIPE_H

#include <stdbool.h>
#include <stdint.h>

#include "backend_modes.h"
#include "chat_render.h"
#include "ipc/llm_ipc.h"   /* LLM_IPC_MODELS_MAX */
#include "strbuf.h"


enum backend_kind { BACKEND_CPU, BACKEND_CUDA };
enum kv_cache_dtype { KV_DTYPE_AUTO, KV_DTYPE_BF16, KV_DTYPE_FP8 };

typedef struct {
    /* identity and placement */
    char   *path;                 /* the recipe file itself */
    char   *name;                 /* engine name: segment /llm-<name>-<run_dir hash> */
    char   *run_dir;              /* where <name>.sock lives */
    enum backend_kind backend;

    /* model */
    char   *model_path;           /* checkpoint dir (resolved against recipe dir) */
    char   *tokenizer_path;       /* default: <model_path>/tokenizer.json */
    char   *served_model_name[LLM_IPC_MODELS_MAX];
    int     n_served;

    /* parallelism and limits (vLLM names) */
    int     tensor_parallel_size;
    int     max_model_len;
    int     max_num_seqs;
    int     max_num_batched_tokens;
    double  gpu_memory_utilization;
    enum kv_cache_dtype kv_cache_dtype;
    int64_t kv_cache_memory_bytes;   /* 0: size from gpu_memory_utilization */
    bool    enable_prefix_caching;   /* reuse cached prompt prefixes (default on) */
    double  kv_offloading_size;      /* GiB of host KV tier, 0 = off */
    bool    kv_offloading_filesystem; /* a disk tier under the host tier */
    char   *kv_offloading_path;      /* its directory */
    double  kv_offloading_filesystem_size;  /* GiB it may hold (default 64) */
    int     cpu_threads;             /* CPU backend threads per rank, 0 = auto */
    double  log_stats_interval;      /* seconds between step statistics lines, 0 = off */
    backend_modes modes;             /* gemm_mode, moe_kernel, attn_tokens (cuda) */

    /* speculative decoding (null in every shipped recipe) */
    char   *speculative_method;      /* NULL = off */
    int     num_speculative_tokens;

    /* override_generation_config: sampling defaults for requests */
    double  temperature, top_p, min_p;
    int     top_k;                   /* -1 = off */
    int     max_tokens;              /* default completion budget */
    double  presence_penalty, frequency_penalty, repetition_penalty;

    /* default_chat_template_kwargs */
    bool    thinking;
    char   *reasoning_effort;        /* low | high | max */
    bool    drop_thinking;

    /* protocol sizing */
    int     slots;                   /* request slots in the segment */
    int64_t max_request_bytes;
    int     ring_bytes;              /* per-slot event ring */
} recipe;

/* Parse and validate.  Returns 0 when valid.  Otherwise returns the number
 * of problems and appends one line per problem to errors.  The recipe is
 * filled with defaults for every key not given; free with recipe_free(). */
int recipe_load(recipe *r, const char *path, strbuf *errors);
void recipe_free(recipe *r);

/* system_fingerprint ("fp_" + 10 hex digits): the model's config.json,
 * the tokenizer, the engine version and the recipe settings that change
 * outputs, with the backend modes in effect (recipe plus overrides). */
void recipe_fingerprint(const recipe *r, const backend_modes *modes, char *out, size_t len);

const char *backend_name(enum backend_kind b);
const char *kv_cache_dtype_name(enum kv_cache_dtype d);

/* The recipe's default_chat_template_kwargs as chat request defaults. */
void recipe_chat_options(const recipe *r, chat_options *o);

#endif
