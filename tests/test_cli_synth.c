/* llm-engine synth --config: a released-format checkpoint of a config's
 * shapes (first N layers, codes of each format) that the loader takes
 * and runs to finite logits; DeepSeek's index json; a small router bias;
 * errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "json.h"
#include "model.h"
#include "safetensors.h"
#include "cli_run.h"
#include "strbuf.h"
#include "tap.h"

int main(void)
{
    char dir[] = "/tmp/test_cli_synth_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    strbuf out, args, path;
    sb_init(&out);
    sb_init(&args);
    sb_init(&path);
    sb_printf(&args, "synth --config tests/fixtures/demo/config.json --layers 3 --shards 2 "
              "--tokenizer tests/fixtures/demo/tokenizer.json --out %s/m", dir);
    int rc = engine_cli(args.data, &out);
    is_int(rc, 0, "synth --config --layers 3 --shards 2 exits 0");
    if (rc) diag("%s", out.data);
    ok(strstr(out.data, "3 layers in 2 shards") != NULL, "it says what it wrote");

    sb_printf(&path, "%s/m/model.safetensors.index.json", dir);
    strbuf idx;
    sb_init(&idx);
    ok(sb_read_file(&idx, path.data) == 0, "the index json exists");
    char err[128];
    yajl_val v = json_parse(idx.data ? idx.data : "", idx.len, err, sizeof err);
    yajl_val map = json_get(v, "weight_map");
    const char *f1 = json_string(json_get(map, "embed.weight"));
    const char *f2 = json_string(json_get(map, "layers.2.ffn.experts.7.w2.weight"));
    ok(f1 && !strcmp(f1, "model-00001-of-00002.safetensors"), "index: embed in shard 1");
    ok(f2 && !strcmp(f2, "model-00002-of-00002.safetensors"), "index: layer 2's last expert in shard 2");
    ok(!json_get(map, "layers.3.attn_norm.weight"), "no layer past --layers");
    yajl_tree_free(v);
    sb_free(&idx);

    sb_reset(&path);
    sb_printf(&path, "%s/m", dir);
    /* The router's bias small, as a trained router's balances the load:
     * a large one (std 0.1 before) sent a batch to fewer experts than a
     * trained model's (model_weights.c's synth_data says how many). */
    safetensors st;
    strbuf se;
    sb_init(&se);
    const st_tensor *gb = NULL;
    if (st_open_dir(&st, path.data, &se) == 0) {
        gb = st_find(&st, "layers.1.ffn.gate.bias");
        float amax = 1;
        if (gb && gb->dtype == ST_F32) {
            amax = 0;
            for (int64_t i = 0; i < st_numel(gb); i++)
                amax = fmaxf(amax, fabsf(((const float *)gb->data)[i]));
        }
        ok(gb && amax < 0.05f, "layer 1's router bias is small (|b| <= %g)", amax);
        st_close(&st);
    } else {
        ok(0, "the checkpoint opens: %s", se.data ? se.data : "");
    }
    sb_free(&se);
    v4_options o = { .tp = 2, .threads_per_rank = 1, .cache_tokens = 64 };
    v4_model *m = NULL;
    strbuf e;
    sb_init(&e);
    rc = v4_model_load(&m, path.data, &o, &e);
    is_int(rc, 0, "the loader takes it (tp 2)");
    if (rc) diag("%s", e.data);
    if (m) {
        const v4_config *c = v4_model_config(m);
        is_int(c->n_layers, 3, "3 layers");
        is_int(c->ratio[1], 4, "layer 1 keeps the config's compress ratio (CSA)");
        is_int(c->ratio[2], 128, "layer 2 keeps the config's compress ratio (HCA)");
        int32_t ids[16];
        for (int i = 0; i < 16; i++) ids[i] = (i * 37 + 5) % c->vocab_size;
        float *logits = malloc(c->vocab_size * sizeof *logits);
        v4_seq *s = v4_seq_new(m, &e);
        v4_step_item it = { s, ids, 16, logits, false, NULL };
        is_int(v4_step(m, &it, 1, &e), 0, "a 16-token step runs");
        int bad = 0;
        double ss = 0;
        for (int i = 0; i < c->vocab_size; i++) bad += !isfinite(logits[i]), ss += logits[i] * logits[i];
        is_int(bad, 0, "logits finite");
        ok(ss > 0, "logits not all zero");
        v4_seq_free(m, s);
        free(logits);
        v4_model_free(m);
    }
    sb_free(&e);

    rc = engine_cli("synth --layers 2 --out /tmp/x", &out);
    is_int(rc, 2, "--layers without --config is a usage error");
    sb_reset(&args);
    sb_printf(&args, "synth --config %s/none.json --out %s/n", dir, dir);
    rc = engine_cli(args.data, &out);
    is_int(rc, 1, "a missing config fails");
    ok(strstr(out.data, "none.json") != NULL, "naming the file: %s", out.data);

    sb_reset(&args);
    sb_printf(&args, "rm -rf %s", dir);
    if (system(args.data)) diag("could not remove %s", dir);
    sb_free(&out);
    sb_free(&args);
    sb_free(&path);
    return exit_status();
}
