/* safetensors reader and the released-format weight loader: round trips,
 * shards, and every kind of broken checkpoint stopping with one message
 * that names the file and tensor. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model.h"
#include "safetensors.h"
#include "synth_model.h"
#include "tap.h"

static char tmp[64];

/* Error text without its final newline, for test descriptions. */
static const char *msg(strbuf *e)
{
    while (e->len && e->data[e->len - 1] == '\n') e->data[--e->len] = 0;
    return e->len ? e->data : "(no error)";
}

static const char *path(const char *name)
{
    static char p[4][160];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", tmp, name);
    return p[k];
}

/* A safetensors file from a header string and raw data bytes. */
static void write_raw(const char *file, const char *header, const void *data, size_t n)
{
    FILE *f = fopen(file, "wb");
    uint64_t len = strlen(header);
    fwrite(&len, 8, 1, f);
    fwrite(header, 1, len, f);
    fwrite(data, 1, n, f);
    fclose(f);
}

static int open_err(const char *file, const char *want, const char *what)
{
    safetensors st;
    strbuf err;
    sb_init(&err);
    int rc = st_open_file(&st, file, &err);
    int good = rc < 0 && strstr(err.data, want) && strstr(err.data, file);
    ok(good, "%s: %s", what, msg(&err));
    if (rc == 0) st_close(&st);
    sb_free(&err);
    return good;
}

static void test_safetensors(void)
{
    st_writer w;
    stw_init(&w);
    int64_t s23[2] = { 2, 3 }, s4[1] = { 4 }, s5[1] = { 5 };
    float *f = stw_add(&w, "a.f32", ST_F32, 2, s23)->data;
    for (int i = 0; i < 6; i++) f[i] = i * 0.5f;
    int64_t *q = stw_add(&w, "b.i64", ST_I64, 1, s4)->data;
    for (int i = 0; i < 4; i++) q[i] = -i;
    memset(stw_add(&w, "c.e8m0", ST_F8_E8M0, 1, s5)->data, 127, 5);
    strbuf err;
    sb_init(&err);
    ok(stw_write(&w, path("one.safetensors"), &err) == 0, "write one file");
    safetensors st;
    ok(st_open_file(&st, path("one.safetensors"), &err) == 0, "read it back");
    const st_tensor *t = st_find(&st, "a.f32");
    ok(t && t->dtype == ST_F32 && t->ndim == 2 && t->shape[1] == 3
       && ((const float *)t->data)[5] == 2.5f, "F32 tensor: dtype, shape, data");
    t = st_find(&st, "b.i64");
    ok(t && ((const int64_t *)t->data)[3] == -3 && st_numel(t) == 4, "I64 tensor");
    ok(st_find(&st, "nope") == NULL && st.ntensors == 3, "unknown names are not found");
    st_close(&st);

    mkdir(path("shards"), 0755);
    ok(stw_write_dir(&w, path("shards"), 3, &err) == 0, "write 3 shards + index");
    ok(st_open_dir(&st, path("shards"), &err) == 0 && st.nfiles == 3 && st.ntensors == 3
       && st_find(&st, "c.e8m0"), "sharded checkpoint opens through the index");
    st_close(&st);
    stw_free(&w);

    /* Broken files. */
    float data[4] = { 1, 2, 3, 4 };
    write_raw(path("trunc.st"), "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
              data, 12);
    open_err(path("trunc.st"), "tensor x: data_offsets [0, 16] past the end", "truncated data");
    write_raw(path("len.st"), "{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}",
              data, 16);
    open_err(path("len.st"), "tensor x: 16 bytes for shape x F32 = 12 bytes", "shape x dtype != length");
    write_raw(path("dt.st"), "{\"x\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]}}",
              data, 16);
    open_err(path("dt.st"), "tensor x: unsupported dtype F64", "unknown dtype");
    write_raw(path("json.st"), "{\"x\":{\"dtype\":\"F32\",", data, 16);
    open_err(path("json.st"), "header is not a JSON object", "header JSON");
    write_raw(path("keys.st"), "{\"x\":{\"dtype\":\"F32\",\"shape\":[4]}}", data, 16);
    open_err(path("keys.st"), "tensor x: header entry needs", "missing data_offsets");
    write_raw(path("neg.st"), "{\"x\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}}",
              data, 16);
    open_err(path("neg.st"), "shape must hold non-negative integers", "negative dimension");
    FILE *fp = fopen(path("hlen.st"), "wb");
    uint64_t big = 1000;
    fwrite(&big, 8, 1, fp);
    fwrite("{}", 1, 2, fp);
    fclose(fp);
    open_err(path("hlen.st"), "header length 1000 exceeds the file", "header length past the end");
    fp = fopen(path("short.st"), "wb");
    fwrite("abc", 1, 3, fp);
    fclose(fp);
    open_err(path("short.st"), "too short", "file shorter than the length prefix");

    /* An F32 tensor at an odd offset is still read correctly (aligned copy). */
    uint8_t odd[17] = { 0 };
    float v = 3.25f;
    memcpy(odd + 1, &v, 4);
    write_raw(path("odd.st"), "{\"p\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
              "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[1,5]}}", odd, 5);
    ok(st_open_file(&st, path("odd.st"), &err) == 0 && *(const float *)st_find(&st, "y")->data == 3.25f
       && (uintptr_t)st_find(&st, "y")->data % 4 == 0, "misaligned F32 data is copied aligned");
    st_close(&st);

    /* Index naming a tensor that its shard lacks; tensor in two shards. */
    mkdir(path("badidx"), 0755);
    write_raw(path("badidx/a.safetensors"), "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", data, 4);
    write_raw(path("badidx/b.safetensors"), "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", data, 4);
    fp = fopen(path("badidx/model.safetensors.index.json"), "w");
    fputs("{\"weight_map\":{\"x\":\"a.safetensors\",\"y\":\"b.safetensors\"}}", fp);
    fclose(fp);
    sb_reset(&err);
    int rc = st_open_dir(&st, path("badidx"), &err);
    ok(rc < 0 && strstr(err.data, "tensor x appears twice"), "a tensor in two shards: %s",
       msg(&err));
    sb_reset(&err);
    fp = fopen(path("badidx/model.safetensors.index.json"), "w");
    fputs("{\"weight_map\":{\"x\":\"a.safetensors\",\"y\":\"a.safetensors\"}}", fp);
    fclose(fp);
    rc = st_open_dir(&st, path("badidx"), &err);
    ok(rc < 0 && strstr(err.data, "tensor y: listed in a.safetensors but not found there"),
       "index entry missing from its shard: %s", msg(&err));
    sb_reset(&err);
    rc = st_open_dir(&st, path("nothing-here"), &err);
    ok(rc < 0 && strstr(err.data, "no model.safetensors.index.json or model.safetensors"),
       "empty directory: %s", msg(&err));
    sb_free(&err);
}

/* Write the tiny synthetic checkpoint to dir, with an edit applied. */
typedef void (*edit_fn)(st_writer *w);

static void write_model(const char *dir, edit_fn edit, const char *cfg_from, const char *cfg_to)
{
    synth_spec s;
    synth_preset(&s, "tiny");
    mkdir(dir, 0755);
    st_writer w;
    stw_init(&w);
    synth_tensors(&s, 7, &w);
    if (edit) edit(&w);
    strbuf err, cfg, p;
    sb_init(&err);
    sb_init(&cfg);
    sb_init(&p);
    stw_write_dir(&w, dir, 2, &err);
    synth_config_json(&s, &cfg);
    char *hit = cfg_from ? strstr(cfg.data, cfg_from) : NULL;
    sb_printf(&p, "%s/config.json", dir);
    FILE *f = fopen(p.data, "w");
    if (hit) {
        fwrite(cfg.data, 1, hit - cfg.data, f);
        fputs(cfg_to, f);
        fputs(hit + strlen(cfg_from), f);
    } else {
        fputs(cfg.data, f);
    }
    fclose(f);
    stw_free(&w);
    sb_free(&err);
    sb_free(&cfg);
    sb_free(&p);
}

static void load_fails(const char *name, edit_fn edit, const char *cfg_from, const char *cfg_to,
                       int tp, const char *want)
{
    const char *dir = path(name);
    write_model(dir, edit, cfg_from, cfg_to);
    v4_options o = { .tp = tp, .threads_per_rank = 1 };
    v4_model *m = (v4_model *)1;
    strbuf err;
    sb_init(&err);
    int rc = v4_model_load(&m, dir, &o, &err);
    int lines = 0;
    for (size_t i = 0; i < err.len; i++) lines += err.data[i] == '\n';
    ok(rc < 0 && m == NULL && strstr(err.data, want) && lines == 1, "%s: %s", name, msg(&err));
    if (rc == 0) v4_model_free(m);
    sb_free(&err);
}

static void rm_scale(st_writer *w) { stw_remove(w, "layers.1.attn.wq_b.scale"); }
static void rm_expert(st_writer *w) { stw_remove(w, "layers.3.ffn.experts.5.w2.weight"); }
static void add_unknown(st_writer *w)
{
    int64_t s[1] = { 4 };
    stw_add(w, "layers.1.attn.bogus", ST_F32, 1, s);
}
static void add_mtp(st_writer *w)
{
    int64_t s[1] = { 4 };
    stw_add(w, "mtp.0.attn.wq_a.weight", ST_BF16, 1, s);
}
static void bad_dtype(st_writer *w)
{
    int64_t s[2] = { 48, 64 };
    stw_add(w, "layers.0.attn.wq_a.weight", ST_BF16, 2, s);
}
static void bad_shape(st_writer *w)
{
    int64_t s[2] = { 64, 31 };
    stw_add(w, "layers.2.ffn.experts.0.w1.weight", ST_I8, 2, s);
}
static void bad_tid(st_writer *w)
{
    ((int64_t *)stw_get(w, "layers.0.ffn.gate.tid2eid")->data)[5] = 6;
}
static void bad_scale_shape(st_writer *w)
{
    int64_t s[2] = { 1, 2 };
    stw_add(w, "layers.0.attn.wkv.scale", ST_F8_E8M0, 2, s);
}

static void test_weights(void)
{
    const char *dir = path("good");
    write_model(dir, NULL, NULL, NULL);
    v4_options o = { .tp = 1, .threads_per_rank = 1 };
    v4_model *m;
    strbuf err;
    sb_init(&err);
    int rc = v4_model_load(&m, dir, &o, &err);
    ok(rc == 0, "tiny synthetic checkpoint loads %s", msg(&err));
    if (m) v4_model_free(m);
    o.tp = 2;
    rc = v4_model_load(&m, dir, &o, &err);
    ok(rc == 0, "and loads at tp 2 %s", msg(&err));
    if (m) v4_model_free(m);
    sb_free(&err);

    load_fails("noscale", rm_scale, NULL, NULL, 1, "tensor layers.1.attn.wq_b.scale: missing");
    load_fails("noexpert", rm_expert, NULL, NULL, 1, "tensor layers.3.ffn.experts.5.w2.weight: missing");
    load_fails("unknown", add_unknown, NULL, NULL, 1, "safetensors: tensor layers.1.attn.bogus: unknown");
    load_fails("dtype", bad_dtype, NULL, NULL, 1,
               "safetensors: tensor layers.0.attn.wq_a.weight: dtype BF16, expected F8_E4M3");
    load_fails("shape", bad_shape, NULL, NULL, 1,
               "tensor layers.2.ffn.experts.0.w1.weight: shape [64, 31], expected [64, 32]");
    load_fails("scaleshape", bad_scale_shape, NULL, NULL, 1,
               "tensor layers.0.attn.wkv.scale: shape [1, 2], expected [1, 1]");
    load_fails("tid", bad_tid, NULL, NULL, 1, "tensor layers.0.ffn.gate.tid2eid: entry 5 is expert 6");
    load_fails("cfgtype", NULL, "\"sliding_window\": 8", "\"sliding_window\": true", 1,
               "config.json: sliding_window: expected an integer");
    load_fails("fewlayers", NULL, "\"num_hidden_layers\": 4", "\"num_hidden_layers\": 3", 1,
               "tensor layers.3.attn.attn_sink: unknown");
    load_fails("morelayers", NULL, "\"num_hidden_layers\": 4", "\"num_hidden_layers\": 5", 1,
               "tensor layers.4.attn_norm.weight: missing");
    load_fails("experts", NULL, "\"n_routed_experts\": 6", "\"n_routed_experts\": 7", 1,
               "tensor layers.0.ffn.gate.weight: shape [6, 64], expected [7, 64]");

    /* Draft-layer tensors are skipped; I32 tid2eid is accepted. */
    write_model(path("mtp"), add_mtp, NULL, NULL);
    sb_init(&err);
    o.tp = 1;
    rc = v4_model_load(&m, path("mtp"), &o, &err);
    ok(rc == 0, "mtp.* tensors are skipped %s", msg(&err));
    if (m) v4_model_free(m);

    /* A shard cut short: the reader names the file. */
    char shard[200];
    snprintf(shard, sizeof shard, "%s/model-00002-of-00002.safetensors", path("good"));
    struct stat sbuf;
    stat(shard, &sbuf);
    if (truncate(shard, sbuf.st_size - 100) == 0) {
        sb_reset(&err);
        rc = v4_model_load(&m, path("good"), &o, &err);
        ok(rc < 0 && strstr(err.data, "model-00002-of-00002.safetensors: tensor")
           && strstr(err.data, "past the end"), "truncated shard: %s", msg(&err));
    } else {
        ok(0, "truncate shard");
    }
    sb_reset(&err);
    rc = v4_model_load(&m, path("missing"), &o, &err);
    ok(rc < 0 && strstr(err.data, "config.json: cannot read"), "missing checkpoint directory: %s",
       msg(&err));
    sb_free(&err);
}

int main(void)
{
    snprintf(tmp, sizeof tmp, "/tmp/test_model_loader.XXXXXX");
    if (!mkdtemp(tmp)) return 1;
    test_safetensors();
    test_weights();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd)) diag("could not remove %s", tmp);
    return exit_status();
}
