/* The tokenizer against HF tokenizers' golden ids and decodes
 * (tests/fixtures/tokenizer, made by tools/make_tokenizer.py).
 *   build/tests/test_tokenizer_golden                  committed fixtures
 *   build/tests/test_tokenizer_golden TOKENIZER GOLDEN  any pair, e.g. one
 *       made with make_tokenizer.py --golden-only for DeepSeek's file */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "json.h"
#include "tap.h"
#include "tokenizer.h"

/* Goldens hold "\u0000" (the corpus has NUL bytes), which json_parse
 * refuses for requests; read them with yajl directly and rely on the
 * stored byte lengths (golden_str). */
static yajl_val read_golden(const strbuf *text, char *err, size_t errlen)
{
    return yajl_tree_parse(text->data, err, errlen);
}

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
    if (got->len == n && (n == 0 || !memcmp(got->data, want, n))) return true;
    size_t i = 0;
    while (i < n && i < got->len && got->data[i] == want[i]) i++;
    diag("%s: %zu bytes, want %zu; first difference at byte %zu", what, got->len, n, i);
    return false;
}

/* tok_encode_marked with a mark wherever HF's ids have an added token
 * must give HF's ids.  The marks come from the golden ids: each id's
 * decoded bytes advance the offset (where decoding gives the text back). */
static void check_marked(const tokenizer *t, const char *name, const char *text, size_t len,
                         yajl_val special)
{
    size_t n = json_len(special), at = 0, n_marks = 0;
    tok_mark *marks = malloc((n ? n : 1) * sizeof *marks);
    bool aligned = true;
    for (size_t i = 0; i < n && aligned; i++) {
        long long id = -1;
        json_int(special->u.array.values[i], &id);
        size_t slen, blen;
        const char *s = tok_id_to_token(t, (int32_t)id, &slen);
        const char *b = tok_id_bytes(t, (int32_t)id, &blen);
        if (!s || !b || at + blen > len || memcmp(text + at, b, blen)) { aligned = false; break; }
        char *content = strndup(s, slen);
        if (tok_added_token_id(t, content) == id) marks[n_marks++] = (tok_mark){ at, (int32_t)id };
        free(content);
        at += blen;
    }
    if (aligned && at == len && n_marks) {
        tok_ids ids = { 0 };
        int rc = tok_encode_marked(t, text, len, marks, n_marks, &ids);
        char what[160];
        snprintf(what, sizeof what, "%s: %zu marked added tokens", name, n_marks);
        ok(!rc && ids_equal(&ids, special, what), "encode_marked %s", what);
        tok_ids_free(&ids);
    }
    free(marks);
}

static void check_encode(const tokenizer *t, yajl_val e)
{
    const char *name = json_string(json_get(e, "name"));
    size_t len;
    const char *text = golden_str(e, "text", "bytes", &len);
    yajl_val special = json_get(e, "ids_special"), plain = json_get(e, "ids_plain");
    if (!name || !text || !special) {
        ok(0, "encode entry is well-formed");
        return;
    }
    for (int mode = 0; mode < (plain ? 2 : 1); mode++) {
        tok_ids ids = { 0 };
        int rc = tok_encode(t, text, len, mode == 0, &ids);
        char what[160];
        snprintf(what, sizeof what, "%s: %s", name, mode == 0 ? "special tokens recognized" : "all text ordinary");
        if (rc) diag("%s: %s", what, tok_strerror(rc));
        ok(!rc && ids_equal(&ids, mode == 0 ? special : plain, what), "encode %s", what);
        tok_ids_free(&ids);
    }
    check_marked(t, name, text, len, special);
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
    if (sb_read_file(&text, golden_path) == 0) g = read_golden(&text, err, sizeof err);
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

/* tokenizer.json text with the variant's pre_tokenizer and model members
 * put in place of the base's. */
static void variant_json(yajl_val base, yajl_val variant, strbuf *out)
{
    yajl_val pre = json_get(variant, "pre_tokenizer"), model = json_get(variant, "model");
    bool has_pre = false;
    for (size_t i = 0; i < variant->u.object.len; i++)
        has_pre |= !strcmp(variant->u.object.keys[i], "pre_tokenizer");
    sb_putc(out, '{');
    for (size_t i = 0; i < base->u.object.len; i++) {
        const char *key = base->u.object.keys[i];
        yajl_val v = base->u.object.values[i];
        if (i) sb_putc(out, ',');
        json_put_cstr(out, key);
        sb_putc(out, ':');
        if (!strcmp(key, "pre_tokenizer") && has_pre) {
            if (pre) json_dump(out, pre, JSON_COMPACT);
            else sb_puts(out, "null");
        } else if (!strcmp(key, "model") && model) {
            sb_putc(out, '{');
            for (size_t k = 0; k < v->u.object.len; k++) {
                const char *mk = v->u.object.keys[k];
                yajl_val over = json_get(model, mk);
                if (k) sb_putc(out, ',');
                json_put_cstr(out, mk);
                sb_putc(out, ':');
                json_dump(out, over ? over : v->u.object.values[k], JSON_COMPACT);
            }
            for (size_t k = 0; k < model->u.object.len; k++) {
                if (json_get(v, model->u.object.keys[k])) continue;
                sb_putc(out, ',');
                json_put_cstr(out, model->u.object.keys[k]);
                sb_putc(out, ':');
                json_dump(out, model->u.object.values[k], JSON_COMPACT);
            }
            sb_putc(out, '}');
        } else {
            json_dump(out, v, JSON_COMPACT);
        }
    }
    sb_putc(out, '}');
}

/* golden-variants.json: the base tokenizer with other pre-tokenizers and
 * model options. */
static void check_variants(const char *tok_path, const char *golden_path)
{
    char err[1024];
    strbuf text, json;
    sb_init(&text);
    sb_init(&json);
    yajl_val base = NULL, g = NULL;
    if (sb_read_file(&text, tok_path) == 0) base = json_parse(text.data, text.len, err, sizeof err);
    sb_reset(&text);
    if (sb_read_file(&text, golden_path) == 0) g = read_golden(&text, err, sizeof err);
    yajl_val variants = json_get(g, "variants");
    if (ok(base && variants && YAJL_IS_ARRAY(variants), "read %s and %s", tok_path, golden_path)) {
        for (size_t i = 0; i < json_len(variants); i++) {
            yajl_val v = variants->u.array.values[i];
            const char *name = json_string(json_get(v, "name"));
            sb_reset(&json);
            variant_json(base, v, &json);
            char path[] = "/tmp/test_tokenizer_variant_XXXXXX";
            int fd = mkstemp(path);
            bool written = fd >= 0 && write(fd, json.data, json.len) == (ssize_t)json.len;
            if (fd >= 0) close(fd);
            tokenizer *t = written ? tok_load(path, err, sizeof err) : NULL;
            if (ok(t != NULL, "variant %s loads", name ? name : "?")) {
                yajl_val enc = json_get(v, "encode");
                for (size_t k = 0; k < json_len(enc); k++) check_encode(t, enc->u.array.values[k]);
            } else {
                diag("%s", err);
            }
            tok_free(t);
            unlink(path);
        }
    }
    yajl_tree_free(base);
    yajl_tree_free(g);
    sb_free(&text);
    sb_free(&json);
}

int main(int argc, char **argv)
{
    if (argc == 3) {
        check_pair(argv[1], argv[2]);
    } else {
        check_pair("tests/fixtures/tokenizer/tokenizer.json", "tests/fixtures/tokenizer/golden.json");
        check_pair("tests/fixtures/tokenizer/tokenizer-flags.json",
                   "tests/fixtures/tokenizer/golden-flags.json");
        check_variants("tests/fixtures/tokenizer/tokenizer.json",
                       "tests/fixtures/tokenizer/golden-variants.json");
    }
    return exit_status();
}
