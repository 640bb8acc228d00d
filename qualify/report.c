/* OUT/qualification-status.json (machine-readable: identity, one entry
 * per gate, artifact hashes) and OUT/report.md (the r33-style table).
 * The status document is assembled as compact JSON, parsed back (so a
 * malformed one can never be written) and written indented. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "json.h"
#include "qualify.h"
#include "version.h"

/* Indented JSON, two spaces per level; numbers keep their text. */
static void pretty(strbuf *sb, yajl_val v, int depth)
{
    bool obj = YAJL_IS_OBJECT(v);
    if (obj || YAJL_IS_ARRAY(v)) {
        size_t n = obj ? v->u.object.len : v->u.array.len;
        sb_putc(sb, obj ? '{' : '[');
        for (size_t i = 0; i < n; i++) {
            sb_printf(sb, "%s\n%*s", i ? "," : "", 2 * (depth + 1), "");
            if (obj) {
                json_put_cstr(sb, v->u.object.keys[i]);
                sb_puts(sb, ": ");
            }
            pretty(sb, obj ? v->u.object.values[i] : v->u.array.values[i], depth + 1);
        }
        if (n) sb_printf(sb, "\n%*s", 2 * depth, "");
        sb_putc(sb, obj ? '}' : ']');
    } else if (YAJL_IS_NUMBER(v)) {
        sb_puts(sb, v->u.number.r);
    } else {
        json_dump(sb, v, JSON_COMPACT);
    }
}

static int write_file(const char *dir, const char *name, const char *data, size_t n, strbuf *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    int bad = !f || fwrite(data, 1, n, f) != n;
    if (f && fclose(f) != 0) bad = 1;
    if (bad) sb_printf(err, "cannot write %s", path);
    return bad ? -1 : 0;
}

static void iso_time(double unix_s, char *out, size_t cap)
{
    time_t t = (time_t)unix_s;
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* Splice bare members/elements a gate wrote into a container. */
static void splice(jw *w, const char *key, char open, const strbuf *body, char close)
{
    strbuf s;
    sb_init(&s);
    sb_putc(&s, open);
    sb_append(&s, body->data ? body->data : "", body->len);
    sb_putc(&s, close);
    jw_raw(w, key, s.data, s.len);
    sb_free(&s);
}

static void status_json(qctx *q, double started, double duration, strbuf *sb)
{
    jw w;
    jw_init(&w, sb);
    jw_obj(&w, NULL);
    jw_str(&w, "schema", QUALIFY_SCHEMA);
    jw_obj(&w, "tool");
    jw_str(&w, "name", "llm-qualify");
    jw_str(&w, "version", QUALIFY_VERSION);
    jw_str(&w, "build", llm_engine_build());
    jw_end(&w);
    char ts[32];
    iso_time(started, ts, sizeof ts);
    jw_str(&w, "started_at", ts);
    jw_num(&w, "duration_s", duration, 3);
    bool failed = false;
    jw_arr(&w, "required_failed");
    for (int i = 0; i < G_N; i++)
        if (q->gates[i].required && q->gates[i].status == ST_FAIL) {
            jw_str(&w, NULL, q->gates[i].id);
            failed = true;
        }
    jw_end(&w);
    jw_str(&w, "result", failed ? "fail" : "pass");
    if (http_interrupted) jw_str(&w, "interrupted", "a signal ended the run early");
    splice(&w, "identity", '{', &q->identity, '}');

    jw_obj(&w, "options");
    jw_str(&w, "base_url", q->base_url);
    jw_bool(&w, "model_is_random", q->model_is_random);
    jw_str(&w, "start_cmd", q->start_cmd);
    jw_str(&w, "contract", q->contract_path);
    jw_num(&w, "request_timeout_s", q->request_timeout_s, 0);
    jw_num(&w, "readmit_timeout_s", q->readmit_timeout_s, 0);
    jw_int(&w, "tool_calls", q->tool_calls);
    jw_int(&w, "quality_k", q->quality_k);
    jw_str(&w, "quality_effort", q->quality_effort);
    jw_int(&w, "max_tokens", q->quality_max_tokens);
    jw_int(&w, "needle_tokens", q->needle_tokens);
    jw_int(&w, "capacity_max_tokens", q->capacity_max_tokens);
    jw_int(&w, "capacity_retries", q->capacity_retries);
    jw_end(&w);

    jw_arr(&w, "gates");
    for (int i = 0; i < G_N; i++) {
        gate *g = &q->gates[i];
        jw_obj(&w, NULL);
        jw_str(&w, "id", g->id);
        jw_str(&w, "title", g->title);
        jw_str(&w, "status", status_name(g->status));
        jw_bool(&w, "required", g->required);
        jw_str(&w, "summary", g->summary.data ? g->summary.data : "");
        if (g->skipped) jw_str(&w, "skip_reason", g->skip_reason.data);
        jw_num(&w, "duration_s", g->duration_s, 3);
        jw_num(&w, "bound_s", g->bound_s, 0);
        splice(&w, "measurements", '{', &g->meas, '}');
        splice(&w, "checks", '[', &g->checks, ']');
        splice(&w, "caveats", '[', &g->caveats, ']');
        splice(&w, "artifacts", '[', &g->arts, ']');
        jw_end(&w);
    }
    jw_end(&w);

    jw_arr(&w, "artifacts");
    for (int i = 0; i < q->art.n; i++) {
        artifact *a = &q->art.items[i];
        jw_obj(&w, NULL);
        jw_str(&w, "path", a->path);
        jw_str(&w, "sha256", a->sha256[0] ? a->sha256 : NULL);
        jw_int(&w, "bytes", a->bytes);
        jw_end(&w);
    }
    jw_end(&w);
    jw_end(&w);
}

/* A table cell: one line, pipes escaped, long text cut (the Failures
 * section below has it whole). */
static void md_cell(strbuf *md, const char *s)
{
    size_t n = 0;
    for (; s && *s; s++, n++) {
        if (n >= 240 && ((unsigned char)*s & 0xc0) != 0x80) {   /* not inside a UTF-8 char */
            sb_puts(md, "...");
            break;
        }
        if (*s == '|') sb_puts(md, "\\|");
        else if (*s == '\n' || *s == '\r') sb_putc(md, ' ');
        else sb_putc(md, *s);
    }
}

static const char *id_str(yajl_val obj, const char *key)
{
    const char *s = json_string(json_get(obj, key));
    return s ? s : "(not reported)";
}

static void report_md(yajl_val doc, strbuf *md)
{
    yajl_val id = json_get(doc, "identity");
    sb_printf(md, "# Qualification of %s\n\n", id_str(id, "served_model"));
    sb_printf(md, "Date: %s  \nResult: **%s**", id_str(doc, "started_at"), id_str(doc, "result"));
    yajl_val rf = json_get(doc, "required_failed");
    for (size_t i = 0; i < json_len(rf); i++)
        sb_printf(md, "%s%s", i ? ", " : " (required gates failed: ", json_string(rf->u.array.values[i]));
    sb_puts(md, json_len(rf) ? ")\n\n" : "\n\n");

    sb_puts(md, "## Identity\n\n");
    long long mml;
    sb_printf(md, "- Endpoint: %s\n", id_str(id, "base_url"));
    if (json_int(json_get(id, "max_model_len"), &mml)) sb_printf(md, "- max_model_len: %lld\n", mml);
    sb_printf(md, "- Engine: %s (%s)\n", id_str(id, "engine_version"), id_str(id, "engine_build"));
    sb_printf(md, "- System fingerprint: %s\n", id_str(id, "system_fingerprint"));
    sb_printf(md, "- Recipe: %s, SHA-256 %s\n", id_str(id, "recipe_path"), id_str(id, "recipe_sha256"));
    sb_printf(md, "- Model config: SHA-256 %s\n", id_str(id, "model_config_sha256"));
    yajl_val notes = json_get(id, "notes");
    for (size_t i = 0; i < json_len(notes); i++)
        sb_printf(md, "- Note: %s\n", json_string(notes->u.array.values[i]));

    sb_puts(md, "\n## Gates and measurements\n\n| Gate | Status | Result |\n|---|---|---|\n");
    yajl_val gates = json_get(doc, "gates");
    for (size_t i = 0; i < json_len(gates); i++) {
        yajl_val g = gates->u.array.values[i];
        sb_puts(md, "| ");
        md_cell(md, json_string(json_get(g, "title")));
        sb_puts(md, " | ");
        md_cell(md, json_string(json_get(g, "status")));
        if (YAJL_IS_FALSE(json_get(g, "required"))) sb_puts(md, " (advisory)");
        sb_puts(md, " | ");
        md_cell(md, json_string(json_get(g, "summary")));
        sb_puts(md, " |\n");
    }

    int n = 0;
    for (size_t i = 0; i < json_len(gates); i++) {
        yajl_val g = gates->u.array.values[i];
        yajl_val checks = json_get(g, "checks");
        for (size_t j = 0; j < json_len(checks); j++) {
            yajl_val c = checks->u.array.values[j];
            const char *st = json_string(json_get(c, "status"));
            if (!st || strcmp(st, "fail")) continue;
            if (!n++) sb_puts(md, "\n## Failures\n\n");
            sb_printf(md, "- %s / %s: %s\n", json_string(json_get(g, "title")),
                      json_string(json_get(c, "name")), json_string(json_get(c, "detail")));
        }
    }
    n = 0;
    for (size_t i = 0; i < json_len(gates); i++) {
        yajl_val g = gates->u.array.values[i];
        yajl_val cav = json_get(g, "caveats");
        for (size_t j = 0; j < json_len(cav); j++) {
            if (!n++) sb_puts(md, "\n## Caveats\n\n");
            sb_printf(md, "- %s: %s\n", json_string(json_get(g, "title")),
                      json_string(cav->u.array.values[j]));
        }
    }
    sb_printf(md, "\n## Evidence\n\n%zu raw artifacts under artifacts/, each with its SHA-256 in "
              "qualification-status.json.\n", json_len(json_get(doc, "artifacts")));
}

int report_write(qctx *q, double started_unix, double duration_s, strbuf *err)
{
    strbuf compact, md;
    sb_init(&compact);
    sb_init(&md);
    status_json(q, started_unix, duration_s, &compact);
    char perr[256];
    yajl_val doc = json_parse(compact.data, compact.len, perr, sizeof perr);
    int rc = -1;
    if (!doc) {   /* a bug in a gate's JSON: say so, and keep the evidence */
        sb_printf(err, "internal error: the status document is not JSON (%s)", perr);
        write_file(q->out_dir, "qualification-status.invalid.json", compact.data, compact.len, err);
        goto out;
    }
    strbuf out;
    sb_init(&out);
    pretty(&out, doc, 0);
    sb_putc(&out, '\n');
    report_md(doc, &md);
    rc = write_file(q->out_dir, "qualification-status.json", out.data, out.len, err);
    if (rc == 0) rc = write_file(q->out_dir, "report.md", md.data, md.len, err);
    sb_free(&out);
out:
    yajl_tree_free(doc);
    sb_free(&compact);
    sb_free(&md);
    return rc;
}
