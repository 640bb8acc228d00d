/* Row-level float32 primitives of the reference CPU backend.  Each mirrors
 * the operation order of the transformers reference so rounding stays
 * close to it (see the comments at each). */
#ifndef LLM_CPU_OPS_H
#define LLM_CPU_OPS_H

#include <stdbool.h>
#include <stdint.h>

/* out = weight * (x * rsqrt(mean(x^2) + eps)); weight NULL: no weight.
 * out may equal x. */
void cpu_rmsnorm_row(const float *x, int n, const float *weight, float eps, float *out);

/* Interleaved RoPE on the last 2*npairs channels of one head: channel pair
 * (2i, 2i+1) rotates by angle pos * inv_freq[i] (float32 product);
 * cos/sin scaled by attn_factor; inverse negates sin. */
void cpu_rope_head(float *x, int head_dim, int npairs, const float *inv_freq,
                   float attn_factor, int32_t pos, int inverse);

float cpu_sigmoid(float x);
float cpu_silu(float x);
/* log(1 + e^x), linear above 20 as torch's softplus */
float cpu_softplus(float x);

/* mHC mapping from the raw mix logits m[(2+hc)*hc]:
 *   pre  = sigmoid(m_pre * s0 + b_pre) + eps
 *   post = 2 sigmoid(m_post * s1 + b_post)
 *   comb = Sinkhorn(softmax_rows(m_comb * s2 + b_comb) + eps), iters rounds
 *          (column normalization first, then iters-1 of rows and columns). */
void cpu_hc_mix(const float *m, int hc, const float *base, const float *scale, int iters,
                float eps, float *pre, float *post, float *comb);

/* Indices of the k largest of v[0..n) (k <= n), larger first, equal values
 * in ascending index order; idx gets k entries. */
void cpu_topk(const float *v, int n, int k, int32_t *idx);

/* One query, nheads heads sharing the key list keys[0..nk) (keys are
 * values).  logits = q.k * scale, a sink logit per head joins the softmax
 * with no value; out[h] = sum_j p_j keys[j].  bf16: the query and each
 * exp(logit - running max) rounded to bf16 before they multiply (the
 * softmax's sums taken unrounded), over tiles of 32 keys as the
 * tensor-core kernel of the fp8 mode's prefill chunks does (DeepSeek's
 * bf16 attention), so that both round at the same points.  work: nk +
 * head_dim floats. */
void cpu_attend(const float *q, int nheads, int head_dim, const float *const *keys, int nk,
                float scale, const float *sinks, bool bf16, float *out, float *work);

#endif
