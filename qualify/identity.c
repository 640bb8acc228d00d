/* What was qualified: the served model and its max_model_len (/v1/models),
 * the engine's version and build (/health, /admin/status), the system
 * fingerprint, and with --recipe the recipe's and the model config's
 * SHA-256.  Anything not found is null with a note, never guessed. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "command.h"
#include "json.h"
#include "qualify.h"
#include "recipe.h"

/* The first string member named by one of keys, in obj or its engines[]. */
static const char *find_key(yajl_val obj, const char *const *keys)
{
    for (int i = 0; keys[i]; i++) {
        const char *s = json_string(json_get(obj, keys[i]));
        if (s && *s) return s;
    }
    yajl_val engines = json_get(obj, "engines");
    for (size_t e = 0; YAJL_IS_ARRAY(engines) && e < engines->u.array.len; e++)
        for (int i = 0; keys[i]; i++) {
            const char *s = json_string(json_get(engines->u.array.values[e], keys[i]));
            if (s && *s) return s;
        }
    return NULL;
}

int route_engines(yajl_val status, const char *model, char names[][128], int max)
{
    int n = 0;
    yajl_val routes = json_get(status, "routes");
    for (size_t i = 0; YAJL_IS_ARRAY(routes) && i < routes->u.array.len; i++) {
        yajl_val r = routes->u.array.values[i];
        const char *m = json_string(json_get(r, "model"));
        yajl_val eng = json_get(r, "engines");
        if (!m || strcmp(m, model) || !YAJL_IS_ARRAY(eng)) continue;
        for (size_t j = 0; j < eng->u.array.len && n < max; j++) {
            const char *s = json_string(eng->u.array.values[j]);
            if (s) snprintf(names[n++], 128, "%s", s);
        }
        return n;
    }
    yajl_val engines = json_get(status, "engines");
    for (size_t i = 0; YAJL_IS_ARRAY(engines) && i < engines->u.array.len && n < max; i++) {
        yajl_val e = engines->u.array.values[i];
        yajl_val models = json_get(e, "models");
        const char *name = json_string(json_get(e, "name"));
        for (size_t j = 0; name && YAJL_IS_ARRAY(models) && j < models->u.array.len; j++) {
            const char *m = json_string(models->u.array.values[j]);
            if (m && !strcmp(m, model)) {
                snprintf(names[n++], 128, "%s", name);
                break;
            }
        }
    }
    return n;
}

static void recipe_identity(qctx *q, jw *w, jw *notes)
{
    char hex[65];
    long long bytes;
    jw_str(w, "recipe_path", q->recipe_path);
    if (!q->recipe_path) {
        jw_null(w, "recipe_sha256");
        jw_null(w, "model_config_sha256");
        jw_null(w, "model_config_path");
        jw_str(notes, NULL, "no --recipe: recipe and model config hashes are not recorded");
        return;
    }
    if (file_sha256(q->recipe_path, hex, &bytes) == 0) {
        jw_str(w, "recipe_sha256", hex);
        strbuf copy;
        sb_init(&copy);
        if (sb_read_file(&copy, q->recipe_path) == 0) q_keep(q, "recipe", ".yaml", copy.data, copy.len);
        sb_free(&copy);
    } else {
        jw_null(w, "recipe_sha256");
        strbuf s;
        sb_init(&s);
        sb_printf(&s, "cannot read recipe %s", q->recipe_path);
        jw_str(notes, NULL, s.data);
        sb_free(&s);
    }
    recipe r;
    strbuf errors;
    sb_init(&errors);
    int problems = recipe_load(&r, q->recipe_path, &errors);
    if (problems) {
        strbuf s;
        sb_init(&s);
        sb_printf(&s, "recipe %s is not valid: %s", q->recipe_path, errors.data ? errors.data : "");
        jw_str(notes, NULL, s.data);
        sb_free(&s);
    }
    if (r.model_path) {
        strbuf cfg;
        sb_init(&cfg);
        sb_printf(&cfg, "%s/config.json", r.model_path);
        jw_str(w, "model_config_path", cfg.data);
        if (file_sha256(cfg.data, hex, &bytes) == 0) {
            jw_str(w, "model_config_sha256", hex);
        } else {
            jw_null(w, "model_config_sha256");
            strbuf s;
            sb_init(&s);
            sb_printf(&s, "cannot read the model config %s", cfg.data);
            jw_str(notes, NULL, s.data);
            sb_free(&s);
        }
        sb_free(&cfg);
    } else {
        jw_null(w, "model_config_path");
        jw_null(w, "model_config_sha256");
    }
    if (!problems && q->max_model_len && r.max_model_len != q->max_model_len) {
        strbuf s;
        sb_init(&s);
        sb_printf(&s, "the recipe says max_model_len %d but /v1/models reports %ld", r.max_model_len,
                  q->max_model_len);
        jw_str(notes, NULL, s.data);
        sb_free(&s);
    }
    recipe_free(&r);
    sb_free(&errors);
}

void identity_collect(qctx *q)
{
    jw *w = &q->iw;
    strbuf notes_sb, why;
    sb_init(&notes_sb);
    sb_init(&why);
    jw notes;
    jw_init(&notes, &notes_sb);

    jw_str(w, "served_model", q->model);
    jw_str(w, "base_url", q->base_url);

    /* /v1/models: is the model served, and its max_model_len */
    yajl_val models = get_json(q, "models", "/v1/models", false, &why);
    yajl_val data = json_get(models, "data");
    jw_arr(w, "served_models");
    const char *config_hash = NULL;
    for (size_t i = 0; YAJL_IS_ARRAY(data) && i < data->u.array.len; i++) {
        yajl_val m = data->u.array.values[i];
        const char *id = json_string(json_get(m, "id"));
        if (!id) continue;
        jw_str(w, NULL, id);
        if (strcmp(id, q->model)) continue;
        q->model_served = true;
        long long len;
        if (json_int(json_get(m, "max_model_len"), &len) && len > 0) q->max_model_len = (long)len;
        config_hash = json_string(json_get(m, "config_sha256"));
    }
    jw_end(w);
    if (!models) {
        sb_printf(&q->identity_problem, "%s", why.data);
    } else if (!q->model_served) {
        sb_printf(&q->identity_problem, "model \"%s\" is not in /v1/models", q->model);
    } else if (!q->max_model_len) {
        sb_printf(&q->identity_problem, "/v1/models gives no max_model_len for \"%s\"", q->model);
    }
    if (q->max_model_len) jw_int(w, "max_model_len", q->max_model_len);
    else jw_null(w, "max_model_len");
    jw_str(w, "served_config_sha256", config_hash);

    /* engine version and build: /health, then /admin/status */
    static const char *const version_keys[] = { "engine_version", "version", NULL };
    static const char *const build_keys[] = { "engine_build", "build", NULL };
    static const char *const fp_keys[] = { "system_fingerprint", NULL };
    sb_reset(&why);
    yajl_val health = NULL;
    {
        http_resp r;   /* /health may answer 503 with a JSON body: keep it */
        http_resp_init(&r);
        q_http(q, "health", "GET", "/health", NULL, 0, false, NULL, NULL, &r);
        char err[128];
        if (r.status) health = json_parse(r.body.data ? r.body.data : "", r.body.len, err, sizeof err);
        http_resp_free(&r);
    }
    yajl_val admin = NULL;
    if (q->admin_token) admin = get_json(q, "admin-status", "/admin/status", true, &why);
    const char *version = NULL, *build = NULL, *fp = NULL, *source = NULL;
    yajl_val srcs[2] = { health, admin };
    const char *src_names[2] = { "/health", "/admin/status" };
    for (int i = 0; i < 2; i++) {
        if (!srcs[i]) continue;
        if (!version && (version = find_key(srcs[i], version_keys))) source = src_names[i];
        if (!build) build = find_key(srcs[i], build_keys);
        if (!fp) fp = find_key(srcs[i], fp_keys);
    }
    jw_str(w, "engine_version", version);
    jw_str(w, "engine_build", build);
    jw_str(w, "engine_identity_source", source);
    jw_str(w, "system_fingerprint", fp);
    if (!version)
        jw_str(&notes, NULL, "neither /health nor /admin/status reports an engine version");

    /* The engine binary on this host (what --engine-bin names), labelled
     * as such: it is what serves only if the operator deployed it. */
    strbuf out, err;
    sb_init(&out);
    sb_init(&err);
    char *argv[] = { (char *)q->engine_bin, "version", NULL };
    if (access(q->engine_bin, X_OK) == 0 && run_command(q, argv, &out, &err) == 0) {
        size_t len = strcspn(out.data ? out.data : "", "\n");
        jw_strn(w, "engine_bin_version", out.data ? out.data : "", len);
    } else {
        jw_null(w, "engine_bin_version");
    }
    jw_str(w, "engine_bin", q->engine_bin);
    sb_free(&out);
    sb_free(&err);

    recipe_identity(q, w, &notes);

    if (q->identity_problem.len) jw_str(&notes, NULL, q->identity_problem.data);
    strbuf list;
    sb_init(&list);
    sb_printf(&list, "[%s]", notes_sb.data ? notes_sb.data : "");
    jw_raw(w, "notes", list.data, list.len);
    sb_free(&list);
    yajl_tree_free(models);
    yajl_tree_free(health);
    yajl_tree_free(admin);
    sb_free(&notes_sb);
    sb_free(&why);
}
