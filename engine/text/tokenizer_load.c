/* tokenizer.json -> struct tokenizer.  Every unsupported or malformed part
 * is an error naming the file and the JSON key. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "tokenizer_impl.h"

#define MAX_ID (1 << 26)    /* sanity bound: real vocabularies are ~2^17 */

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

typedef struct {
    tokenizer *t;
    strbuf arena;           /* strings, as offsets until the arena is final */
    char *err;
    size_t errlen;
} loader;

static int fail(loader *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(loader *L, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->err, L->errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) { fprintf(stderr, "out of memory (%zu x %zu bytes)\n", n, size); abort(); }
    return p;
}

static size_t arena_add(loader *L, const char *s, size_t n)
{
    size_t off = L->arena.len;
    sb_append(&L->arena, s, n);
    sb_putc(&L->arena, 0);
    return off;
}

/* Optional boolean member: absent or null leaves *out as it is. */
static int get_bool(loader *L, yajl_val obj, const char *key, const char *where, bool *out)
{
    yajl_val v = json_get(obj, key);
    if (!v || YAJL_IS_NULL(v)) return 0;
    if (!json_bool(v, out)) return fail(L, "%s.%s: expected true or false", where, key);
    return 0;
}

/* A member that must be null or the empty string (features we lack). */
static int must_be_unset(loader *L, yajl_val obj, const char *key, const char *where)
{
    yajl_val v = json_get(obj, key);
    if (!v || YAJL_IS_NULL(v)) return 0;
    const char *s = json_string(v);
    if (s && !*s) return 0;
    return fail(L, "%s.%s: only null is supported", where, key);
}

/* ---- model ---- */

typedef struct {
    size_t off, len;
    int32_t id;
} vocab_entry;

static int load_vocab(loader *L, yajl_val model, vocab_entry **out, size_t *n)
{
    yajl_val vocab = json_get(model, "vocab");
    if (!vocab) return fail(L, "model.vocab: missing");
    if (!YAJL_IS_OBJECT(vocab)) return fail(L, "model.vocab: expected an object of token: id");
    size_t len = vocab->u.object.len;
    vocab_entry *e = xcalloc(len, sizeof *e);
    for (size_t i = 0; i < len; i++) {
        const char *key = vocab->u.object.keys[i];
        long long id;
        if (!json_int(vocab->u.object.values[i], &id) || id < 0 || id >= MAX_ID) {
            free(e);
            return fail(L, "model.vocab[\"%s\"]: expected an id in [0, %d)", key, MAX_ID);
        }
        e[i].len = strlen(key);
        e[i].off = arena_add(L, key, e[i].len);
        e[i].id = (int32_t)id;
    }
    *out = e;
    *n = len;
    return 0;
}

static int vocab_id(const tokenizer *t, const char *s, size_t n, int32_t *id)
{
    return strmap_get(&t->vocab, s, n, id) ? 0 : -1;
}

static int load_merges(loader *L, yajl_val model)
{
    tokenizer *t = L->t;
    yajl_val merges = json_get(model, "merges");
    if (!merges) return fail(L, "model.merges: missing");
    if (!YAJL_IS_ARRAY(merges)) return fail(L, "model.merges: expected an array");
    size_t n = merges->u.array.len;
    u64map_init(&t->merges, n);
    strbuf joined;
    sb_init(&joined);
    int rc = 0;
    for (size_t r = 0; r < n && !rc; r++) {
        yajl_val m = merges->u.array.values[r];
        const char *a, *b;
        size_t alen, blen;
        const char *s = json_string(m);
        if (s) {            /* legacy "a b" */
            const char *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                rc = fail(L, "model.merges[%zu]: \"%s\" is not two tokens separated by one space", r, s);
                break;
            }
            a = s; alen = (size_t)(sp - s);
            b = sp + 1; blen = strlen(b);
        } else if (YAJL_IS_ARRAY(m) && m->u.array.len == 2 && json_string(m->u.array.values[0])
                   && json_string(m->u.array.values[1])) {
            a = json_string(m->u.array.values[0]); alen = strlen(a);
            b = json_string(m->u.array.values[1]); blen = strlen(b);
        } else {
            rc = fail(L, "model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"]", r);
            break;
        }
        sb_reset(&joined);
        sb_append(&joined, a, alen);
        sb_append(&joined, b, blen);
        int32_t ia, ib, inew;
        if (vocab_id(t, a, alen, &ia)) rc = fail(L, "model.merges[%zu]: \"%.*s\" is not in model.vocab", r, (int)alen, a);
        else if (vocab_id(t, b, blen, &ib)) rc = fail(L, "model.merges[%zu]: \"%.*s\" is not in model.vocab", r, (int)blen, b);
        else if (vocab_id(t, joined.data, joined.len, &inew))
            rc = fail(L, "model.merges[%zu]: \"%s\" is not in model.vocab", r, joined.data);
        else   /* a later duplicate overrides, as in HF's merge map */
            u64map_put(&t->merges, (uint64_t)ia << 32 | (uint32_t)ib, (uint64_t)r << 32 | (uint32_t)inew);
    }
    sb_free(&joined);
    return rc;
}

static int load_model_options(loader *L, yajl_val model)
{
    tokenizer *t = L->t;
    double dropout;
    yajl_val d = json_get(model, "dropout");
    if (d && !YAJL_IS_NULL(d) && !(json_number(d, &dropout) && dropout == 0))
        return fail(L, "model.dropout: BPE dropout is not supported (must be null)");
    if (must_be_unset(L, model, "continuing_subword_prefix", "model")
        || must_be_unset(L, model, "end_of_word_suffix", "model")
        || get_bool(L, model, "fuse_unk", "model", &t->fuse_unk)
        || get_bool(L, model, "byte_fallback", "model", &t->byte_fallback)
        || get_bool(L, model, "ignore_merges", "model", &t->ignore_merges))
        return -1;
    t->unk_id = -1;
    yajl_val unk = json_get(model, "unk_token");
    if (unk && !YAJL_IS_NULL(unk)) {
        const char *s = json_string(unk);
        if (!s) return fail(L, "model.unk_token: expected a string or null");
        if (vocab_id(t, s, strlen(s), &t->unk_id))
            return fail(L, "model.unk_token: \"%s\" is not in model.vocab", s);
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        if (vocab_id(t, name, strlen(name), &t->fallback_id[b])) t->fallback_id[b] = -1;
    }
    return 0;
}

/* ---- pre-tokenizer ---- */

static int load_pre_tokenizer(loader *L, yajl_val v, const char *where)
{
    tokenizer *t = L->t;
    if (!v || YAJL_IS_NULL(v)) return 0;
    const char *type = json_string(json_get(v, "type"));
    if (!YAJL_IS_OBJECT(v) || !type) return fail(L, "%s: expected an object with a \"type\"", where);
    if (!strcmp(type, "Sequence")) {
        yajl_val list = json_get(v, "pretokenizers");
        if (!list || !YAJL_IS_ARRAY(list)) return fail(L, "%s.pretokenizers: expected an array", where);
        for (size_t i = 0; i < list->u.array.len; i++) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", where, i);
            if (load_pre_tokenizer(L, list->u.array.values[i], sub)) return -1;
        }
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) {
        if (t->byte_level) return fail(L, "%s: a second ByteLevel is not supported", where);
        t->byte_level = true;
        t->add_prefix_space = true;      /* HF's defaults */
        bool use_regex = true;
        if (get_bool(L, v, "add_prefix_space", where, &t->add_prefix_space)
            || get_bool(L, v, "use_regex", where, &use_regex))
            return -1;
        if (use_regex) {
            char rerr[256];
            t->byte_level_re = onig_regex_compile(GPT2_PATTERN, strlen(GPT2_PATTERN), false, rerr, sizeof rerr);
            if (!t->byte_level_re) return fail(L, "%s: GPT-2 pattern: %s", where, rerr);
        }
        return 0;
    }
    if (!strcmp(type, "Split")) {
        if (t->byte_level)
            return fail(L, "%s: Split after ByteLevel is not supported (ByteLevel must come last)", where);
        yajl_val pat = json_get(v, "pattern");
        const char *regex = json_string(json_get(pat, "Regex"));
        const char *literal = json_string(json_get(pat, "String"));
        if (!regex && !literal)
            return fail(L, "%s.pattern: expected {\"Regex\": \"...\"} or {\"String\": \"...\"}", where);
        static const char *const names[] = {
            [SPLIT_REMOVED] = "Removed", [SPLIT_ISOLATED] = "Isolated",
            [SPLIT_MERGED_WITH_PREVIOUS] = "MergedWithPrevious",
            [SPLIT_MERGED_WITH_NEXT] = "MergedWithNext", [SPLIT_CONTIGUOUS] = "Contiguous",
        };
        const char *beh = json_string(json_get(v, "behavior"));
        int b = -1;
        for (int i = 0; beh && i < 5; i++)
            if (!strcmp(beh, names[i])) b = i;
        if (b < 0)
            return fail(L, "%s.behavior: expected one of Removed, Isolated, MergedWithPrevious, "
                           "MergedWithNext, Contiguous", where);
        split_step step = { .behavior = (enum split_behavior)b };
        if (get_bool(L, v, "invert", where, &step.invert)) return -1;
        char rerr[256];
        const char *p = regex ? regex : literal;
        step.re = onig_regex_compile(p, strlen(p), !regex, rerr, sizeof rerr);
        if (!step.re) return fail(L, "%s.pattern: %s", where, rerr);
        t->splits = realloc(t->splits, (size_t)(t->n_splits + 1) * sizeof *t->splits);
        if (!t->splits) abort();
        t->splits[t->n_splits++] = step;
        return 0;
    }
    return fail(L, "%s.type: \"%s\" is not supported (supported: Sequence, Split, ByteLevel)", where, type);
}

/* ---- added tokens ---- */

typedef struct {
    size_t off, len;
    int32_t id;
    bool special, normalized, lstrip, rstrip, single_word;
} added_entry;

static int load_added(loader *L, yajl_val root, size_t vocab_count, added_entry **out, int *n_out)
{
    tokenizer *t = L->t;
    yajl_val list = json_get(root, "added_tokens");
    *out = NULL;
    *n_out = 0;
    if (!list || YAJL_IS_NULL(list)) return 0;
    if (!YAJL_IS_ARRAY(list)) return fail(L, "added_tokens: expected an array");
    size_t len = list->u.array.len;
    added_entry *a = xcalloc(len, sizeof *a);
    strmap seen;            /* content -> index in a[] */
    strmap_init(&seen, len);
    int n = 0;
    int32_t max_id = -1;
    for (size_t i = 0; i < len; i++) {
        yajl_val v = list->u.array.values[i];
        const char *content = json_string(json_get(v, "content"));
        long long file_id;
        if (!YAJL_IS_OBJECT(v) || !content || !json_int(json_get(v, "id"), &file_id)) {
            strmap_free(&seen);
            free(a);
            return fail(L, "added_tokens[%zu]: expected an object with \"id\" and \"content\"", i);
        }
        /* HF requires every flag. */
        static const char *const flags[] = { "special", "normalized", "lstrip", "rstrip", "single_word" };
        bool f[5];
        for (int k = 0; k < 5; k++) {
            if (!json_bool(json_get(v, flags[k]), &f[k])) {
                strmap_free(&seen);
                free(a);
                return fail(L, "added_tokens[%zu].%s: expected true or false", i, flags[k]);
            }
        }
        size_t clen = strlen(content);
        if (!clen) continue;                /* HF ignores empty tokens */
        int32_t k;
        if (strmap_get(&seen, content, clen, &k)) {
            /* Same content again: its flags replace the earlier ones, and
             * it stays special once any entry said so (HF's bookkeeping). */
            bool was_special = a[k].special;
            a[k].special = f[0] || was_special;
            a[k].normalized = f[1]; a[k].lstrip = f[2]; a[k].rstrip = f[3]; a[k].single_word = f[4];
            continue;
        }
        /* HF gives an added token the model's id for the same string, or
         * the next free id after the vocab (not the file's "id"). */
        int32_t id;
        if (vocab_id(t, content, clen, &id)) {
            if (max_id < 0) id = (int32_t)vocab_count;
            else if ((size_t)max_id >= vocab_count || vocab_count == 0) id = max_id + 1;
            else id = (int32_t)vocab_count;
        }
        if (id >= MAX_ID) {
            strmap_free(&seen);
            free(a);
            return fail(L, "added_tokens[%zu]: id %d too large", i, id);
        }
        if (id > max_id) max_id = id;
        a[n] = (added_entry){ .off = arena_add(L, content, clen), .len = clen, .id = id,
                              .special = f[0], .normalized = f[1], .lstrip = f[2],
                              .rstrip = f[3], .single_word = f[4] };
        strmap_put(&seen, content, clen, n);   /* the JSON tree outlives seen */
        n++;
    }
    strmap_free(&seen);
    *out = a;
    *n_out = n;
    return 0;
}

static void trie_build(token_trie *tr, const tokenizer *t, bool normalized)
{
    size_t bytes = 0;
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].normalized == normalized) bytes += t->added[i].len;
    u64map_init(&tr->child, bytes);
    tr->term = xcalloc(bytes + 1, sizeof *tr->term);
    for (size_t i = 0; i <= bytes; i++) tr->term[i] = -1;
    tr->n_nodes = 1;
    for (int i = 0; i < t->n_added; i++) {
        const added_token *a = &t->added[i];
        if (a->normalized != normalized) continue;
        uint64_t node = 0;
        for (uint32_t j = 0; j < a->len; j++) {
            uint64_t key = node << 8 | (unsigned char)a->content[j], next;
            if (!u64map_get(&tr->child, key, &next)) {
                next = (uint64_t)tr->n_nodes++;
                u64map_put(&tr->child, key, next);
            }
            node = next;
        }
        tr->term[node] = i;
        tr->first[(unsigned char)a->content[0]] = true;
    }
}

/* ---- decoder ---- */

/* ByteLevel decoding of one token: its characters mapped back to bytes,
 * or the token's own bytes when some character is outside the map. */
static void decode_token(const char *s, size_t n, strbuf *out)
{
    size_t mark = out->len;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int len = utf8_decode((const unsigned char *)s + i, n - i, &cp);
        int b = len ? byte_level_byte(cp) : -1;
        if (b < 0) {
            out->len = mark;
            sb_append(out, s, n);
            return;
        }
        sb_putc(out, (char)b);
        i += (size_t)len;
    }
}

static int load_decoder(loader *L, yajl_val root)
{
    tokenizer *t = L->t;
    yajl_val d = json_get(root, "decoder");
    const char *type = json_string(json_get(d, "type"));
    if (!type || strcmp(type, "ByteLevel"))
        return fail(L, "decoder: %s%s%s is not supported (only ByteLevel)", type ? "\"" : "",
                    type ? type : "null", type ? "\"" : "");
    strbuf dec;
    sb_init(&dec);
    t->dec_off = xcalloc((size_t)t->n_ids, sizeof *t->dec_off);
    t->dec_len = xcalloc((size_t)t->n_ids, sizeof *t->dec_len);
    for (int32_t id = 0; id < t->n_ids; id++) {
        if (!t->tok_str[id]) continue;
        t->dec_off[id] = (uint32_t)dec.len;
        decode_token(t->tok_str[id], t->tok_len[id], &dec);
        t->dec_len[id] = (uint32_t)(dec.len - t->dec_off[id]);
    }
    t->dec = sb_steal(&dec);
    return 0;
}

/* ---- the whole file ---- */

/* Only normalizers that change nothing: null, or Sequences of those
 * (DeepSeek's file has {"type": "Sequence", "normalizers": []}). */
static int check_normalizer(loader *L, yajl_val v, const char *where)
{
    if (!v || YAJL_IS_NULL(v)) return 0;
    const char *type = json_string(json_get(v, "type"));
    yajl_val list = json_get(v, "normalizers");
    if (!type || strcmp(type, "Sequence") || !list || !YAJL_IS_ARRAY(list))
        return fail(L, "%s: \"%s\" is not supported (only null or a Sequence of nothing)",
                    where, type ? type : "?");
    for (size_t i = 0; i < list->u.array.len; i++) {
        char sub[256];
        snprintf(sub, sizeof sub, "%s.normalizers[%zu]", where, i);
        if (check_normalizer(L, list->u.array.values[i], sub)) return -1;
    }
    return 0;
}

static int load_all(loader *L, yajl_val root)
{
    tokenizer *t = L->t;
    if (!YAJL_IS_OBJECT(root)) return fail(L, "expected a JSON object at the top level");
    if (check_normalizer(L, json_get(root, "normalizer"), "normalizer")) return -1;
    yajl_val model = json_get(root, "model");
    if (!model) return fail(L, "model: missing");
    if (!YAJL_IS_OBJECT(model)) return fail(L, "model: expected an object");
    const char *mtype = json_string(json_get(model, "type"));
    if (mtype ? strcmp(mtype, "BPE") != 0 : !json_get(model, "merges"))
        return fail(L, "model.type: \"%s\" is not supported (only BPE)", mtype ? mtype : "?");

    /* The vocab map first points at the JSON tree's strings (alive while
     * loading) and is rebuilt on the arena once the arena stops growing. */
    vocab_entry *ve = NULL;
    added_entry *ae = NULL;
    size_t nv = 0;
    int na = 0;
    if (load_vocab(L, model, &ve, &nv)) return -1;
    yajl_val vocab_obj = json_get(model, "vocab");
    strmap_init(&t->vocab, nv);
    for (size_t i = 0; i < nv; i++)
        strmap_put(&t->vocab, vocab_obj->u.object.keys[i], ve[i].len, ve[i].id);
    int rc = load_added(L, root, t->vocab.n, &ae, &na);
    if (!rc) rc = load_model_options(L, model) || load_merges(L, model)
                  || load_pre_tokenizer(L, json_get(root, "pre_tokenizer"), "pre_tokenizer");
    if (rc) {
        free(ve);
        free(ae);
        return -1;
    }
    for (int b = 0; b < 256; b++) {
        char c[4];
        int n = utf8_encode(byte_level_char((unsigned char)b), c);
        if (vocab_id(t, c, (size_t)n, &t->byte_id[b])) t->byte_id[b] = -1;
    }

    t->arena = sb_steal(&L->arena);
    strmap_free(&t->vocab);
    strmap_init(&t->vocab, nv);
    int32_t max_id = -1;
    for (size_t i = 0; i < nv; i++) {
        strmap_put(&t->vocab, t->arena + ve[i].off, ve[i].len, ve[i].id);
        if (ve[i].id > max_id) max_id = ve[i].id;
    }
    for (int i = 0; i < na; i++)
        if (ae[i].id > max_id) max_id = ae[i].id;
    t->n_ids = max_id + 1;
    t->tok_str = xcalloc((size_t)t->n_ids, sizeof *t->tok_str);
    t->tok_len = xcalloc((size_t)t->n_ids, sizeof *t->tok_len);
    t->special = xcalloc((size_t)t->n_ids, sizeof *t->special);
    for (size_t i = 0; i < nv; i++) {
        t->tok_str[ve[i].id] = t->arena + ve[i].off;
        t->tok_len[ve[i].id] = (uint32_t)ve[i].len;
    }
    free(ve);
    t->added = xcalloc((size_t)na, sizeof *t->added);
    t->n_added = na;
    strmap_init(&t->added_map, (size_t)na);
    for (int i = 0; i < na; i++) {
        added_token *a = &t->added[i];
        *a = (added_token){ .content = t->arena + ae[i].off, .len = (uint32_t)ae[i].len, .id = ae[i].id,
                            .special = ae[i].special, .normalized = ae[i].normalized,
                            .lstrip = ae[i].lstrip, .rstrip = ae[i].rstrip,
                            .single_word = ae[i].single_word };
        strmap_put(&t->added_map, a->content, a->len, i);
        t->tok_str[a->id] = a->content;
        t->tok_len[a->id] = a->len;
        if (a->special) t->special[a->id] = true;
    }
    free(ae);
    trie_build(&t->trie_raw, t, false);
    trie_build(&t->trie_norm, t, true);
    for (int i = 0; i < na && !t->word_re; i++) {
        if (!t->added[i].single_word) continue;
        /* Rust regex's \w, which HF's single_word check uses. */
        static const char word[] = "[\\p{Alphabetic}\\p{L}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]";
        char rerr[256];
        t->word_re = onig_regex_compile(word, strlen(word), false, rerr, sizeof rerr);
        if (!t->word_re) return fail(L, "added_tokens: word pattern: %s", rerr);
    }
    if (load_decoder(L, root)) return -1;
    t->bos_id = tok_token_to_id(t, "<｜begin▁of▁sentence｜>", strlen("<｜begin▁of▁sentence｜>"));
    t->eos_id = tok_token_to_id(t, "<｜end▁of▁sentence｜>", strlen("<｜end▁of▁sentence｜>"));
    return 0;
}

tokenizer *tok_load(const char *path, char *err, size_t errlen)
{
    strbuf text;
    sb_init(&text);
    if (sb_read_file(&text, path)) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        sb_free(&text);
        return NULL;
    }
    char msg[512];
    yajl_val root = json_parse(text.data, text.len, msg, sizeof msg);
    sb_free(&text);
    if (!root) {
        snprintf(err, errlen, "%s: invalid JSON: %s", path, msg);
        return NULL;
    }
    loader L = { .t = xcalloc(1, sizeof(tokenizer)), .err = msg, .errlen = sizeof msg };
    sb_init(&L.arena);
    int rc = load_all(&L, root);
    yajl_tree_free(root);
    sb_free(&L.arena);
    if (rc) {
        snprintf(err, errlen, "%s: %s", path, msg);
        tok_free(L.t);
        return NULL;
    }
    return L.t;
}

static void trie_free(token_trie *tr)
{
    u64map_free(&tr->child);
    free(tr->term);
}

void tok_free(tokenizer *t)
{
    if (!t) return;
    free(t->arena);
    free(t->tok_str);
    free(t->tok_len);
    free(t->special);
    free(t->dec);
    free(t->dec_off);
    free(t->dec_len);
    strmap_free(&t->vocab);
    u64map_free(&t->merges);
    for (int i = 0; i < t->n_splits; i++) onig_regex_free(t->splits[i].re);
    free(t->splits);
    onig_regex_free(t->byte_level_re);
    free(t->added);
    strmap_free(&t->added_map);
    trie_free(&t->trie_raw);
    trie_free(&t->trie_norm);
    onig_regex_free(t->word_re);
    free(t);
}
