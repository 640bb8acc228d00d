#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define SAMPLE_BLOCK 512    /* sample_all's entries a block */

struct sampler {
    sampling_params p;
    int       vocab;
    uint64_t  rng[4];        /* xoshiro256** */
    uint32_t *out_count;     /* times each token was generated */
    uint8_t  *in_prompt;     /* token appeared in the prompt */
    /* scratch */
    float    *prob;
    int32_t  *idx;
    uint8_t  *keep;
    float    *raw;           /* logits before penalties (logprobs + penalties) */
    uint64_t *keys;          /* [2][vocab], top-p's radix sort (made on first use) */
    double   *bsum;          /* sample_all's block sums */
    int32_t  *bias_id;
    float    *bias;
};

void sampling_params_default(sampling_params *p)
{
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->top_k = -1;
    p->repetition_penalty = 1.0f;
    p->top_logprobs = -1;
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(uint64_t *s)
{
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t; s[3] = rotl(s[3], 45);
    return r;
}

/* uniform in [0, 1) with 53 random bits */
static double next_unit(uint64_t *s) { return (next_u64(s) >> 11) * 0x1.0p-53; }

sampler *sampler_new(const sampling_params *p, int vocab,
                     const int32_t *prompt, int n_prompt)
{
    sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->p = *p;
    s->vocab = vocab;
    s->out_count = calloc((size_t)vocab, sizeof *s->out_count);
    s->in_prompt = calloc((size_t)vocab, 1);
    s->prob = malloc((size_t)vocab * sizeof *s->prob);
    s->idx = malloc((size_t)vocab * sizeof *s->idx);
    s->keep = malloc((size_t)vocab);
    s->bsum = malloc(((size_t)vocab + SAMPLE_BLOCK - 1) / SAMPLE_BLOCK * sizeof *s->bsum);
    /* logprobs are the raw model's: keep a copy, since penalties, bias and
     * masks change the logits */
    bool need_raw = p->top_logprobs >= 0;
    if (need_raw) s->raw = malloc((size_t)vocab * sizeof *s->raw);
    if (p->n_bias > 0) {
        s->bias_id = malloc((size_t)p->n_bias * sizeof *s->bias_id);
        s->bias = malloc((size_t)p->n_bias * sizeof *s->bias);
        if (s->bias_id && s->bias) {
            memcpy(s->bias_id, p->bias_id, (size_t)p->n_bias * sizeof *s->bias_id);
            memcpy(s->bias, p->bias, (size_t)p->n_bias * sizeof *s->bias);
        }
    }
    s->p.bias_id = s->bias_id;
    s->p.bias = s->bias;
    if (!s->out_count || !s->in_prompt || !s->prob || !s->idx || !s->keep || !s->bsum
        || (need_raw && !s->raw) || (p->n_bias > 0 && (!s->bias_id || !s->bias))) {
        sampler_free(s);
        return NULL;
    }
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] >= 0 && prompt[i] < vocab) s->in_prompt[prompt[i]] = 1;
    uint64_t seed = p->seed;
    if (!p->has_seed && getrandom(&seed, sizeof seed, 0) != sizeof seed)
        seed = (uint64_t)(uintptr_t)s ^ 0x5eed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&seed);
    return s;
}

void sampler_free(sampler *s)
{
    if (!s) return;
    free(s->out_count);
    free(s->in_prompt);
    free(s->prob);
    free(s->idx);
    free(s->keep);
    free(s->raw);
    free(s->keys);
    free(s->bsum);
    free(s->bias_id);
    free(s->bias);
    free(s);
}

void sampler_ban(float *logits, int32_t token) { logits[token] = -INFINITY; }

static void apply_penalties(const sampler *s, float *logits)
{
    const sampling_params *p = &s->p;
    bool rep = p->repetition_penalty != 1.0f;
    bool pf = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    if (!rep && !pf) return;
    for (int i = 0; i < s->vocab; i++) {
        uint32_t c = s->out_count[i];
        if (rep && (c || s->in_prompt[i]))
            logits[i] = logits[i] > 0 ? logits[i] / p->repetition_penalty
                                      : logits[i] * p->repetition_penalty;
        if (pf && c)
            logits[i] -= p->frequency_penalty * (float)c + p->presence_penalty;
    }
}

/* Fill top-n (token, logprob) of the raw distribution. */
static void top_logprobs(const float *logits, int vocab, float lse, int n,
                         sample_result *out)
{
    out->n_top = 0;
    if (n <= 0) return;
    for (int i = 0; i < vocab; i++) {
        float v = logits[i];
        if (!(v > -INFINITY)) continue;
        int k = out->n_top;
        if (k == n && v <= logits[out->top_token[k - 1]]) continue;
        if (k < n) out->n_top++;
        else k = n - 1;
        while (k > 0 && logits[out->top_token[k - 1]] < v) {
            out->top_token[k] = out->top_token[k - 1];
            k--;
        }
        out->top_token[k] = i;
    }
    for (int k = 0; k < out->n_top; k++)
        out->top_logprob[k] = logits[out->top_token[k]] - lse;
}

static float log_sum_exp(const float *x, int n, float *maxv)
{
    float m = -INFINITY;
    for (int i = 0; i < n; i++) if (x[i] > m) m = x[i];
    *maxv = m;
    if (m == -INFINITY) return m;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)(x[i] - m));
    return m + (float)log(sum);
}

/* Move the k largest-probability entries of idx[0..n) to the front
 * (unordered); quickselect, expected O(n). */
static void select_top(const float *prob, int32_t *idx, int n, int k)
{
    int lo = 0, hi = n;
    while (hi - lo > 1) {
        float pivot = prob[idx[lo + (hi - lo) / 2]];
        int i = lo, j = hi - 1;
        while (i <= j) {
            while (prob[idx[i]] > pivot) i++;
            while (prob[idx[j]] < pivot) j--;
            if (i <= j) { int32_t t = idx[i]; idx[i] = idx[j]; idx[j] = t; i++; j--; }
        }
        if (k <= j) hi = j + 1;
        else if (k >= i) lo = i;
        else return;
    }
}

/* e^x for x <= 0, within 3 ulp of it (every 8th float of [-87.3, 0]
 * measured; expf: 0.5), 0 below -87.3 (where expf reaches the subnormals)
 * and for NaN: plain arithmetic the compiler vectorizes (Makefile: -O3
 * -fno-trapping-math for this file) where a loop of expf calls over a
 * 129,280-token vocabulary took ~0.9 ms a token.  Cody-Waite: x = k ln2 +
 * r, |r| <= ln2 / 2, e^r by its degree-6 Taylor polynomial, 2^k into the
 * exponent bits. */
static inline float exp_neg(float x)
{
    float keep = x >= -87.3f ? 1.0f : 0.0f;    /* 0 below expf's normals, and for NaN */
    x = x > -88.0f ? x : -88.0f;                /* k stays in range */
    float k = (x * 1.44269504f + 12582912.0f) - 12582912.0f;    /* round to nearest */
    float r = x - k * 0.693359375f;
    r -= k * -2.12194440e-4f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24
              + r * (1.0f / 120 + r * (1.0f / 720))))));
    int32_t e = ((int32_t)k + 127) << 23;
    float two_k;
    memcpy(&two_k, &e, sizeof two_k);
    return p * two_k * keep;
}

/* The largest of x[0..n) (NaN ignored; -inf when none), over eight
 * running maxima: one chain of compares over a 129,280-entry vocabulary is
 * latency-bound (~5 cycles an entry); eight run side by side. */
__attribute__((target_clones("avx512f", "avx2", "default")))
static float max_of(const float *x, int n)
{
    float m[8] = { -INFINITY, -INFINITY, -INFINITY, -INFINITY,
                   -INFINITY, -INFINITY, -INFINITY, -INFINITY };
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    for (; i < n; i++) m[0] = x[i] > m[0] ? x[i] : m[0];
    for (int j = 1; j < 8; j++) m[0] = m[j] > m[0] ? m[j] : m[0];
    return m[0];
}

/* idx[0..k) in by_prob_desc's order (probability descending, then id
 * ascending), for many candidates: an LSD radix sort, 12-bit digits, of
 * keys (2^31 - 1 - probability bits) << idbits | id, which ascend in that
 * order for the non-negative probabilities softmax makes (top-p over a
 * flat distribution sorted ~120,000 candidates with qsort_r: 13.6 ms a
 * token).  keys holds 2k entries.  The same order, so the same tokens. */
#define RADIX_MIN 4096
#define RADIX_BITS 12

static void sort_by_prob_desc(const float *prob, int32_t *idx, int k, int vocab, uint64_t *keys)
{
    int idbits = 1;
    while ((1 << idbits) < vocab) idbits++;
    uint64_t *a = keys, *b = keys + k;
    for (int i = 0; i < k; i++) {
        uint32_t bits;
        memcpy(&bits, &prob[idx[i]], sizeof bits);
        a[i] = (uint64_t)(0x7fffffffu - (bits & 0x7fffffffu)) << idbits | (uint32_t)idx[i];
    }
    uint32_t count[(1 << RADIX_BITS) + 1];
    for (int sh = 0; sh < 31 + idbits; sh += RADIX_BITS) {
        memset(count, 0, sizeof count);
        for (int i = 0; i < k; i++) count[((a[i] >> sh) & ((1 << RADIX_BITS) - 1)) + 1]++;
        for (int d = 0; d < 1 << RADIX_BITS; d++) count[d + 1] += count[d];
        for (int i = 0; i < k; i++) b[count[(a[i] >> sh) & ((1 << RADIX_BITS) - 1)]++] = a[i];
        uint64_t *t = a;
        a = b, b = t;
    }
    for (int i = 0; i < k; i++) idx[i] = (int32_t)(a[i] & ((1ull << idbits) - 1));
}

/* The softmax numerators at temperature 1 / inv_t into prob[] and their
 * sums a block of SAMPLE_BLOCK ids at a time into bsum[] over eight
 * running sums, which vectorize (one running sum over 129,280 ids, an
 * add's latency each, was most of a draw's ~0.3 ms), compiled for
 * AVX-512, AVX2 and the baseline x86-64 (chosen at run time); returns the
 * total (the block sums in order). */
__attribute__((target_clones("avx512f", "avx2", "default")))
static double softmax_blocks(sampler *s, const float *logits, float m, float inv_t)
{
    int V = s->vocab, nb = (V + SAMPLE_BLOCK - 1) / SAMPLE_BLOCK;
    double total = 0;
    for (int b = 0; b < nb; b++) {
        int i0 = b * SAMPLE_BLOCK, i1 = i0 + SAMPLE_BLOCK < V ? i0 + SAMPLE_BLOCK : V, i = i0;
        double a[8] = { 0 };
        for (; i + 8 <= i1; i += 8) {
            float e[8];
            for (int j = 0; j < 8; j++) e[j] = exp_neg((logits[i + j] - m) * inv_t);
            for (int j = 0; j < 8; j++) s->prob[i + j] = e[j], a[j] += e[j];
        }
        for (; i < i1; i++) {
            s->prob[i] = exp_neg((logits[i] - m) * inv_t);
            a[0] += s->prob[i];
        }
        s->bsum[b] = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        total += s->bsum[b];
    }
    return total;
}

/* A draw from the whole vocabulary (no top-k, top-p or min-p): its block
 * found by the block sums, then its token inside the block in id order.
 * The same distribution as one running sum over every id; a given draw
 * can differ from that only where it falls within rounding (~1e-16 of
 * the total) of a boundary between two tokens.  0 when every logit is
 * -inf. */
static int32_t sample_all(sampler *s, const float *logits, float m, float inv_t)
{
    int V = s->vocab, lastnz = (V + SAMPLE_BLOCK - 1) / SAMPLE_BLOCK - 1;
    double total = softmax_blocks(s, logits, m, inv_t);
    while (lastnz >= 0 && !(s->bsum[lastnz] > 0)) lastnz--;
    if (lastnz < 0) return 0;
    double r = next_unit(s->rng) * total, acc = 0;
    for (int b = 0; b <= lastnz; b++) {
        if (!(s->bsum[b] > 0)) continue;
        if (b < lastnz && !(r < acc + s->bsum[b])) {
            acc += s->bsum[b];
            continue;
        }
        /* this block; the last nonzero one when rounding ends the scan
         * short of r */
        int i1 = (b + 1) * SAMPLE_BLOCK < V ? (b + 1) * SAMPLE_BLOCK : V, last = -1;
        for (int i = b * SAMPLE_BLOCK; i < i1; i++) {
            if (!(s->prob[i] > 0)) continue;
            acc += s->prob[i];
            last = i;
            if (r < acc) return i;
        }
        return last;
    }
    return 0;
}

static int by_prob_desc(const void *a, const void *b, void *ctx)
{
    const float *prob = ctx;
    float x = prob[*(const int32_t *)a], y = prob[*(const int32_t *)b];
    if (x != y) return x < y ? 1 : -1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

void sampler_sample(sampler *s, float *logits, sample_result *out)
{
    sampler_sample_masked(s, logits, NULL, out);
}

void sampler_sample_masked(sampler *s, float *logits, const uint64_t *allow,
                           sample_result *out)
{
    const sampling_params *p = &s->p;
    int V = s->vocab;
    float mx;

    /* logprobs come from the raw distribution */
    if (p->top_logprobs >= 0) {
        float lse = log_sum_exp(logits, V, &mx);
        int n = p->top_logprobs > LLM_REQ_TOP_LOGPROBS_MAX ? LLM_REQ_TOP_LOGPROBS_MAX
                                                           : p->top_logprobs;
        top_logprobs(logits, V, lse, n, out);
        out->logprob = lse;   /* completed below once the token is known */
    } else {
        out->n_top = 0;
    }
    float raw_lse = out->logprob;
    float *raw_copy = NULL;
    if (s->raw) {
        memcpy(s->raw, logits, (size_t)V * sizeof *s->raw);
        raw_copy = s->raw;
    }

    for (int i = 0; i < p->n_bias; i++) logits[p->bias_id[i]] += p->bias[i];
    for (int w = 0; allow && w * 64 < V; w++) {   /* word by word: most are all 0 or 1 */
        uint64_t bits = allow[w];
        if (bits == ~0ULL) continue;
        for (int i = w * 64; i < V && i < w * 64 + 64; i++)
            if (!(bits >> (i & 63) & 1)) logits[i] = -INFINITY;
    }
    apply_penalties(s, logits);

    int32_t tok = 0;
    if (p->temperature <= 0.0f) {
        /* greedy: the lowest id among equal maxima (0 when none is finite
         * or above -inf) */
        float best = max_of(logits, V);
        if (best > -INFINITY)
            while (logits[tok] != best) tok++;
    } else if (p->top_k <= 0 && p->top_p >= 1.0f && p->min_p <= 0.0f) {
        tok = sample_all(s, logits, max_of(logits, V), 1.0f / p->temperature);
    } else {
        /* softmax at temperature into prob[] */
        int n = 0;
        double sum = softmax_blocks(s, logits, max_of(logits, V), 1.0f / p->temperature);
        for (int i = 0; i < V; i++)
            if (s->prob[i] > 0) s->idx[n++] = i;
        if (n == 0) { s->idx[n++] = 0; s->prob[0] = 1; sum = 1; }
        bool ascending = true;      /* idx[0..n) in id order (no selection yet) */
        /* top-k */
        if (p->top_k > 0 && p->top_k < n) {
            ascending = false;
            select_top(s->prob, s->idx, n, p->top_k);
            n = p->top_k;
            sum = 0;
            for (int i = 0; i < n; i++) sum += s->prob[s->idx[i]];
        }
        /* top-p: the smallest high-probability set with mass >= top_p.
         * Narrow with quickselect before sorting: the set is usually tiny. */
        if (p->top_p < 1.0f) {
            ascending = false;
            double need = p->top_p * sum;
            /* The candidates within 2^-20 of the largest (its numerator
             * is 1) first, by one partition: each is larger than every
             * other, so they are the top k, and on a peaked distribution
             * they usually hold the mass (quickselect over a 129,280-id
             * vocabulary took ~0.6 of such a draw's ~0.9 ms).  Else the
             * smallest top-k holding it, k growing 16x; past RADIX_MIN
             * candidates all of them are radix-sorted instead (a flat
             * distribution: more selection passes cost more). */
            int k = 0;
            double mass = 0;
            for (int i = 0; i < n; i++)
                if (s->prob[s->idx[i]] >= 0x1p-20f) {
                    int32_t t = s->idx[k];
                    s->idx[k++] = s->idx[i], s->idx[i] = t;
                    mass += s->prob[s->idx[k - 1]];
                }
            bool radix = false;
            if (k > RADIX_MIN || mass < need) {
                k = 64 < n ? 64 : n;
                for (;;) {
                    select_top(s->prob, s->idx, n, k);
                    mass = 0;
                    for (int i = 0; i < k; i++) mass += s->prob[s->idx[i]];
                    if (mass >= need || k == n) break;
                    k = k * 16 < n ? k * 16 : n;
                    if (k > RADIX_MIN && (s->keys || (s->keys = malloc(2 * (size_t)s->vocab
                                                                       * sizeof *s->keys)))) {
                        k = n;
                        radix = true;
                        break;
                    }
                }
            }
            if (radix) sort_by_prob_desc(s->prob, s->idx, k, s->vocab, s->keys);
            else qsort_r(s->idx, (size_t)k, sizeof *s->idx, by_prob_desc, s->prob);
            double acc = 0;
            int keep = 0;
            while (keep < k) {
                acc += s->prob[s->idx[keep++]];
                if (acc >= need) break;
            }
            n = keep;
            sum = acc;
        }
        /* min-p: drop tokens below min_p times the top probability */
        if (p->min_p > 0.0f) {
            float top = 0;
            for (int i = 0; i < n; i++) if (s->prob[s->idx[i]] > top) top = s->prob[s->idx[i]];
            float cut = p->min_p * top;
            int w = 0;
            sum = 0;
            for (int i = 0; i < n; i++)
                if (s->prob[s->idx[i]] >= cut) { s->idx[w++] = s->idx[i]; sum += s->prob[s->idx[i]]; }
            n = w;
        }
        /* inverse CDF in a canonical order (ascending id) so the same seed
         * gives the same token however selection permuted the candidates */
        double r = next_unit(s->rng) * sum, acc = 0;
        tok = -1;
        if (ascending) {
            /* every candidate, already in id order: the keep-array scan's
             * sums without building it */
            for (int i = 0; i < n && tok < 0; i++) {
                acc += s->prob[s->idx[i]];
                if (r < acc) tok = s->idx[i];
            }
            if (tok < 0) tok = s->idx[n - 1];
        } else if (n <= 256) {
            int32_t *a = s->idx;
            for (int i = 1; i < n; i++) {
                int32_t v = a[i];
                int j = i;
                while (j > 0 && a[j - 1] > v) { a[j] = a[j - 1]; j--; }
                a[j] = v;
            }
            for (int i = 0; i < n && tok < 0; i++) {
                acc += s->prob[a[i]];
                if (r < acc) tok = a[i];
            }
            if (tok < 0) tok = a[n - 1];
        } else {
            memset(s->keep, 0, (size_t)V);
            for (int i = 0; i < n; i++) s->keep[s->idx[i]] = 1;
            for (int i = 0; i < V && tok < 0; i++) {
                if (!s->keep[i]) continue;
                acc += s->prob[i];
                if (r < acc) tok = i;
            }
            for (int i = V - 1; tok < 0 && i >= 0; i--)
                if (s->keep[i]) tok = i;
        }
    }

    out->token = tok;
    if (p->top_logprobs >= 0)
        out->logprob = (raw_copy ? raw_copy[tok] : logits[tok]) - raw_lse;
    if (tok >= 0 && tok < V) s->out_count[tok]++;
}

bool sampler_greedy_only(const sampler *s)
{
    const sampling_params *p = &s->p;
    return p->temperature <= 0.0f && p->top_logprobs < 0 && p->n_bias == 0 &&
           p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f &&
           p->repetition_penalty == 1.0f;
}

void sampler_record(sampler *s, int32_t token)
{
    if (token >= 0 && token < s->vocab) s->out_count[token]++;
}
