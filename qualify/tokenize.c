#include "tokenize.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "sha256.h"

void ids_fingerprint(const uint32_t *ids, size_t n, char hex[65])
{
    sha256_ctx c;
    sha256_init(&c);
    for (size_t i = 0; i < n; i++) {
        uint8_t le[4] = { (uint8_t)ids[i], (uint8_t)(ids[i] >> 8), (uint8_t)(ids[i] >> 16),
                          (uint8_t)(ids[i] >> 24) };
        sha256_update(&c, le, 4);
    }
    uint8_t d[32];
    sha256_final(&c, d);
    sha256_to_hex(d, hex);
}

void tok_result_free(tok_result *t)
{
    free(t->ids);
    t->ids = NULL;
}

int tokenize_chat(qctx *q, const char *label, const char *body, size_t len, int keep,
                  tok_result *t, strbuf *why)
{
    memset(t, 0, sizeof *t);
    http_resp r;
    http_resp_init(&r);
    if (keep) q_http(q, label, "POST", "/tokenize", body, len, false, NULL, NULL, &r);
    else http_request(q->http, "POST", "/tokenize", body, len, false, req_timeout(q), NULL, NULL, &r);
    int rc = -1;
    char err[256];
    yajl_val v = NULL;
    if (r.status != 200 || r.error[0]) {
        sb_puts(why, "/tokenize: ");
        describe_error(&r, why);
        goto out;
    }
    v = json_parse(r.body.data, r.body.len, err, sizeof err);
    long long count = -1, mml = 0;
    yajl_val ids = json_get(v, "tokens");
    if (!v) {
        sb_printf(why, "/tokenize: the body is not JSON: %s", err);
        goto out;
    }
    if (!json_int(json_get(v, "count"), &count) || count < 0) {
        sb_puts(why, "/tokenize: no integer \"count\"");
        goto out;
    }
    json_int(json_get(v, "max_model_len"), &mml);
    t->count = (long)count;
    t->max_model_len = (long)mml;
    if (YAJL_IS_ARRAY(ids)) {
        size_t n = ids->u.array.len;
        if ((long long)n != count) {
            sb_printf(why, "/tokenize: \"count\" is %lld but \"tokens\" has %zu ids", count, n);
            goto out;
        }
        t->ids = malloc((n ? n : 1) * sizeof *t->ids);
        for (size_t i = 0; i < n; i++) {
            long long id;
            if (!json_int(ids->u.array.values[i], &id) || id < 0 || id > 0xffffffffLL) {
                sb_printf(why, "/tokenize: tokens[%zu] is not a token id", i);
                goto out;
            }
            t->ids[i] = (uint32_t)id;
        }
        ids_fingerprint(t->ids, n, t->fingerprint);
    }
    const char *fp = json_string(json_get(v, "fingerprint"));
    if (fp) snprintf(t->server_fingerprint, sizeof t->server_fingerprint, "%s", fp);
    rc = 0;
out:
    if (rc < 0 && !keep) {   /* a failure is always kept */
        q_keep(q, label, ".request.json", body, len);
        strbuf kept;
        sb_init(&kept);
        sb_printf(&kept, "POST /tokenize\n%s%s\n", r.error[0] ? "transport error: " : "", r.error);
        sb_append(&kept, r.headers.data ? r.headers.data : "", r.headers.len);
        sb_append(&kept, r.body.data ? r.body.data : "", r.body.len);
        q_keep(q, label, ".response.txt", kept.data, kept.len);
        sb_free(&kept);
    }
    yajl_tree_free(v);
    http_resp_free(&r);
    return rc;
}
