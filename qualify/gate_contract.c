/* Reasoning prompt contract: one short conversation rendered in thinking
 * mode at reasoning effort low, high and max through /tokenize.  The
 * prompt token counts and fingerprints (SHA-256 of the ids) identify the
 * exact prompts; --contract FILE fails on any drift from pinned values,
 * --write-contract FILE pins the current ones.
 *
 * Contract file (JSON):
 *   {"schema": "llm-qualify/contract/1", "conversation_sha256": HEX,
 *    "efforts": {"low": {"prompt_tokens": N, "fingerprint": HEX}, ...}} */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "json.h"
#include "qualify.h"
#include "sha256.h"
#include "tokenize.h"

#define CONTRACT_SCHEMA "llm-qualify/contract/1"

static const char conversation[] =
    "[{\"role\":\"user\",\"content\":\"Write a Python function that returns the sum of the "
    "squares of a list of integers.\"}]";
static const char *const efforts[] = { "low", "high", "max" };
#define N_EFFORTS 3

struct rendered {
    long count;
    char fp[65];
    int  ok;
};

static int write_contract(const char *path, const char *conv_hash, const struct rendered *r,
                          strbuf *doc, strbuf *why)
{
    jw w;
    jw_init(&w, doc);
    jw_obj(&w, NULL);
    jw_str(&w, "schema", CONTRACT_SCHEMA);
    jw_str(&w, "conversation_sha256", conv_hash);
    jw_obj(&w, "efforts");
    for (int i = 0; i < N_EFFORTS; i++) {
        jw_obj(&w, efforts[i]);
        jw_int(&w, "prompt_tokens", r[i].count);
        jw_str(&w, "fingerprint", r[i].fp);
        jw_end(&w);
    }
    jw_end(&w);
    jw_end(&w);
    sb_putc(doc, '\n');
    FILE *f = fopen(path, "w");
    int bad = !f || sb_fwrite(doc, f);
    if (f && fclose(f) != 0) bad = 1;
    if (bad) sb_printf(why, "cannot write %s", path);
    return bad ? -1 : 0;
}

/* Compare with the pinned contract; each drift is its own failed check. */
static void compare_contract(qctx *q, gate *g, const char *conv_hash, const struct rendered *r)
{
    strbuf text;
    sb_init(&text);
    char err[256];
    yajl_val c = NULL;
    if (sb_read_file(&text, q->contract_path) < 0) {
        gate_check(g, ST_FAIL, "contract", "cannot read --contract %s", q->contract_path);
        goto out;
    }
    q_keep(q, "contract", ".json", text.data, text.len);
    c = json_parse(text.data, text.len, err, sizeof err);
    const char *schema = json_string(json_get(c, "schema"));
    if (!c) {
        gate_check(g, ST_FAIL, "contract", "%s is not JSON: %s", q->contract_path, err);
        goto out;
    }
    if (!schema || strcmp(schema, CONTRACT_SCHEMA)) {
        gate_check(g, ST_FAIL, "contract", "%s: \"schema\" must be \"%s\"", q->contract_path,
                   CONTRACT_SCHEMA);
        goto out;
    }
    const char *pinned_conv = json_string(json_get(c, "conversation_sha256"));
    if (!pinned_conv || strcmp(pinned_conv, conv_hash)) {
        gate_check(g, ST_FAIL, "contract conversation",
                   "%s was pinned for another conversation (conversation_sha256 %s, this tool "
                   "renders %s): re-pin with --write-contract", q->contract_path,
                   pinned_conv ? pinned_conv : "missing", conv_hash);
        goto out;
    }
    for (int i = 0; i < N_EFFORTS; i++) {
        char name[64];
        snprintf(name, sizeof name, "contract %s", efforts[i]);
        yajl_val e = json_get(json_get(c, "efforts"), efforts[i]);
        long long n;
        const char *fp = json_string(json_get(e, "fingerprint"));
        if (!json_int(json_get(e, "prompt_tokens"), &n) || !fp) {
            gate_check(g, ST_FAIL, name, "%s: efforts.%s needs prompt_tokens and fingerprint",
                       q->contract_path, efforts[i]);
        } else if (!r[i].ok) {
            gate_check(g, ST_FAIL, name, "not rendered (see the render check)");
        } else if (n != r[i].count || strcasecmp(fp, r[i].fp)) {
            gate_check(g, ST_FAIL, name,
                       "drift: pinned %lld tokens %.16s..., now %ld tokens %.16s...", n, fp,
                       r[i].count, r[i].fp);
        } else {
            gate_check(g, ST_PASS, name, "%ld tokens, fingerprint %.16s... as pinned", r[i].count,
                       r[i].fp);
        }
    }
out:
    yajl_tree_free(c);
    sb_free(&text);
}

void gate_contract(qctx *q, gate *g)
{
    char conv_hash[65];
    sha256_hex(conversation, strlen(conversation), conv_hash);
    jw_str(&g->mw, "conversation_sha256", conv_hash);
    struct rendered r[N_EFFORTS];
    memset(r, 0, sizeof r);
    jw_obj(&g->mw, "efforts");
    for (int i = 0; i < N_EFFORTS; i++) {
        if (time_left(q) <= 0) break;
        strbuf body, why;
        sb_init(&body);
        sb_init(&why);
        jw w;
        jw_init(&w, &body);
        jw_obj(&w, NULL);
        jw_str(&w, "model", q->model);
        jw_json(&w, "messages", conversation);
        jw_json(&w, "chat_template_kwargs", "{\"thinking\":true}");
        jw_str(&w, "reasoning_effort", efforts[i]);
        jw_end(&w);
        char label[32], name[32];
        snprintf(label, sizeof label, "tokenize-%s", efforts[i]);
        snprintf(name, sizeof name, "render %s", efforts[i]);
        tok_result t;
        if (tokenize_chat(q, label, body.data, body.len, 1, &t, &why) < 0) {
            gate_check(g, ST_FAIL, name, "%s", why.data);
        } else if (!t.ids) {
            gate_check(g, ST_FAIL, name, "/tokenize returned a count (%ld) but no \"tokens\": the "
                       "fingerprint cannot be computed", t.count);
        } else {
            r[i].ok = 1;
            r[i].count = t.count;
            memcpy(r[i].fp, t.fingerprint, sizeof r[i].fp);
            jw_obj(&g->mw, efforts[i]);
            jw_int(&g->mw, "prompt_tokens", t.count);
            jw_str(&g->mw, "fingerprint", t.fingerprint);
            jw_str(&g->mw, "server_fingerprint", t.server_fingerprint[0] ? t.server_fingerprint : NULL);
            jw_end(&g->mw);
            if (!t.server_fingerprint[0]) {
                gate_check(g, ST_PASS, name, "%ld tokens, fingerprint %.16s... (computed from the "
                           "ids; the server sends none)", t.count, t.fingerprint);
            } else if (strlen(t.server_fingerprint) != 64) {
                gate_check(g, ST_PASS, name, "%ld tokens, fingerprint %.16s...", t.count,
                           t.fingerprint);
                gate_caveat(g, "the server's %s fingerprint \"%s\" is not a SHA-256 hex digest; "
                            "not compared", efforts[i], t.server_fingerprint);
            } else if (strcasecmp(t.server_fingerprint, t.fingerprint)) {
                gate_check(g, ST_FAIL, name, "the server's fingerprint %s differs from the SHA-256 "
                           "of its own token ids %s", t.server_fingerprint, t.fingerprint);
            } else {
                gate_check(g, ST_PASS, name, "%ld tokens, fingerprint %.16s... (agrees with the "
                           "server's)", t.count, t.fingerprint);
            }
        }
        tok_result_free(&t);
        sb_free(&body);
        sb_free(&why);
    }
    jw_end(&g->mw);
    if (!(r[0].ok && r[1].ok && r[2].ok)) return;

    /* Effort must change the prompt (V4 prepends a paragraph for high and
     * max): equal prompts mean the server ignored reasoning_effort. */
    if (!strcmp(r[0].fp, r[1].fp) || !strcmp(r[1].fp, r[2].fp) || !strcmp(r[0].fp, r[2].fp))
        gate_check(g, ST_FAIL, "efforts differ", "two efforts render the same prompt (%ld/%ld/%ld "
                   "tokens): reasoning_effort is ignored in thinking mode", r[0].count, r[1].count,
                   r[2].count);
    else
        gate_check(g, ST_PASS, "efforts differ", "low/high/max render three different prompts");

    if (q->contract_path) compare_contract(q, g, conv_hash, r);
    else gate_caveat(g, "no --contract: the values are recorded, not compared with pinned ones");
    if (q->write_contract_path) {
        strbuf doc, why;
        sb_init(&doc);
        sb_init(&why);
        if (write_contract(q->write_contract_path, conv_hash, r, &doc, &why) < 0)
            gate_check(g, ST_FAIL, "write contract", "%s", why.data);
        else
            q_keep(q, "written-contract", ".json", doc.data, doc.len);
        sb_free(&doc);
        sb_free(&why);
    }
    gate_summary(g, "Low/high/max fingerprints %s at %ld/%ld/%ld prompt tokens",
                 q->contract_path ? (g->n_fail ? "drifted" : "matched the contract") : "recorded",
                 r[0].count, r[1].count, r[2].count);
}
