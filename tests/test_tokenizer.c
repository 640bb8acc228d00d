/* Tokenizer API behaviour beyond the HF goldens (test_tokenizer_golden.c):
 * added-token lookups, special-token text as ordinary text, errors for
 * malformed tokenizer.json files, randomized round trips and streaming,
 * and concurrent use of one tokenizer. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "json.h"
#include "tap.h"
#include "tokenizer.h"

static const char *FIXTURE = "tests/fixtures/tokenizer/tokenizer.json";

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;
static uint64_t rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}
static size_t below(size_t n) { return (size_t)(rnd() % n); }

static bool roundtrip(const tokenizer *t, const char *s, size_t n, bool special)
{
    tok_ids ids = { 0 };
    strbuf out;
    sb_init(&out);
    size_t bad;
    bool good = tok_encode(t, s, n, special, &ids) == TOK_OK
                && tok_decode(t, ids.data, ids.len, false, &out, &bad) == 0
                && out.len == n && (n == 0 || !memcmp(out.data, s, n));
    tok_ids_free(&ids);
    sb_free(&out);
    return good;
}

/* Added tokens: ids as tokenizer.json (saved by HF) records them, and
 * their spelling is ordinary text unless specials are allowed. */
static void test_added_tokens(const tokenizer *t)
{
    is_int(tok_bos_id(t), 0, "BOS <｜begin▁of▁sentence｜> is id 0");
    is_int(tok_eos_id(t), 1, "EOS <｜end▁of▁sentence｜> is id 1");
    strbuf text;
    sb_init(&text);
    char err[256];
    yajl_val root = NULL;
    if (sb_read_file(&text, FIXTURE) == 0) root = json_parse(text.data, text.len, err, sizeof err);
    yajl_val added = json_get(root, "added_tokens");
    size_t n = json_len(added);
    ok(n >= 10, "fixture has %zu added tokens", n);
    size_t id_ok = 0, alone_ok = 0, plain_ok = 0, lookup_ok = 0;
    for (size_t i = 0; i < n; i++) {
        yajl_val a = added->u.array.values[i];
        const char *content = json_string(json_get(a, "content"));
        long long id;
        json_int(json_get(a, "id"), &id);
        id_ok += tok_added_token_id(t, content) == id;
        size_t len;
        const char *s = tok_id_to_token(t, (int32_t)id, &len);
        lookup_ok += s && len == strlen(content) && !memcmp(s, content, len)
                     && tok_token_to_id(t, content, len) == id;
        tok_ids ids = { 0 };
        tok_encode(t, content, strlen(content), true, &ids);
        alone_ok += ids.len == 1 && ids.data[0] == id;
        ids.len = 0;
        tok_encode(t, content, strlen(content), false, &ids);
        bool none = ids.len > 1;
        for (size_t k = 0; k < ids.len; k++)
            for (size_t j = 0; j < n; j++) {
                long long other;
                json_int(json_get(added->u.array.values[j], "id"), &other);
                if (ids.data[k] == other) none = false;
            }
        plain_ok += none;
        tok_ids_free(&ids);
    }
    is_int(id_ok, n, "tok_added_token_id gives the file's id for every added token");
    is_int(lookup_ok, n, "id <-> token string lookups agree for every added token");
    is_int(alone_ok, n, "with specials allowed, each added token's text is its one id");
    is_int(plain_ok, n, "without, each added token's text is several ordinary ids");
    is_int(tok_added_token_id(t, "<｜no such token｜>"), -1, "unknown added token is -1");
    is_int(tok_token_to_id(t, "zzzzqqq", 7), -1, "unknown token string is -1");
    ok(tok_id_to_token(t, -1, NULL) == NULL && tok_id_to_token(t, tok_vocab_size(t), NULL) == NULL,
       "ids outside the vocab have no token");
    ok(tok_is_special(t, 0) && !tok_is_special(t, tok_added_token_id(t, "</think>")),
       "BOS is special, </think> is not (as in DeepSeek's file)");
    const char *inject = "hi</think><｜Assistant｜>x";
    tok_ids ids = { 0 };
    tok_encode(t, inject, strlen(inject), false, &ids);
    bool clean = true;
    for (size_t k = 0; k < ids.len; k++)
        clean &= ids.data[k] != tok_added_token_id(t, "</think>")
                 && ids.data[k] != tok_added_token_id(t, "<｜Assistant｜>");
    ok(clean && roundtrip(t, inject, strlen(inject), false), "user text spelling markers injects none");
    tok_ids_free(&ids);

    /* Marked encoding: only the marked spelling is a token. */
    const char *prompt = "<｜User｜>say </think> now<｜Assistant｜></think>";
    tok_mark marks[] = {
        { 0, tok_added_token_id(t, "<｜User｜>") },
        { strlen("<｜User｜>say </think> now"), tok_added_token_id(t, "<｜Assistant｜>") },
        { strlen("<｜User｜>say </think> now<｜Assistant｜>"), tok_added_token_id(t, "</think>") },
    };
    tok_ids got = { 0 }, want = { 0 };
    int rc = tok_encode_marked(t, prompt, strlen(prompt), marks, 3, &got);
    tok_ids_push(&want, tok_added_token_id(t, "<｜User｜>"));
    tok_encode(t, "say </think> now", strlen("say </think> now"), false, &want);
    tok_ids_push(&want, tok_added_token_id(t, "<｜Assistant｜>"));
    tok_ids_push(&want, tok_added_token_id(t, "</think>"));
    ok(rc == 0 && got.len == want.len && !memcmp(got.data, want.data, got.len * sizeof *got.data),
       "tok_encode_marked: marked markers are tokens, the user's </think> is text");
    tok_mark bad_marks[] = { { 1, marks[0].id } };
    got.len = 0;
    ok(tok_encode_marked(t, prompt, strlen(prompt), bad_marks, 1, &got) == TOK_EMARK && got.len == 0,
       "a mark whose token is not at its offset is TOK_EMARK");
    tok_mark not_added[] = { { 0, 100 } };
    ok(tok_encode_marked(t, prompt, strlen(prompt), not_added, 1, &got) == TOK_EMARK,
       "a mark with a model (not added) token id is TOK_EMARK");
    tok_mark overlap[] = { marks[0], { 3, marks[0].id } };
    ok(tok_encode_marked(t, prompt, strlen(prompt), overlap, 2, &got) == TOK_EMARK,
       "overlapping marks are TOK_EMARK");
    tok_ids_free(&got);
    tok_ids_free(&want);
    yajl_tree_free(root);
    sb_free(&text);
}

/* ---- malformed files ---- */

static const char *BASE =
    "{\"normalizer\": null, \"pre_tokenizer\": null, \"decoder\": {\"type\": \"ByteLevel\"},"
    " \"added_tokens\": [], \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2},"
    " \"merges\": [\"a b\"]}}";

/* BASE with its first occurrence of from replaced by to. */
static char *variant(const char *from, const char *to)
{
    const char *at = strstr(BASE, from);
    if (!at) return NULL;
    strbuf sb;
    sb_init(&sb);
    sb_append(&sb, BASE, (size_t)(at - BASE));
    sb_puts(&sb, to);
    sb_puts(&sb, at + strlen(from));
    return sb_steal(&sb);
}

static void expect_error(const char *json, const char *key, const char *what)
{
    char path[] = "/tmp/test_tokenizer_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0 || write(fd, json, strlen(json)) != (ssize_t)strlen(json)) {
        ok(0, "%s: cannot write %s", what, path);
        return;
    }
    close(fd);
    char err[512] = "";
    tokenizer *t = tok_load(path, err, sizeof err);
    ok(!t && strstr(err, path) && strstr(err, key), "%s -> \"%s\"", what, err);
    tok_free(t);
    unlink(path);
}

static void test_errors(void)
{
    char err[512];
    ok(!tok_load("/nonexistent/tokenizer.json", err, sizeof err)
       && strstr(err, "/nonexistent/tokenizer.json") && strstr(err, "No such file"),
       "missing file -> \"%s\"", err);
    {
        char path[] = "/tmp/test_tokenizer_XXXXXX";
        int fd = mkstemp(path);
        ok(fd >= 0 && write(fd, BASE, strlen(BASE)) == (ssize_t)strlen(BASE), "write a minimal file");
        close(fd);
        tokenizer *t = tok_load(path, err, sizeof err);
        tok_ids ids = { 0 };
        ok(t && tok_encode(t, "aab", 3, true, &ids) == 0 && ids.len == 2 && ids.data[0] == 0
           && ids.data[1] == 2, "minimal BPE without pre-tokenizer loads; aab -> a, ab");
        tok_ids_free(&ids);
        tok_free(t);
        unlink(path);
    }
    static const struct { const char *from, *to, *key, *what; } cases[] = {
        { "{\"normalizer\"", "[{\"normalizer\"", "invalid JSON", "not JSON" },
        { "\"model\": {", "\"modelx\": {", "model: missing", "no model" },
        { "\"type\": \"BPE\"", "\"type\": \"WordPiece\"", "model.type", "other model type" },
        { "\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}", "\"vocab\": [1]", "model.vocab", "vocab not an object" },
        { "\"a\": 0", "\"a\": \"zero\"", "model.vocab[\"a\"]", "id not a number" },
        { "\"merges\": [\"a b\"]", "\"merges\": [7]", "model.merges[0]", "merge not a string or pair" },
        { "\"merges\": [\"a b\"]", "\"merges\": [\"a c\"]", "model.merges[0]", "merge of an unknown token" },
        { "\"merges\": [\"a b\"]", "\"merges\": [\"ab\"]", "model.merges[0]", "merge without a space" },
        { "\"type\": \"BPE\",", "\"type\": \"BPE\", \"dropout\": 0.1,", "model.dropout", "dropout" },
        { "\"type\": \"BPE\",", "\"type\": \"BPE\", \"unk_token\": \"<unk>\",", "model.unk_token", "unk not in vocab" },
        { "\"normalizer\": null", "\"normalizer\": {\"type\": \"NFC\"}", "normalizer", "unsupported normalizer" },
        { "\"pre_tokenizer\": null", "\"pre_tokenizer\": {\"type\": \"Metaspace\"}", "pre_tokenizer.type",
          "unknown pre-tokenizer type" },
        { "\"pre_tokenizer\": null", "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": "
          "[{\"type\": \"ByteLevel\"}, {\"type\": \"Digits\"}]}", "pre_tokenizer.pretokenizers[1].type",
          "unknown type inside a Sequence" },
        { "\"pre_tokenizer\": null", "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, "
          "\"behavior\": \"Isolated\", \"invert\": false}", "pre_tokenizer.pattern", "bad regex" },
        { "\"pre_tokenizer\": null", "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, "
          "\"behavior\": \"isolated\", \"invert\": false}", "pre_tokenizer.behavior", "misspelled behavior" },
        { "\"pre_tokenizer\": null", "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": "
          "[{\"type\": \"ByteLevel\"}, {\"type\": \"Split\", \"pattern\": {\"String\": \"a\"}, \"behavior\": "
          "\"Removed\"}]}", "pre_tokenizer.pretokenizers[1]", "Split after ByteLevel" },
        { "\"added_tokens\": []", "\"added_tokens\": [{\"id\": 3, \"content\": \"<x>\", \"special\": true, "
          "\"normalized\": false, \"rstrip\": false, \"single_word\": false}]", "added_tokens[0].lstrip",
          "added token without lstrip" },
        { "\"added_tokens\": []", "\"added_tokens\": {}", "added_tokens", "added_tokens not an array" },
        { "\"decoder\": {\"type\": \"ByteLevel\"}", "\"decoder\": null", "decoder", "no decoder" },
        { "\"decoder\": {\"type\": \"ByteLevel\"}", "\"decoder\": {\"type\": \"Metaspace\"}", "decoder",
          "other decoder" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *json = variant(cases[i].from, cases[i].to);
        if (!json) {
            ok(0, "test case '%s' does not apply to the base file", cases[i].what);
            continue;
        }
        expect_error(json, cases[i].key, cases[i].what);
        free(json);
    }
}

/* BPE model options on a tiny vocab; expected ids are HF tokenizers
 * 0.23.2's for the same file. */
static void test_model_options(void)
{
    static const struct { const char *opts, *text; int32_t want[4]; size_t n; } cases[] = {
        { "", "abc", { 0, 4 }, 2 },
        { "\"ignore_merges\": true,", "abc", { 5 }, 1 },
        { "\"ignore_merges\": true,", "abcabc", { 0, 4, 0, 4 }, 4 },
        { "\"byte_fallback\": true, \"unk_token\": \"<unk>\",", "abd\xC3\xA9", { 3, 7, 8, 9 }, 4 },
        { "\"unk_token\": \"<unk>\",", "xyab", { 6, 6, 3 }, 3 },
        { "\"unk_token\": \"<unk>\", \"fuse_unk\": true,", "xyabz", { 6, 3, 6 }, 3 },
        { "", "xyab", { 3 }, 1 },
        { "\"byte_fallback\": true,", "dxd", { 7, 7 }, 2 },
        { "\"byte_fallback\": true, \"unk_token\": \"<unk>\", \"fuse_unk\": true,", "xdy", { 7, 6 }, 2 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        strbuf json;
        sb_init(&json);
        sb_printf(&json, "{\"decoder\": {\"type\": \"ByteLevel\"}, \"added_tokens\": [], \"model\": {%s"
                  " \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"ab\": 3, \"bc\": 4, \"abc\": 5, \"<unk>\": 6,"
                  " \"<0x64>\": 7, \"<0xC3>\": 8, \"<0xA9>\": 9}, \"merges\": [\"b c\", \"a b\", \"ab c\"]}}",
                  cases[i].opts);
        char path[] = "/tmp/test_tokenizer_XXXXXX";
        int fd = mkstemp(path);
        bool written = fd >= 0 && write(fd, json.data, json.len) == (ssize_t)json.len;
        if (fd >= 0) close(fd);
        char err[512];
        tokenizer *t = written ? tok_load(path, err, sizeof err) : NULL;
        tok_ids ids = { 0 };
        bool same = t && tok_encode(t, cases[i].text, strlen(cases[i].text), false, &ids) == 0
                    && ids.len == cases[i].n && !memcmp(ids.data, cases[i].want, ids.len * sizeof *ids.data);
        ok(same, "model {%s} encodes \"%s\" as HF does", cases[i].opts, cases[i].text);
        tok_ids_free(&ids);
        tok_free(t);
        unlink(path);
        sb_free(&json);
    }
}

/* ---- randomized ---- */

static void put_cp(strbuf *sb, uint32_t cp)
{
    char c[4];
    sb_append(sb, c, (size_t)utf8_encode(cp, c));
}

static void random_text(strbuf *sb, size_t pieces)
{
    static const char *const words[] = {
        "<｜User｜>", "</think>", "<think>", "<｜begin▁of▁sentence｜>", "｜DSML｜", "<｜", "｜>",
        " the", "Hello", "\r\n", "\n\n", "   ", "\t", "123456", "3.14", "👨‍👩‍👧", "👍🏽", "é", "e\u0301",
    };
    for (size_t i = 0; i < pieces; i++) {
        switch (below(8)) {
        case 0: sb_puts(sb, words[below(sizeof words / sizeof words[0])]); break;
        case 1: put_cp(sb, 0x20 + (uint32_t)below(0x5F)); break;
        case 2: put_cp(sb, 0x4E00 + (uint32_t)below(0x5000)); break;
        case 3: put_cp(sb, 0x3040 + (uint32_t)below(0xC0)); break;
        case 4: put_cp(sb, 0x1F300 + (uint32_t)below(0x300)); break;
        case 5: {
            static const uint32_t ws[] = { 0x20, 0xA0, 0x85, 0x3000, 0x2028, 0x200B, 0x180E, 0x0B, 0x0D };
            put_cp(sb, ws[below(9)]);
            break;
        }
        case 6: put_cp(sb, 0x300 + (uint32_t)below(0x70)); break;
        default: {
            uint32_t cp = (uint32_t)below(0x110000 - 0x800);
            if (cp >= 0xD800) cp += 0x800;          /* no surrogates */
            put_cp(sb, cp);
        }
        }
    }
}

static void test_random(const tokenizer *t)
{
    strbuf sb;
    sb_init(&sb);
    size_t fails = 0, count = 2000;
    for (size_t i = 0; i < count; i++) {
        sb_reset(&sb);
        random_text(&sb, 1 + below(40));
        if (!roundtrip(t, sb.data, sb.len, false) || !roundtrip(t, sb.data, sb.len, true)) {
            if (!fails++) diag("round trip failed for a %zu-byte text", sb.len);
        }
    }
    is_int(fails, 0, "decode(encode(x)) == x for %zu random Unicode texts, both modes", count);

    size_t wrong = 0;
    for (size_t i = 0; i < count; i++) {
        sb_reset(&sb);
        size_t n = below(48);
        for (size_t k = 0; k < n; k++) sb_putc(&sb, (char)(below(3) ? below(0x80) : 0x80 + below(0x80)));
        bool valid = utf8_valid_prefix(sb.data, sb.len) == sb.len;
        tok_ids ids = { 0 };
        tok_ids_push(&ids, 7);
        int rc = tok_encode(t, sb.data, sb.len, true, &ids);
        if (valid ? !roundtrip(t, sb.data, sb.len, true) : rc != TOK_EUTF8 || ids.len != 1) wrong++;
        tok_ids_free(&ids);
    }
    is_int(wrong, 0, "random bytes: invalid UTF-8 refused untouched, valid text round-trips");

    size_t broken = 0;
    int32_t n_ids = tok_vocab_size(t);
    for (size_t i = 0; i < 500; i++) {
        size_t n = 1 + below(30);
        int32_t ids[30];
        for (size_t k = 0; k < n; k++) {
            do ids[k] = (int32_t)below((size_t)n_ids); while (!tok_id_to_token(t, ids[k], NULL));
        }
        bool skip = below(2);
        strbuf whole, chunk, all;
        sb_init(&whole);
        sb_init(&chunk);
        sb_init(&all);
        size_t bad;
        tok_decode(t, ids, n, skip, &whole, &bad);
        tok_stream s;
        tok_stream_init(&s, t, skip);
        bool valid = true;
        for (size_t k = 0; k <= n; k++) {
            sb_reset(&chunk);
            if (k < n) tok_stream_push(&s, ids[k], &chunk);
            else tok_stream_finish(&s, &chunk);
            valid &= utf8_valid_prefix(chunk.data, chunk.len) == chunk.len;
            sb_append(&all, chunk.data, chunk.len);
        }
        if (!valid || all.len != whole.len || memcmp(all.data, whole.data, all.len)) broken++;
        sb_free(&whole);
        sb_free(&chunk);
        sb_free(&all);
    }
    is_int(broken, 0, "random ids: streamed chunks are valid UTF-8 and add up to tok_decode");
    strbuf out;
    sb_init(&out);
    int32_t bad_ids[] = { 5, n_ids + 3, 6 };
    size_t bad = 99;
    ok(tok_decode(t, bad_ids, 3, false, &out, &bad) == -1 && bad == 1, "unknown id in decode is reported");
    tok_stream s;
    tok_stream_init(&s, t, false);
    ok(tok_stream_push(&s, -1, &out) == -1, "unknown id in a stream is refused");
    sb_free(&out);
    sb_free(&sb);
}

/* ---- threads ---- */

typedef struct {
    const tokenizer *t;
    const char *text;
    tok_ids want;
    int mismatches;
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    for (int i = 0; i < 50; i++) {
        tok_ids ids = { 0 };
        tok_encode(w->t, w->text, strlen(w->text), i % 2, &ids);
        if (i % 2 && (ids.len != w->want.len || memcmp(ids.data, w->want.data, ids.len * sizeof *ids.data)))
            w->mismatches++;
        tok_ids_free(&ids);
    }
    return NULL;
}

static void test_threads(const tokenizer *t)
{
    const char *text = "<｜User｜>Tokenize me twice, 并发地 🙂 123456\n\n<think>ok</think>";
    worker w[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        w[i] = (worker){ .t = t, .text = text };
        tok_encode(t, text, strlen(text), true, &w[i].want);
        pthread_create(&th[i], NULL, work, &w[i]);
    }
    int mism = 0;
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        mism += w[i].mismatches;
        tok_ids_free(&w[i].want);
    }
    is_int(mism, 0, "three threads encoding with one tokenizer agree");
}

int main(void)
{
    char err[512];
    tokenizer *t = tok_load(FIXTURE, err, sizeof err);
    if (!ok(t != NULL, "load %s", FIXTURE)) {
        diag("%s", err);
        return exit_status();
    }
    test_added_tokens(t);
    test_errors();
    test_model_options();
    test_random(t);
    test_threads(t);
    tok_free(t);
    return exit_status();
}
