/* llm-engine synth --out DIR [--preset tiny|mid | --config CONFIG.json [--layers N]]
 *                  [--seed N] [--shards N] [--tokenizer FILE]
 * Writes a synthetic DeepSeek V4 checkpoint in the released format:
 * config.json, safetensors shards with DeepSeek's index json, FP8 blocks
 * with UE8M0 scales, MXFP4 experts, BF16/F32 where the release has them.
 * --config takes the shapes of a real config (its first N layers), with
 * weights drawn as random codes of their format (synth_spec.codes): the
 * 6-layer V4-Flash (23 GB) in seconds, for load and serving benchmarks.
 * --tokenizer copies a tokenizer.json in, so `serve` can use the dir. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "synth_model.h"

static int usage(void)
{
    fprintf(stderr, "usage: llm-engine synth --out DIR [--preset tiny|mid | --config CONFIG.json "
            "[--layers N]] [--seed N] [--shards N] [--tokenizer FILE]\n");
    return 2;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int copy_file(const char *from, const char *dir, const char *name, strbuf *err)
{
    strbuf data, path;
    sb_init(&data);
    sb_init(&path);
    int rc = -1;
    sb_printf(&path, "%s/%s", dir, name);
    if (sb_read_file(&data, from)) {
        sb_printf(err, "%s: cannot read\n", from);
    } else {
        FILE *f = fopen(path.data, "wb");
        if (f && fwrite(data.data, 1, data.len, f) == data.len && !fclose(f)) rc = 0;
        else {
            if (f) fclose(f);
            sb_printf(err, "%s: cannot write\n", path.data);
        }
    }
    sb_free(&data);
    sb_free(&path);
    return rc;
}

int cmd_synth(int argc, char **argv)
{
    const char *out = NULL, *preset = NULL, *config = NULL, *tokenizer = NULL;
    unsigned long long seed = 1;
    int shards = 1, layers = 0;
    if (argc % 2 == 0) return usage();
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--preset")) preset = v;
        else if (!strcmp(a, "--config")) config = v;
        else if (!strcmp(a, "--layers")) layers = atoi(v);
        else if (!strcmp(a, "--tokenizer")) tokenizer = v;
        else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--shards")) shards = atoi(v);
        else return usage();
    }
    if (!out || (preset && config) || shards < 1 || layers < 0 || (layers && !config))
        return usage();
    strbuf err;
    sb_init(&err);
    synth_spec s;
    if (config) {
        v4_config c;
        if (v4_config_load(&c, config, &err)) {
            fprintf(stderr, "llm-engine synth: %s", err.data);
            sb_free(&err);
            return 1;
        }
        int rc = synth_spec_from_config(&s, &c, layers, &err);
        v4_config_free(&c);
        if (rc) {
            fprintf(stderr, "llm-engine synth: %s: %s", config, err.data);
            sb_free(&err);
            return 1;
        }
    } else if (synth_preset(&s, preset ? preset : "tiny")) {
        fprintf(stderr, "llm-engine synth: unknown preset %s (tiny, mid)\n", preset);
        return 2;
    }
    double t0 = now();
    int rc = synth_write_dir(&s, seed, out, shards, &err);
    if (!rc && tokenizer) rc = copy_file(tokenizer, out, "tokenizer.json", &err);
    if (rc) fprintf(stderr, "llm-engine synth: %s", err.data);
    else
        printf("wrote %s: %d layers in %d shard%s, %.1f s\n", out, s.layers, shards,
               shards > 1 ? "s" : "", now() - t0);
    sb_free(&err);
    return rc ? 1 : 0;
}
