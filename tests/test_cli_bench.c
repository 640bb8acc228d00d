/* llm-engine bench --batch on the CPU with the demo model: every batch
 * size decodes and reports, the experts a step reads grow from topk to
 * at most all of them, the aggregate rate is B / per-sequence time, and a
 * bad list is a usage error.  bench --prefix-repeat: every round reports
 * a cold TTFT and the repeat's from the pool and from the host tier, each
 * resuming at the prompt's last block boundary, the host one after
 * copying entries back.  Never asserts speed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_run.h"
#include "strbuf.h"
#include "tap.h"

int main(void)
{
    strbuf out;
    sb_init(&out);
    int rc = engine_cli("bench --model tests/fixtures/demo --batch 1,3,8 --prompt 24 --decode 8 "
                 "--threads 1", &out);
    is_int(rc, 0, "bench --batch 1,3,8 exits 0");
    if (rc) diag("%s", out.data);
    ok(!strstr(out.data, "NOT finite"), "every sequence's logits are finite");
    const int bs[] = { 1, 3, 8 };
    double prev_experts = 0;
    for (int i = 0; i < 3; i++) {
        char key[32];
        snprintf(key, sizeof key, "decode B=%-3d", bs[i]);
        const char *l = strstr(out.data, key);
        ok(l != NULL, "a decode line for B=%d", bs[i]);
        if (!l) continue;
        int steps = 0, ctx = 0, E = 0;
        double ms = 0, agg = 0, gb = 0, experts = 0;
        int got = sscanf(l + strlen(key), " %d steps at context %d: %lf ms/token per sequence = "
                         "%lf tokens/s aggregate; %lf GB per step per rank (%lf of %d experts",
                         &steps, &ctx, &ms, &agg, &gb, &experts, &E);
        is_int(got, 7, "B=%d: the line parses", bs[i]);
        is_int(steps, 6, "B=%d: 6 timed steps after 2 warm-up steps", bs[i]);
        is_int(ctx, 26, "B=%d: at context prompt + warm-up", bs[i]);
        ok(ms > 0 && agg > 0 && gb > 0, "B=%d: positive times, rate and bytes", bs[i]);
        double want = bs[i] * 1000.0 / ms;
        ok(agg > want * 0.99 && agg < want * 1.01,
           "B=%d: aggregate %.1f tokens/s = B / per-sequence time (%.1f)", bs[i], agg, want);
        if (bs[i] == 1) ok(experts == 2, "B=1 reads topk = 2 experts per layer (%.1f)", experts);
        else ok(experts > prev_experts && experts <= E,
                "B=%d reads more experts (%.2f) than a smaller batch, at most all %d", bs[i],
                experts, E);
        prev_experts = experts;
    }

    rc = engine_cli("bench --model tests/fixtures/demo --prompt 300 --prefix-repeat 40 "
                    "--rounds 2 --chunk 128 --kv-offloading-size 0.05 --threads 1", &out);
    is_int(rc, 0, "bench --prefix-repeat exits 0");
    if (rc) diag("%s", out.data);
    for (int r = 1; r <= 2; r++) {
        char key[16];
        snprintf(key, sizeof key, "\n| %d | ", r);
        const char *l = strstr(out.data, key);
        double cold = 0, gpu = 0, gpct = 0, host = 0, hpct = 0, mb = 0;
        long long gc = -1, hc = -1, fills = -1;
        int got = l ? sscanf(l + strlen(key), "%lf | %lf | %lld | %lf%% | %lf | %lld | %lf%% | "
                             "%lld, %lf |", &cold, &gpu, &gc, &gpct, &host, &hc, &hpct, &fills,
                             &mb) : 0;
        is_int(got, 9, "prefix-repeat round %d: the row parses", r);
        ok(cold > 0 && gpu > 0 && host > 0 && gc == 256 && hc == 256,
           "round %d: both repeats resume at the prompt's last boundary (256 of 300)", r);
        ok(fills == 2 && mb > 0, "round %d: the host-tier repeat copies its 2 blocks back (%lld, "
           "%.2f MB)", r, fills, mb);
    }
    ok(strstr(out.data, "best of 2: cold ") != NULL, "a best-of line");
    rc = engine_cli("bench --model tests/fixtures/demo --prompts 100,200 --prefix-repeat 10", &out);
    is_int(rc, 2, "--prefix-repeat with two prompt lengths is a usage error");

    rc = engine_cli("bench --model tests/fixtures/demo --batch 0 --prompt 8", &out);
    is_int(rc, 2, "--batch 0 is a usage error");
    rc = engine_cli("bench --model tests/fixtures/demo --batch 2,x --prompt 8", &out);
    is_int(rc, 2, "--batch 2,x is a usage error");
    rc = engine_cli("bench --model tests/fixtures/demo --batch 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,"
                    "16,17 --prompt 8", &out);
    ok(rc == 2 && strstr(out.data, "--batch takes at most 16 values"),
       "--batch of 17 values: a usage error naming the limit (none dropped silently)");
    sb_free(&out);
    return exit_status();
}
