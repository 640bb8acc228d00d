/* The tokenizer against HF tokenizers' golden ids and decodes
 * (tests/fixtures/tokenizer, made by tools/make_tokenizer.py).
 *   build/tests/test_tokenizer_golden                  committed fixtures
 *   build/tests/test_tokenizer_golden TOKENIZER GOLDEN  any pair, e.g. one
 *       made with make_tokenizer.py --golden-only for DeepSeek's file */
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "tap.h"
#include "tokenizer.h"

/* A golden string with its byte length: yajl's tree keeps all decoded
 * bytes, including U+0000, and terminates them; "bytes" says where. */
static const char *golden_str(yajl_val obj, const char *key, const char *len_key, size_t *len)
{
    const char *s = json_string(json_get(obj, key));
    long long n;
    if (!s || !json_int(json_get(obj, len_key), &n) || n < (long long)strlen(s)) return NULL;
    *len = (size_t)n;
    return s;
}

static bool ids_equal(const tok_ids *got, yajl_val want, const char *what)
{
    size_t n = json_len(want);
    size_t i = 0;
    for (; i < n && i < got->len; i++) {
        long long w;
        if (!json_int(want->u.array.values[i], &w) || w != got->data[i]) break;
    }
    if (i == n && n == got->len) return true;
    diag("%s: %zu ids, want %zu; first difference at index %zu", what, got->len, n, i);
    for (size_t k = i > 3 ? i - 3 : 0; k < i + 4; k++) {
        long long w = -1;
        if (k < n) json_int(want->u.array.values[k], &w);
        diag("  [%zu] got %d want %lld", k, k < got->len ? got->data[k] : -1, w);
    }
    return false;
}

static bool text_equal(const strbuf *got, const char *want, size_t n, const char *what)
{
    if (got->len == n && !memcmp(got->data, want, n)) return true;
    size_t i = 0;
    while (i < n && i < got->len && got->data[i] == want[i]) i++;
    diag("%s: %zu bytes, want %zu; first difference at byte %zu", what, got->len, n, i);
    return false;
}

static void check_encode(const tokenizer *t, yajl_val e)
{
    const char *name = json_string(json_get(e, "name"));
    size_t len;
    const char *text = golden_str(e, "text", "bytes", &len);
    yajl_val special = json_get(e, "ids_special"), plain = json_get(e, "ids_plain");
    if (!name || !text || !special || !plain) {
        ok(0, "encode entry is well-formed");
        return;
    }
    for (int mode = 0; mode < 2; mode++) {
        tok_ids ids = { 0 };
        int rc = tok_encode(t, text, len, mode == 0, &ids);
        char what[160];
        snprintf(what, sizeof what, "%s: %s", name, mode == 0 ? "special tokens recognized" : "all text ordinary");
        if (rc) diag("%s: %s", what, tok_strerror(rc));
        ok(!rc && ids_equal(&ids, mode == 0 ? special : plain, what), "encode %s", what);
        tok_ids_free(&ids);
    }
}

/* Whole decode, and one id at a time: every chunk valid UTF-8, the chunks
 * adding up to the golden text. */
static void check_decode(const tokenizer *t, yajl_val d, size_t index)
{
    yajl_val ids = json_get(d, "ids");
    size_t n = json_len(ids);
    for (int skip = 0; skip < 2; skip++) {
        size_t want_len;
        const char *want = golden_str(d, skip ? "text_skip_special" : "text",
                                      skip ? "bytes_skip_special" : "bytes", &want_len);
        if (!want) {
            ok(0, "decode entry %zu is well-formed", index);
            return;
        }
        char what[96];
        snprintf(what, sizeof what, "decode[%zu] (%zu ids%s)", index, n, skip ? ", skip special" : "");
        int32_t *v = malloc((n ? n : 1) * sizeof *v);
        for (size_t i = 0; i < n; i++) {
            long long x = -1;
            json_int(ids->u.array.values[i], &x);
            v[i] = (int32_t)x;
        }
        strbuf whole, chunk, all;
        sb_init(&whole);
        sb_init(&chunk);
        sb_init(&all);
        size_t bad;
        bool good = tok_decode(t, v, n, skip, &whole, &bad) == 0 && text_equal(&whole, want, want_len, what);
        tok_stream s;
        tok_stream_init(&s, t, skip);
        bool chunks_valid = true;
        for (size_t i = 0; i <= n; i++) {
            sb_reset(&chunk);
            if (i < n) good = tok_stream_push(&s, v[i], &chunk) == 0 && good;
            else tok_stream_finish(&s, &chunk);
            if (utf8_valid_prefix(chunk.data, chunk.len) != chunk.len) chunks_valid = false;
            sb_append(&all, chunk.data, chunk.len);
        }
        ok(good, "%s whole", what);
        ok(chunks_valid && text_equal(&all, want, want_len, what), "%s streamed id by id", what);
        sb_free(&whole);
        sb_free(&chunk);
        sb_free(&all);
        free(v);
    }
}

static void check_pair(const char *tok_path, const char *golden_path)
{
    char err[1024];
    tokenizer *t = tok_load(tok_path, err, sizeof err);
    if (!ok(t != NULL, "load %s", tok_path)) {
        diag("%s", err);
        return;
    }
    strbuf text;
    sb_init(&text);
    yajl_val g = NULL;
    if (sb_read_file(&text, golden_path) == 0) g = json_parse(text.data, text.len, err, sizeof err);
    sb_free(&text);
    yajl_val enc = json_get(g, "encode"), dec = json_get(g, "decode");
    if (!ok(enc && dec && YAJL_IS_ARRAY(enc) && YAJL_IS_ARRAY(dec), "read %s", golden_path)) {
        tok_free(t);
        yajl_tree_free(g);
        return;
    }
    diag("%s: %s, %zu encode and %zu decode cases", golden_path,
         json_string(json_get(g, "generator")) ? json_string(json_get(g, "generator")) : "?",
         json_len(enc), json_len(dec));
    for (size_t i = 0; i < json_len(enc); i++) check_encode(t, enc->u.array.values[i]);
    for (size_t i = 0; i < json_len(dec); i++) check_decode(t, dec->u.array.values[i], i);
    yajl_tree_free(g);
    tok_free(t);
}

int main(int argc, char **argv)
{
    if (argc == 3) {
        check_pair(argv[1], argv[2]);
    } else {
        check_pair("tests/fixtures/tokenizer/tokenizer.json", "tests/fixtures/tokenizer/golden.json");
        check_pair("tests/fixtures/tokenizer/tokenizer-flags.json",
                   "tests/fixtures/tokenizer/golden-flags.json");
    }
    return exit_status();
}
