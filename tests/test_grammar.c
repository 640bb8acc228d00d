/* Constrained decoding: schema compile errors, accepted and rejected
 * strings, masks over the fixture tokenizer, the budget rule, and random
 * walks through masks whose text must parse and validate (JSON) or parse
 * as tool calls whose arguments validate (DSML). */
#include <stdlib.h>
#include <string.h>

#include "constraint.h"
#include "json.h"
#include "json_schema.h"
#include "output_parser.h"
#include "schema_check.h"
#include "tap.h"
#include "token_mask.h"
#include "tokenizer.h"

static const char *FIXTURE = "tests/fixtures/tokenizer/tokenizer.json";
static tokenizer *tok;
static token_trie *trie;
static int32_t eos;

static yajl_val parse(const char *s)
{
    char err[128];
    yajl_val v = json_parse(s, strlen(s), err, sizeof err);
    if (!v) diag("bad test JSON: %s: %s", err, s);
    return v;
}

/* A matcher for a schema text; NULL with err. */
static token_matcher *schema_matcher(const char *schema, schema_error *err)
{
    yajl_val s = parse(schema);
    grammar *g = grammar_new();
    int r = json_schema_rule(g, s, "schema", err);
    char why[128];
    if (r < 0 || grammar_finish(g, r, token_trie_lit_cost, trie, why, sizeof why)) {
        grammar_free(g);
        yajl_tree_free(s);
        return NULL;
    }
    yajl_tree_free(s);
    return token_matcher_new(trie, g, eos);
}

static bool accepts(const char *schema, const char *text)
{
    schema_error err;
    token_matcher *m = schema_matcher(schema, &err);
    if (!m) { diag("compile: %s", err.message); return false; }
    bool ok = token_matcher_bytes(m, text, strlen(text)) == 0 && token_matcher_accepting(m);
    token_matcher_free(m);
    return ok;
}

static uint64_t rng = 88172645463325252ULL;
static uint64_t next(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }

/* Walk: sample uniformly among allowed tokens (biased towards ending with
 * probability p_eos when EOS is allowed) until EOS.  Returns the text;
 * *n_tok the tokens used (EOS included); false when a mask was empty or a
 * sampled token was refused. */
static bool walk(token_matcher *m, int budget, strbuf *out, int *n_tok)
{
    size_t words = token_mask_words(trie);
    uint64_t *mask = malloc(words * sizeof *mask);
    int32_t *ids = malloc((size_t)token_trie_vocab(trie) * sizeof *ids);
    bool ok = true;
    *n_tok = 0;
    for (int used = 0;; used++) {
        token_matcher_mask(m, budget - used, mask);
        int n = 0;
        for (int32_t t = 0; t < token_trie_vocab(trie); t++)
            if (token_mask_has(mask, t)) ids[n++] = t;
        if (!n || used >= budget) { ok = false; break; }
        int32_t t = ids[next() % (uint64_t)n];
        if (token_mask_has(mask, eos) && next() % 8 == 0) t = eos;
        if (token_matcher_accept(m, t)) { ok = false; break; }
        (*n_tok)++;
        if (t == eos) break;
        size_t l;
        const char *b = tok_id_bytes(tok, t, &l);
        sb_append(out, b, l);
    }
    free(mask);
    free(ids);
    return ok;
}

static const char *const schemas[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"enum\":[\"a\",\"b c\",\"\\u00e9\"]},\"maxItems\":3}},"
    "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}",
    "{\"type\":\"object\",\"properties\":{\"loc\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\","
    "\"maxLength\":5},\"lat\":{\"type\":\"number\"},\"when\":{\"type\":\"string\",\"format\":\"date-time\"}},"
    "\"required\":[\"city\",\"lat\",\"when\"],\"additionalProperties\":false},\"unit\":{\"enum\":[\"c\",\"f\",null,1.5]},"
    "\"ok\":{\"type\":[\"boolean\",\"null\"]},\"id\":{\"type\":\"string\",\"format\":\"uuid\"}},"
    "\"required\":[\"loc\",\"unit\",\"ok\",\"id\"],\"additionalProperties\":false}",
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"const\":7},\"kids\":{\"type\":\"array\","
    "\"items\":{\"$ref\":\"#/$defs/node\"},\"minItems\":0,\"maxItems\":2}},\"required\":[\"v\",\"kids\"],"
    "\"additionalProperties\":false}},\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"array\",\"items\":"
    "{\"type\":\"integer\"},\"minItems\":2}]}",
    "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"number\"}}",
    "{}",
    "{\"type\":\"string\",\"minLength\":2,\"maxLength\":4}",
    "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"},\"t\":{\"type\":\"string\","
    "\"format\":\"time\"}},\"required\":[\"d\"]}",
};

static void test_errors(void)
{
    static const struct { const char *schema, *path; } bad[] = {
        { "{\"type\":\"string\",\"pattern\":\"a+\"}", "schema.pattern" },
        { "{\"type\":\"integer\",\"minimum\":3}", "schema.minimum" },
        { "{\"oneOf\":[{\"type\":\"string\"}]}", "schema.oneOf" },
        { "{\"type\":\"object\",\"properties\":{\"a\":{\"allOf\":[]}}}", "schema.properties.a.allOf" },
        { "{\"type\":\"string\",\"format\":\"email\"}", "schema.format" },
        { "{\"$ref\":\"#/$defs/missing\"}", "schema.$ref" },
        { "{\"$ref\":\"http://x/y\"}", "schema.$ref" },
        { "{\"type\":\"wat\"}", "schema.type" },
        { "{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}", "schema.required[0]" },
        { "{\"type\":\"array\",\"minItems\":5000}", "schema.minItems" },
        { "{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "schema" },
        { "{\"$defs\":{\"x\":{\"$ref\":\"#/$defs/x\"}},\"$ref\":\"#/$defs/x\"}", "response_format" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        yajl_val s = parse(bad[i].schema);
        grammar *g = grammar_new();
        schema_error err;
        int r = json_schema_rule(g, s, "schema", &err);
        char why[128] = "";
        if (r >= 0 && !grammar_finish(g, r, token_trie_lit_cost, trie, why, sizeof why)) {
            ok(0, "schema %zu is refused (compiled instead)", i);
        } else if (r >= 0) {
            ok(!strcmp(bad[i].path, "response_format"), "schema %zu refused at finish: %s", i, why);
        } else {
            ok(!strcmp(err.path, bad[i].path) && strstr(err.message, bad[i].path),
               "schema %zu: '%s' names %s", i, err.message, bad[i].path);
        }
        grammar_free(g);
        yajl_tree_free(s);
    }
}

static void test_strings(void)
{
    const char *s0 = schemas[0];
    ok(accepts(s0, "{\"name\":\"x\",\"age\":3}"), "required only");
    ok(accepts(s0, "{\"name\": \"\\u00e9\\n\", \"age\": -10, \"tags\": [\"b c\", \"\xc3\xa9\"]}"),
       "with spaces, escapes, optional array");
    ok(!accepts(s0, "{\"age\":3,\"name\":\"x\"}"), "out of order is refused");
    ok(!accepts(s0, "{\"name\":\"x\"}"), "missing required refused");
    ok(!accepts(s0, "{\"name\":\"x\",\"age\":3.5}"), "float for integer refused");
    ok(!accepts(s0, "{\"name\":\"x\",\"age\":03}"), "leading zero refused");
    ok(!accepts(s0, "{\"name\":\"x\",\"age\":1,\"tags\":[\"a\",\"a\",\"a\",\"a\"]}"), "maxItems");
    ok(!accepts(s0, "{\"name\":\"x\",\"age\":1,\"tags\":[\"d\"]}"), "enum");
    ok(!accepts(s0, "{\"name\":\"\\u0000\",\"age\":1}"), "\\u0000 refused");
    ok(!accepts(s0, "{\"name\":\"\xef\xbd\x9c\",\"age\":1}"), "U+FF5C refused");
    ok(!accepts(s0, "{\"name\":\"\xc3\",\"age\":1}"), "broken UTF-8 refused");
    ok(!accepts(s0, "{\"name\":\"x\",  \"age\":1}"), "two spaces refused");
    ok(accepts(schemas[1], "{\"loc\":{\"city\":\"Paris\",\"lat\":-1.5e+3,\"when\":\"2024-02-29T10:00:00Z\"},"
                           "\"unit\":null,\"ok\":true,\"id\":\"0123abcd-0000-4000-8000-00000000abcd\"}"),
       "nested object, enum null, format");
    ok(!accepts(schemas[1], "{\"loc\":{\"city\":\"Parisx\",\"lat\":1,\"when\":\"2024-02-29T10:00:00Z\"},"
                            "\"unit\":null,\"ok\":true,\"id\":\"0123abcd-0000-4000-8000-00000000abcd\"}"),
       "maxLength");
    ok(accepts(schemas[2], "{\"v\":7,\"kids\":[{\"v\":7,\"kids\":[]}]}"), "recursive $ref");
    ok(accepts(schemas[2], "[1,2,3]"), "anyOf second branch");
    ok(!accepts(schemas[2], "[1]"), "minItems in anyOf");
    ok(accepts(schemas[3], "{}") && accepts(schemas[3], "{\"k\":1,\"k2\":2}"), "map");
    ok(accepts(schemas[4], "[{\"a\":null},true,\"s\",-0.0]"), "any value");
    ok(!accepts(schemas[5], "\"a\"") && accepts(schemas[5], "\"ab\"") && accepts(schemas[5], "\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\"")
       && !accepts(schemas[5], "\"abcde\""), "minLength/maxLength in characters");
}

static void test_masks(void)
{
    grammar *g = grammar_new();
    int r = json_object_rule(g);
    char why[64];
    grammar_finish(g, r, token_trie_lit_cost, trie, why, sizeof why);
    token_matcher *m = token_matcher_new(trie, g, eos);
    size_t words = token_mask_words(trie);
    uint64_t *mask = calloc(words, sizeof *mask);
    token_matcher_mask(m, 100, mask);
    int n = 0;
    bool only_brace = true;
    for (int32_t t = 0; t < token_trie_vocab(trie); t++) {
        if (!token_mask_has(mask, t)) continue;
        n++;
        size_t l;
        const char *b = tok_id_bytes(tok, t, &l);
        if (!b || b[0] != '{') only_brace = false;
    }
    ok(n > 0 && only_brace && !token_mask_has(mask, eos), "json_object starts with '{' tokens only (%d)", n);
    /* every token allowed by a mask is exactly one that matches bytewise */
    token_matcher_bytes(m, "{\"a\": [1, ", 10);
    token_matcher_mask(m, 1000, mask);
    int bad = 0, checked = 0;
    for (int32_t t = 0; t < tok_vocab_size(tok); t++) {
        size_t l;
        const char *b = tok_id_bytes(tok, t, &l);
        if (!b || !l || tok_is_special(tok, t)) {
            bad += token_mask_has(mask, t);
            continue;
        }
        /* a fresh matcher on the same prefix */
        grammar *g2 = grammar_new();
        int r2 = json_object_rule(g2);
        grammar_finish(g2, r2, token_trie_lit_cost, trie, why, sizeof why);
        token_matcher *m2 = token_matcher_new(trie, g2, eos);
        token_matcher_bytes(m2, "{\"a\": [1, ", 10);
        bool byte_ok = token_matcher_bytes(m2, b, l) == 0;
        token_matcher_free(m2);
        bad += byte_ok != token_mask_has(mask, t);
        checked++;
    }
    ok(!bad && checked > 3000, "mask equals the bytewise check for all %d tokens (%d differ)", checked, bad);
    ok(!tok_is_special(tok, 0) || !token_mask_has(mask, 0), "BOS never allowed");
    token_matcher_free(m);

    /* the budget: at the edge, only tokens after which the reply still fits */
    m = schema_matcher(schemas[0], &(schema_error){ 0 });
    int need = token_matcher_min(m);
    ok(need > 0 && need <= (int)strlen("{\"name\":\"\",\"age\":0}"),
       "least cost of schema 0: %d tokens, at most its 19 bytes", need);
    static const char prefix[] = "{\"name\":\"abc";
    token_matcher_bytes(m, prefix, strlen(prefix));
    int left = token_matcher_min(m) + 1;
    token_matcher_mask(m, left, mask);
    n = 0;
    int over = 0;
    for (int32_t t = 0; t < token_trie_vocab(trie); t++) {
        if (!token_mask_has(mask, t)) continue;
        n++;
        token_matcher *m2 = schema_matcher(schemas[0], &(schema_error){ 0 });
        token_matcher_bytes(m2, prefix, strlen(prefix));
        if (token_matcher_accept(m2, t) || token_matcher_min(m2) > left - 2) over++;
        token_matcher_free(m2);
    }
    int32_t a_id = tok_token_to_id(tok, "a", 1);
    ok(n > 0 && !over && !token_mask_has(mask, a_id),
       "with %d tokens left: %d allowed, none leaves too little, 'a' is not", left, n);
    token_matcher_mask(m, left + 1, mask);
    ok(token_mask_has(mask, a_id), "one more token of budget allows 'a'");
    token_matcher_free(m);
    free(mask);
}

static int checked_walks;

static void fuzz_json(void)
{
    int fails = 0, runs = 0;
    for (size_t i = 0; i < sizeof schemas / sizeof schemas[0]; i++) {
        yajl_val s = parse(schemas[i]);
        for (int k = 0; k < 40; k++) {
            schema_error err;
            token_matcher *m = schema_matcher(schemas[i], &err);
            int budget = token_matcher_min(m) + 1 + (k % 4 ? (int)(next() % 60) : 0);
            strbuf out;
            sb_init(&out);
            int used;
            bool ok_walk = walk(m, budget, &out, &used);
            char perr[128];
            yajl_val v = ok_walk ? json_parse(out.data ? out.data : "", out.len, perr, sizeof perr) : NULL;
            bool good = ok_walk && used <= budget && v && sc_valid(s, s, v);
            if (!good && fails++ < 5)
                diag("schema %zu walk %d (budget %d, used %d): %.*s", i, k, budget, used,
                     (int)out.len, out.data ? out.data : "");
            runs++;
            yajl_tree_free(v);
            sb_free(&out);
            token_matcher_free(m);
        }
        yajl_tree_free(s);
    }
    checked_walks += runs;
    ok(!fails, "%d random walks within budget parse and validate (%d failed)", runs, fails);
}

#define DS "\xef\xbd\x9c" "DSML" "\xef\xbd\x9c"

static uint64_t id_rand(void *ctx) { (void)ctx; return next(); }

static void fuzz_tools(void)
{
    const char *tools_json =
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"city\":{\"type\":\"string\"},\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\",\"fahrenheit\"]},"
        "\"days\":{\"type\":\"integer\"},\"opts\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"boolean\"}},"
        "\"required\":[\"x\"],\"additionalProperties\":false}},\"required\":[\"city\",\"unit\"],\"additionalProperties\":false}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"noop\",\"parameters\":{\"type\":\"object\",\"properties\":{}}}}]";
    static const char *const reqs[] = {
        "{\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}",
        "{\"tool_choice\":\"required\"}",
        "{\"tool_choice\":\"required\",\"parallel_tool_calls\":false}",
        "{\"parallel_tool_calls\":false}",
        "{\"tool_choice\":\"auto\",\"response_format\":{\"type\":\"json_object\"}}",
    };
    yajl_val tools = parse(tools_json);
    int fails = 0, runs = 0;
    for (size_t i = 0; i < sizeof reqs / sizeof reqs[0]; i++) {
        for (int k = 0; k < 40; k++) {
            strbuf rq;
            sb_init(&rq);
            sb_printf(&rq, "%.*s,\"tools\":%s}", (int)strlen(reqs[i]) - 1, reqs[i], tools_json);
            yajl_val req = parse(rq.data);
            grammar *g;
            schema_error err;
            if (constraint_from_request(req, trie, &g, &err) || !g) {
                diag("constraint: %s", err.message);
                fails++;
                yajl_tree_free(req);
                sb_free(&rq);
                continue;
            }
            token_matcher *m = token_matcher_new(trie, g, eos);
            int budget = token_matcher_min(m) + 1 + (k % 4 ? (int)(next() % 80) : 0);
            strbuf out;
            sb_init(&out);
            int used;
            bool good = walk(m, budget, &out, &used);
            parsed_message pm;
            parsed_message_init(&pm);
            output_parser *p = output_parser_new(false, parsed_message_on_event, &pm, id_rand, NULL);
            output_parser_feed(p, out.data ? out.data : "", out.len);
            output_parser_finish(p, GEN_STOP);
            if (i < 3) {   /* forced */
                good = good && pm.n_calls >= 1 && pm.content.len == 0 && pm.finish == FINISH_TOOL_CALLS;
                if (i != 1) good = good && pm.n_calls == 1;
            } else if (i == 3) {   /* auto, at most one call */
                good = good && pm.n_calls <= 1;
            } else {   /* auto + json_object: a JSON object, or calls */
                char perr[64];
                yajl_val v = pm.n_calls ? NULL : json_parse(pm.content.data ? pm.content.data : "",
                                                            pm.content.len, perr, sizeof perr);
                good = good && (pm.n_calls ? !pm.content.len : YAJL_IS_OBJECT(v));
                yajl_tree_free(v);
            }
            for (size_t c = 0; good && c < pm.n_calls; c++) {
                size_t t = !strcmp(pm.calls[c].name, "get_weather") ? 0 : 1;
                if (i == 0 && t != 0) good = false;
                yajl_val schema = json_get(json_get(tools->u.array.values[t], "function"), "parameters");
                char perr[64];
                yajl_val args = json_parse(pm.calls[c].args.data, pm.calls[c].args.len, perr, sizeof perr);
                good = good && args && sc_valid(schema, schema, args);
                yajl_tree_free(args);
            }
            if (!good && fails++ < 5) diag("tools %zu walk %d: %.*s", i, k, (int)out.len, out.data);
            runs++;
            output_parser_free(p);
            parsed_message_free(&pm);
            sb_free(&out);
            token_matcher_free(m);
            yajl_tree_free(req);
            sb_free(&rq);
        }
    }
    ok(!fails, "%d random DSML walks parse as tool calls with valid arguments (%d failed)", runs, fails);

    /* auto with parallel_tool_calls false: text, then at most one block */
    strbuf rq;
    sb_init(&rq);
    sb_printf(&rq, "{\"parallel_tool_calls\":false,\"tools\":%s}", tools_json);
    yajl_val req = parse(rq.data);
#define BLOCK(calls) "\n\n<" DS "tool_calls>\n" calls "\n</" DS "tool_calls>"
#define NOOP "<" DS "invoke name=\"noop\">\n\n</" DS "invoke>"
    static const struct { const char *text; bool good; } cases[] = {
        { "just text, \n\n< and \n\n<x", true },
        { "", true },
        { "hi" BLOCK(NOOP), true },
        { BLOCK(NOOP), true },
        { "hi" BLOCK(NOOP) "more", false },
        { "hi" BLOCK(NOOP) BLOCK(NOOP), false },
        { "hi" BLOCK(NOOP "\n" NOOP), false },
        { "hi\n\n<" DS "tool_calls junk", false },
        { "hi\n\n\n<" DS "tool_calls>\n<" DS "invoke name=\"nope\">", false },
    };
    int bad = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        grammar *g;
        schema_error err;
        constraint_from_request(req, trie, &g, &err);
        token_matcher *m = token_matcher_new(trie, g, eos);
        bool acc = token_matcher_bytes(m, cases[c].text, strlen(cases[c].text)) == 0
                   && token_matcher_accepting(m);
        if (acc != cases[c].good) { bad++; diag("auto case %zu: %s", c, acc ? "accepted" : "refused"); }
        token_matcher_free(m);
    }
    ok(!bad, "tool_choice auto, parallel_tool_calls false: text and at most one call");
    yajl_tree_free(req);
    sb_free(&rq);
    yajl_tree_free(tools);
}

/* A cache shared by two matchers and prewarmed gives the masks a private
 * cache gives, step by step along a random walk. */
static void test_shared(void)
{
    size_t words = token_mask_words(trie);
    uint64_t *a = malloc(words * sizeof *a), *b = malloc(words * sizeof *b);
    int differ = 0, steps = 0;
    for (size_t i = 0; i < sizeof schemas / sizeof schemas[0]; i++) {
        schema_error err;
        token_matcher *priv = schema_matcher(schemas[i], &err);
        yajl_val sv = parse(schemas[i]);
        grammar *g = grammar_new();
        int r = json_schema_rule(g, sv, "schema", &err);
        char why[64];
        grammar_finish(g, r, token_trie_lit_cost, trie, why, sizeof why);
        mask_cache *mc = mask_cache_new(trie, g);
        mask_cache_prewarm(mc, 512);
        token_matcher *other = token_matcher_shared(mc, eos), *sh = token_matcher_shared(mc, eos);
        mask_cache_unref(mc);   /* the matchers keep it */
        token_matcher_free(other);
        for (int used = 0; used < 80; used++, steps++) {
            token_matcher_mask(priv, 80 - used, a);
            token_matcher_mask(sh, 80 - used, b);
            differ += memcmp(a, b, words * sizeof *a) != 0;
            int32_t n = 0, t = -1;
            for (int32_t x = 0; x < token_trie_vocab(trie); x++)   /* reservoir: uniform */
                if (token_mask_has(a, x) && x != eos && next() % (uint64_t)++n == 0) t = x;
            if (!n) break;
            if (t == eos || token_matcher_accept(priv, t) || token_matcher_accept(sh, t)) break;
        }
        token_matcher_free(priv);
        token_matcher_free(sh);
        yajl_tree_free(sv);
    }
    ok(!differ && steps > 100, "shared, prewarmed caches give the private masks (%d steps, %d differ)",
       steps, differ);
    free(a);
    free(b);
}

int main(void)
{
    char err[256];
    tok = tok_load(FIXTURE, err, sizeof err);
    if (!tok) { printf("Bail out! %s\n", err); return 1; }
    eos = tok_eos_id(tok);
    trie = token_trie_new(tok, tok_vocab_size(tok), err, sizeof err);
    if (!trie) { printf("Bail out! %s\n", err); return 1; }
    test_errors();
    test_strings();
    test_masks();
    fuzz_json();
    fuzz_tools();
    test_shared();
    token_trie_free(trie);
    tok_free(tok);
    return exit_status();
}
