#include "ops.h"

#include <math.h>
#include <stdlib.h>

#include "matmul.h"
#include "quant.h"

void cpu_rmsnorm_row(const float *x, int n, const float *weight, float eps, float *out)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = 1.0f / sqrtf((float)(ss / n) + eps);
    if (weight)
        for (int i = 0; i < n; i++) out[i] = weight[i] * (x[i] * r);
    else
        for (int i = 0; i < n; i++) out[i] = x[i] * r;
}

void cpu_rope_head(float *x, int head_dim, int npairs, const float *inv_freq,
                   float attn_factor, int32_t pos, int inverse)
{
    float *r = x + head_dim - 2 * npairs;
    for (int i = 0; i < npairs; i++) {
        float ang = inv_freq[i] * (float)pos;
        float c = (float)cos((double)ang) * attn_factor;
        float s = (float)sin((double)ang) * attn_factor;
        if (inverse) s = -s;
        float x0 = r[2 * i], x1 = r[2 * i + 1];
        r[2 * i] = x0 * c + -x1 * s;
        r[2 * i + 1] = x1 * c + x0 * s;
    }
}

float cpu_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
float cpu_silu(float x) { return x / (1.0f + expf(-x)); }
float cpu_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

void cpu_hc_mix(const float *m, int hc, const float *base, const float *scale, int iters,
                float eps, float *pre, float *post, float *comb)
{
    for (int s = 0; s < hc; s++) {
        pre[s] = cpu_sigmoid(m[s] * scale[0] + base[s]) + eps;
        post[s] = 2.0f * cpu_sigmoid(m[hc + s] * scale[1] + base[hc + s]);
    }
    const float *mc = m + 2 * hc, *bc = base + 2 * hc;
    for (int i = 0; i < hc; i++) {
        float *row = comb + i * hc, mx = -INFINITY, sum = 0;
        for (int j = 0; j < hc; j++) {
            row[j] = mc[i * hc + j] * scale[2] + bc[i * hc + j];
            if (row[j] > mx) mx = row[j];
        }
        for (int j = 0; j < hc; j++) { row[j] = expf(row[j] - mx); sum += row[j]; }
        for (int j = 0; j < hc; j++) row[j] = row[j] / sum + eps;
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0)
            for (int i = 0; i < hc; i++) {
                float sum = 0;
                for (int j = 0; j < hc; j++) sum += comb[i * hc + j];
                for (int j = 0; j < hc; j++) comb[i * hc + j] /= sum + eps;
            }
        for (int j = 0; j < hc; j++) {
            float sum = 0;
            for (int i = 0; i < hc; i++) sum += comb[i * hc + j];
            for (int i = 0; i < hc; i++) comb[i * hc + j] /= sum + eps;
        }
    }
}

/* Ordering of the top-k: larger value first, then smaller index. */
static int before(const float *v, int32_t a, int32_t b)
{
    return v[a] > v[b] || (v[a] == v[b] && a < b);
}

static void sift_down(const float *v, int32_t *heap, int k, int i)
{
    /* Min-heap on the "before" order: the root is the weakest kept entry. */
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < k && before(v, heap[w], heap[l])) w = l;
        if (r < k && before(v, heap[w], heap[r])) w = r;
        if (w == i) return;
        int32_t t = heap[i];
        heap[i] = heap[w];
        heap[w] = t;
        i = w;
    }
}

void cpu_topk(const float *v, int n, int k, int32_t *idx)
{
    if (k <= 0) return;
    for (int i = 0; i < k; i++) idx[i] = i;
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(v, idx, k, i);
    for (int i = k; i < n; i++)
        if (before(v, i, idx[0])) {
            idx[0] = i;
            sift_down(v, idx, k, 0);
        }
    /* Heap sort: pop the weakest to the back, strongest ends first. */
    for (int end = k - 1; end > 0; end--) {
        int32_t t = idx[0];
        idx[0] = idx[end];
        idx[end] = t;
        sift_down(v, idx, end, 0);
    }
}

/* cpu_attend's bf16 form for head h: the tensor-core kernel's online
 * softmax (kernels/cuda/attention_mma.cu) over tiles of ATTEND_TILE keys
 * in list order, so that each probability is rounded at the same point:
 * e = exp(x - m) against the running max m of the logits seen so far (the
 * sink apart), bf16(e) times the key, the sums and the output rescaled by
 * exp(m_old - m) as m grows, the sink joining the denominator at the
 * end. */
#define ATTEND_TILE 32
static void attend_bf16(const float *qh, int head_dim, const float *const *keys, int nk,
                        float scale, float sink, float *oh, float *work)
{
    float m = -INFINITY, l = 0;
    for (int d = 0; d < head_dim; d++) oh[d] = 0;
    for (int t0 = 0; t0 < nk; t0 += ATTEND_TILE) {
        int t1 = nk - t0 < ATTEND_TILE ? nk : t0 + ATTEND_TILE;
        float mx = -INFINITY, sum = 0;
        for (int j = t0; j < t1; j++) {
            work[j] = cpu_dot(qh, keys[j], head_dim) * scale;
            mx = fmaxf(mx, work[j]);
        }
        float mnew = fmaxf(m, mx), mref = mnew == -INFINITY ? 0 : mnew, corr = expf(m - mref);
        for (int d = 0; d < head_dim; d++) oh[d] *= corr;
        for (int j = t0; j < t1; j++) {
            float e = expf(work[j] - mref), p = bf16_round(e);
            const float *k = keys[j];
            sum += e;
            for (int d = 0; d < head_dim; d++) oh[d] += p * k[d];
        }
        l = l * corr + sum;
        m = mnew;
    }
    float den = l + expf(sink - m);
    for (int d = 0; d < head_dim; d++) oh[d] /= den;
}

void cpu_attend(const float *q, int nheads, int head_dim, const float *const *keys, int nk,
                float scale, const float *sinks, bool bf16, float *out, float *work)
{
    float *qr = work + nk;
    for (int h = 0; h < nheads; h++) {
        const float *qh = q + (size_t)h * head_dim;
        float *oh = out + (size_t)h * head_dim;
        if (bf16) {
            for (int d = 0; d < head_dim; d++) qr[d] = bf16_round(qh[d]);
            attend_bf16(qr, head_dim, keys, nk, scale, sinks[h], oh, work);
            continue;
        }
        float mx = sinks[h];
        for (int j = 0; j < nk; j++) {
            work[j] = cpu_dot(qh, keys[j], head_dim) * scale;
            if (work[j] > mx) mx = work[j];
        }
        float sum = expf(sinks[h] - mx);
        for (int j = 0; j < nk; j++) { work[j] = expf(work[j] - mx); sum += work[j]; }
        for (int d = 0; d < head_dim; d++) oh[d] = 0;
        for (int j = 0; j < nk; j++) {
            float p = work[j] / sum;
            const float *k = keys[j];
            for (int d = 0; d < head_dim; d++) oh[d] += p * k[d];
        }
    }
}
