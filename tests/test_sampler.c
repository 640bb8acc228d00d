/* Sampler and stop strings: each filter keeps exactly the tokens it should,
 * seeds reproduce, frequencies follow the distribution, logprobs are the
 * raw model's, stop strings match across token boundaries. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"
#include "stop_match.h"
#include "tap.h"

/* logits whose softmax is probs[] */
static void logits_of(const double *probs, int n, float *out)
{
    for (int i = 0; i < n; i++) out[i] = probs[i] > 0 ? (float)log(probs[i]) : -INFINITY;
}

/* Sample `draws` times; count[i] = how often token i came out. */
static void histogram(const sampling_params *p, const double *probs, int n, int draws,
                      int *count)
{
    sampler *s = sampler_new(p, n, NULL, 0);
    float *lg = malloc(sizeof(float) * (size_t)n);
    memset(count, 0, sizeof(int) * (size_t)n);
    for (int d = 0; d < draws; d++) {
        sample_result r;
        logits_of(probs, n, lg);
        sampler_sample(s, lg, &r);
        count[r.token]++;
    }
    free(lg);
    sampler_free(s);
}

int main(void)
{
    sampling_params p;
    const double probs[4] = { 0.5, 0.3, 0.15, 0.05 };
    int count[1000];
    sample_result r;

    /* greedy */
    sampling_params_default(&p);
    p.temperature = 0;
    {
        float lg[5] = { 1, 3, 3, -INFINITY, 2 };
        sampler *s = sampler_new(&p, 5, NULL, 0);
        sampler_sample(s, lg, &r);
        is_int(r.token, 1, "greedy: argmax, lowest id among ties");
        sampler_free(s);
    }

    /* logit_bias and the allowed-token mask: applied before temperature and
     * top-p; logprobs stay the raw model's */
    {
        sampling_params_default(&p);
        p.has_seed = true;
        p.seed = 7;
        p.top_logprobs = 0;
        int32_t ids[2] = { 0, 3 };
        float bias[2] = { -100, 100 };
        p.bias_id = ids;
        p.bias = bias;
        p.n_bias = 2;
        sampler *s = sampler_new(&p, 4, NULL, 0);
        int forced = 0;
        for (int d = 0; d < 200; d++) {
            float lg[4];
            logits_of(probs, 4, lg);
            sampler_sample(s, lg, &r);
            forced += r.token == 3;
        }
        is_int(forced, 200, "logit_bias +100 on a 5%% token: always chosen");
        float lg[4];
        logits_of(probs, 4, lg);
        sampler_sample(s, lg, &r);
        ok(fabs(r.logprob - log(0.05)) < 1e-5, "logprob of the biased token is the raw one (%f)",
           r.logprob);
        sampler_free(s);
        bias[1] = 0;
        p.top_logprobs = -1;
        p.top_p = 0.9f;
        s = sampler_new(&p, 4, NULL, 0);
        int zero = 0, masked = 0;
        uint64_t allow = (1u << 0) | (1u << 2) | (1u << 3);   /* token 1 not allowed */
        for (int d = 0; d < 2000; d++) {
            logits_of(probs, 4, lg);
            sampler_sample_masked(s, lg, &allow, &r);
            zero += r.token == 0;
            masked += r.token == 1;
        }
        ok(!zero && !masked, "logit_bias -100 and the mask: tokens 0 and 1 never chosen");
        sampler_free(s);
    }

    /* plain sampling follows the distribution (fixed seed: deterministic) */
    sampling_params_default(&p);
    p.has_seed = true;
    p.seed = 42;
    histogram(&p, probs, 4, 40000, count);
    int within = 1;
    for (int i = 0; i < 4; i++) {
        double f = count[i] / 40000.0;
        if (fabs(f - probs[i]) > 4 * sqrt(probs[i] * (1 - probs[i]) / 40000.0)) within = 0;
    }
    ok(within, "temperature 1 frequencies within 4 sigma (%d %d %d %d)", count[0],
       count[1], count[2], count[3]);

    /* temperature sharpens */
    p.temperature = 0.5f;
    histogram(&p, probs, 4, 20000, count);
    {
        /* p^2 normalized: .25/(.25+.09+.0225+.0025) = .685 */
        double f0 = count[0] / 20000.0;
        ok(fabs(f0 - 0.25 / 0.365) < 0.02, "temperature 0.5 squares the odds (%.3f)", f0);
    }

    p.temperature = 1;
    p.top_k = 2;
    histogram(&p, probs, 4, 5000, count);
    ok(count[2] == 0 && count[3] == 0 && count[0] > count[1] && count[1] > 0,
       "top_k 2 keeps the two most likely");
    p.top_k = -1;
    p.top_p = 0.7f;
    histogram(&p, probs, 4, 5000, count);
    ok(count[2] == 0 && count[3] == 0 && count[1] > 0, "top_p 0.7 keeps {0.5, 0.3}");
    p.top_p = 0.85f;
    histogram(&p, probs, 4, 5000, count);
    ok(count[2] > 0 && count[3] == 0, "top_p 0.85 keeps three");
    p.top_p = 1;
    p.min_p = 0.5f;
    histogram(&p, probs, 4, 5000, count);
    ok(count[1] > 0 && count[2] == 0 && count[3] == 0, "min_p 0.5 drops p < 0.25");
    p.min_p = 0;

    /* seeds: same seed same tokens; the large-vocab path too */
    {
        double big[1000];
        for (int i = 0; i < 1000; i++) big[i] = 1.0 / 1000;
        int a[50], b[50], c[50];
        for (int run = 0; run < 3; run++) {
            sampling_params q = p;
            q.seed = run == 2 ? 7 : 1234;
            sampler *s = sampler_new(&q, 1000, NULL, 0);
            float lg[1000];
            for (int t = 0; t < 50; t++) {
                logits_of(big, 1000, lg);
                sampler_sample(s, lg, &r);
                (run == 0 ? a : run == 1 ? b : c)[t] = r.token;
            }
            sampler_free(s);
        }
        ok(!memcmp(a, b, sizeof a), "same seed, same 50 tokens (1000-token vocab)");
        ok(memcmp(a, c, sizeof a) != 0, "another seed, another sequence");
        histogram(&p, big, 1000, 20000, count);
        int nonzero = 0;
        for (int i = 0; i < 1000; i++) nonzero += count[i] > 0;
        ok(nonzero > 990, "uniform 1000-token vocab reaches nearly every token (%d)", nonzero);
    }

    /* top-p over many candidates (the radix-sorted path): 20,000 tokens,
     * the even ids at probability 3x the odd ones', so the even ones hold
     * 75% of the mass: top_p 0.7 keeps even ids only (probability
     * descending, the lowest ids first among equals), top_p 0.8 all of them
     * and some odd ones */
    {
        enum { NV = 20000 };
        float *lg = malloc(NV * sizeof *lg);
        int odd = 0, odd8 = 0;
        for (int pass = 0; pass < 2; pass++) {
            sampling_params q;
            sampling_params_default(&q);
            q.top_p = pass ? 0.8f : 0.7f;
            q.has_seed = true;
            q.seed = 5;
            sampler *s = sampler_new(&q, NV, NULL, 0);
            for (int t = 0; t < 400; t++) {
                for (int i = 0; i < NV; i++) lg[i] = i % 2 ? 0.0f : logf(3.0f);
                sampler_sample(s, lg, &r);
                if (pass) odd8 += r.token % 2;
                else odd += r.token % 2;
            }
            sampler_free(s);
        }
        ok(odd == 0, "top_p 0.7 over 20,000 candidates keeps only the likelier half (%d odd)", odd);
        ok(odd8 > 0, "top_p 0.8 reaches into the less likely half (%d of 400)", odd8);
        free(lg);
    }

    /* penalties */
    {
        sampling_params q;
        sampling_params_default(&q);
        q.temperature = 0;
        q.repetition_penalty = 2;
        int32_t prompt[1] = { 0 };
        sampler *s = sampler_new(&q, 3, prompt, 1);
        float lg[3] = { 2.0f, 1.5f, -1.0f };
        sampler_sample(s, lg, &r);
        ok(r.token == 1 && lg[0] == 1.0f, "repetition penalty divides a positive prompt logit");
        sampler_free(s);

        q.repetition_penalty = 1;
        q.frequency_penalty = 0.6f;
        s = sampler_new(&q, 3, NULL, 0);
        float l1[3] = { 1.0f, 0.5f, 0.0f };
        sampler_sample(s, l1, &r);
        is_int(r.token, 0, "first pick is the argmax");
        float l2[3] = { 1.0f, 0.5f, 0.0f };
        sampler_sample(s, l2, &r);
        ok(r.token == 1 && fabsf(l2[0] - 0.4f) < 1e-6f, "frequency penalty after one use");
        sampler_free(s);

        q.frequency_penalty = 0;
        q.presence_penalty = 2;
        q.repetition_penalty = 1.5f;
        q.top_logprobs = 2;
        s = sampler_new(&q, 3, NULL, 0);
        float l3[3] = { 1.0f, 0.0f, -1.0f };
        sampler_sample(s, l3, &r);
        float l4[3] = { 1.0f, 0.0f, -1.0f };
        sampler_sample(s, l4, &r);
        double lse = log(exp(1.0) + exp(0.0) + exp(-1.0));
        ok(r.token == 1 && fabs(r.logprob - (0.0 - lse)) < 1e-5,
           "logprob is the raw model's even after penalties (%f)", r.logprob);
        ok(r.n_top == 2 && r.top_token[0] == 0 && r.top_token[1] == 1
           && fabs(r.top_logprob[0] - (1.0 - lse)) < 1e-5, "top_logprobs sorted, raw");
        sampler_free(s);
    }

    /* logprobs without alternatives */
    {
        sampling_params q;
        sampling_params_default(&q);
        q.temperature = 0;
        q.top_logprobs = 0;
        sampler *s = sampler_new(&q, 3, NULL, 0);
        float lg[3] = { 0.0f, 2.0f, 1.0f };
        sampler_sample(s, lg, &r);
        ok(r.token == 1 && r.n_top == 0 && r.logprob < 0 && r.logprob > -1,
           "logprobs with top_logprobs 0: the chosen token's only");
        sampler_free(s);
    }

    /* -inf never sampled */
    {
        sampling_params q;
        sampling_params_default(&q);
        q.has_seed = true;
        q.seed = 3;
        sampler *s = sampler_new(&q, 4, NULL, 0);
        int bad = 0;
        for (int t = 0; t < 2000; t++) {
            float lg[4] = { 0, -INFINITY, 0, -INFINITY };
            sampler_sample(s, lg, &r);
            bad += r.token == 1 || r.token == 3;
        }
        is_int(bad, 0, "banned (-inf) tokens never come out");
        sampler_free(s);
    }

    /* Whole-vocabulary draws (no top-k, top-p or min-p) sum the softmax a
     * block of 512 ids at a time; top_k = vocabulary size takes the
     * filtered path's single running sum.  The same seed gives the same
     * tokens (a draw could differ only within rounding of a boundary),
     * over 20,000 ids with -inf blocks, the mass in a few late ids or
     * spread flat; every logit -inf gives token 0 on both. */
    {
        enum { NV = 20000 };
        float *base = malloc(NV * sizeof *base), *lg = malloc(NV * sizeof *lg);
        int same = 0, draws = 0, zero = 0;
        for (int shape = 0; shape < 3; shape++) {
            for (int i = 0; i < NV; i++)
                base[i] = shape == 0   ? (i / 512) % 3 == 1 ? -INFINITY : (float)(i % 97) / 9.0f
                          : shape == 1 ? (i > NV - 40 ? 5.0f + i % 7 : -30.0f)
                                       : 0.0f;
            for (int t = 0; t < 2; t++) {
                sampling_params q;
                sampling_params_default(&q);
                q.has_seed = true;
                q.seed = 11 + shape;
                q.temperature = t ? 0.7f : 1.0f;
                sampler *a = sampler_new(&q, NV, NULL, 0);
                q.top_k = NV;
                sampler *b = sampler_new(&q, NV, NULL, 0);
                for (int d = 0; d < 300; d++) {
                    sample_result ra, rb;
                    memcpy(lg, base, NV * sizeof *lg);
                    sampler_sample(a, lg, &ra);
                    memcpy(lg, base, NV * sizeof *lg);
                    sampler_sample(b, lg, &rb);
                    same += ra.token == rb.token && base[ra.token] > -INFINITY;
                    draws++;
                }
                for (int i = 0; i < NV; i++) lg[i] = -INFINITY;
                sample_result ra, rb;
                sampler_sample(a, lg, &ra);
                for (int i = 0; i < NV; i++) lg[i] = -INFINITY;
                sampler_sample(b, lg, &rb);
                zero += ra.token == 0 && rb.token == 0;
                sampler_free(a);
                sampler_free(b);
            }
        }
        is_int(same, draws, "whole-vocabulary draws by blocks equal the single sum's (%d draws)",
               draws);
        is_int(zero, 6, "every logit -inf: token 0 either way");
        free(base);
        free(lg);
    }

    /* top_p over a large, peaked vocabulary (the candidates near the top
     * hold the mass: the sampler sorts only those): every draw is in the
     * set a brute-force sort gives (probabilities descending, ids
     * ascending, the shortest run with mass >= top_p), and each of its
     * few members comes out. */
    {
        enum { NV = 20000, TOP = 12 };
        float *lg = malloc(NV * sizeof *lg);
        double *pr = malloc(NV * sizeof *pr), tot = 0;
        for (int i = 0; i < NV; i++) {
            float v = (float)(i % 101) / 25.0f + (i % 1667 == 5 ? 14.0f + (float)(i % 3) : 0.0f);
            pr[i] = exp((double)v / 0.6), tot += pr[i];
        }
        /* the reference set: the TOP largest, in order, until the mass */
        int order[TOP], nset = 0;
        double mass = 0;
        for (int k = 0; k < TOP && mass < 0.9 * tot; k++) {
            int best = -1;
            for (int i = 0; i < NV; i++) {
                bool used = false;
                for (int j = 0; j < k; j++) used |= order[j] == i;
                if (!used && (best < 0 || pr[i] > pr[best])) best = i;
            }
            order[k] = best, mass += pr[best], nset = k + 1;
        }
        sampling_params q;
        sampling_params_default(&q);
        q.has_seed = true;
        q.seed = 21;
        q.temperature = 0.6f;
        q.top_p = 0.9f;
        sampler *sp = sampler_new(&q, NV, NULL, 0);
        int out = 0, seen[TOP] = { 0 };
        for (int d = 0; d < 3000; d++) {
            for (int i = 0; i < NV; i++)
                lg[i] = (float)(i % 101) / 25.0f + (i % 1667 == 5 ? 14.0f + (float)(i % 3) : 0.0f);
            sampler_sample(sp, lg, &r);
            int k = 0;
            while (k < nset && order[k] != r.token) k++;
            if (k == nset) out++;
            else seen[k]++;
        }
        int missing = 0;
        for (int k = 0; k < nset; k++) missing += seen[k] == 0;
        ok(mass >= 0.9 * tot && !out && !missing, "top_p 0.9 over 20,000 ids, peaked: draws "
           "only from the %d-token reference set (%d outside), each of it seen (%d not)", nset,
           out, missing);
        sampler_free(sp);
        free(lg);
        free(pr);
    }

    /* stop strings across token boundaries */
    {
        const char *stops[] = { "END", "<|x|>" };
        stop_matcher m;
        strbuf out;
        sb_init(&out);
        stop_init(&m, stops, 2);
        const char *pieces[] = { "hello E", "N", "ough <|", "x", "|> tail" };
        bool hit = false;
        for (int i = 0; i < 5 && !hit; i++) hit = stop_feed(&m, pieces[i], strlen(pieces[i]), &out);
        ok(hit && m.which == 1, "stop string split over three tokens matches");
        is_str(out.data, "hello ENough ", "text before the stop, held prefix released");
        stop_free(&m);

        sb_reset(&out);
        stop_init(&m, stops, 2);
        stop_feed(&m, "abc EN", 6, &out);
        is_str(out.data, "abc ", "possible prefix held back");
        stop_flush(&m, &out);
        is_str(out.data, "abc EN", "flush releases held text at the end");
        stop_free(&m);

        sb_reset(&out);
        const char *st2[] = { "bc", "abcd" };
        stop_init(&m, st2, 2);
        hit = stop_feed(&m, "xxabcd", 6, &out);
        ok(hit && m.which == 1, "the earliest-starting match wins");
        is_str(out.data, "xx", "output ends before the stop");
        ok(stop_feed(&m, "more", 4, &out) && !strcmp(out.data, "xx"), "nothing after a match");
        stop_free(&m);

        sb_reset(&out);
        stop_init(&m, NULL, 0);
        stop_feed(&m, "abc", 3, &out);
        is_str(out.data, "abc", "no stops: pass-through");
        stop_free(&m);
        sb_free(&out);
    }
    /* greedy_only: the argmax of the raw logits and nothing else (the
     * runner then takes the model's device-side argmax); sampler_record
     * counts that token as sampling would (the frequency penalty sees it) */
    {
        sampling_params g;
        sampling_params_default(&g);
        g.temperature = 0;
        sampler *s = sampler_new(&g, 4, NULL, 0);
        ok(sampler_greedy_only(s), "greedy without penalties, bias or logprobs is greedy_only");
        sampler_free(s);
        int32_t bid = 1;
        float bv = 1;
        sampling_params v[5];
        for (int i = 0; i < 5; i++) v[i] = g;
        v[0].temperature = 0.5f, v[1].top_logprobs = 0, v[2].frequency_penalty = 0.5f;
        v[3].repetition_penalty = 1.1f, v[4].bias_id = &bid, v[4].bias = &bv, v[4].n_bias = 1;
        bool none = true;
        for (int i = 0; i < 5; i++) {
            s = sampler_new(&v[i], 4, NULL, 0);
            none &= !sampler_greedy_only(s);
            sampler_free(s);
        }
        ok(none, "temperature, logprobs, penalties or a bias: not greedy_only");
        g.frequency_penalty = 10;
        s = sampler_new(&g, 4, NULL, 0);
        sampler_record(s, 2);
        float lg[4] = { 0, 0, 5, 0 };
        sample_result r2;
        sampler_sample(s, lg, &r2);
        ok(r2.token == 0, "a recorded token is penalized as a sampled one (got %d)", r2.token);
        sampler_free(s);
    }
    return exit_status();
}
