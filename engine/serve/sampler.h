/* Token sampling for one sequence: penalties, temperature, top-k, top-p,
 * min-p, seeded per-sequence randomness, logprobs, logit_bias and an
 * allowed-token mask (constrained decoding).  Order of operations follows
 * vLLM: logit_bias -> mask -> penalties -> temperature -> top-k -> top-p ->
 * min-p -> sample.  Logprobs are those of the model's raw distribution (vLLM's
 * default), not of the processed one. */
#ifndef LLM_SAMPLER_H
#define LLM_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "ipc/llm_request.h"   /* LLM_REQ_TOP_LOGPROBS_MAX */

typedef struct {
    float    temperature;        /* 0 = greedy */
    float    top_p;              /* (0, 1], 1 = off */
    int      top_k;              /* <= 0 = off */
    float    min_p;              /* [0, 1], 0 = off */
    float    presence_penalty;   /* on generated tokens, OpenAI semantics */
    float    frequency_penalty;
    float    repetition_penalty; /* on prompt + generated tokens, 1 = off */
    bool     has_seed;
    uint64_t seed;
    int      top_logprobs;       /* -1 = no logprobs, 0..20 */
    /* OpenAI logit_bias: added to the logits of these ids (copied by
     * sampler_new; ids must be < vocab) */
    const int32_t *bias_id;
    const float   *bias;
    int      n_bias;
} sampling_params;

void sampling_params_default(sampling_params *p);

typedef struct {
    int32_t token;
    float   logprob;
    int     n_top;
    int32_t top_token[LLM_REQ_TOP_LOGPROBS_MAX];
    float   top_logprob[LLM_REQ_TOP_LOGPROBS_MAX];
} sample_result;

typedef struct sampler sampler;

/* prompt ids feed the repetition penalty.  Without a seed, randomness comes
 * from the OS, so unseeded requests differ; with one, the same request gives
 * the same tokens whatever else the engine runs. */
sampler *sampler_new(const sampling_params *p, int vocab,
                     const int32_t *prompt, int n_prompt);
void sampler_free(sampler *s);

/* Choose the next token from logits[vocab] (modified in place).  Records
 * the token for the penalties.  Never returns a token whose logit is -inf
 * or NaN unless every logit is. */
void sampler_sample(sampler *s, float *logits, sample_result *out);
/* The same, choosing only among tokens whose bit is set in allow (64 ids a
 * word; NULL: all). */
void sampler_sample_masked(sampler *s, float *logits, const uint64_t *allow,
                           sample_result *out);
/* True when sampling would be the argmax of the raw logits and nothing
 * else: greedy, no penalties, no logit_bias, no logprobs. */
bool sampler_greedy_only(const sampler *s);
/* A token chosen without sampler_sample (greedy_only: the model's argmax)
 * recorded as sampler_sample records its choice. */
void sampler_record(sampler *s, int32_t token);

/* The same logits with a banned token (e.g. EOS before min_tokens). */
void sampler_ban(float *logits, int32_t token);

#endif
