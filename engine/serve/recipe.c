#include "recipe.h"

#include "ipc/llm_ipc.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "ipc/llm_ipc.h"
#include "sha256.h"
#include "version.h"

/* ---- schema ---------------------------------------------------------- */

enum ftype {
    F_STR,      /* plain string */
    F_PATH,     /* string, resolved against the recipe's directory */
    F_INT,
    F_FLOAT,
    F_BOOL,
    F_ENUM,     /* string from choices[], stored as its index (int) */
    F_ESTR,     /* string from choices[], stored as a string */
    F_SIZE,     /* bytes: integer or "16GiB", "512MiB", "1.5GB" */
    F_NAMES,    /* string or list of strings (served_model_name) */
    F_MAP,      /* nested mapping with its own fields */
    F_SPEC,     /* speculative_config: null or mapping */
};

struct field {
    const char         *key;
    enum ftype          type;
    size_t              off;
    double              min, max;      /* numeric range, inclusive */
    bool                min_open;      /* min itself excluded */
    const char *const  *choices;
    const struct field *sub;
};

#define OFF(m) offsetof(recipe, m)
#define END { NULL, 0, 0, 0, 0, false, NULL, NULL }

static const char *const backends[] = { "cpu", "cuda", NULL };
static const char *const kv_dtypes[] = { "auto", "bf16", "fp8", NULL };
static const char *const efforts[] = { "low", "high", "max", NULL };
static const char *const spec_methods[] = { "mtp", NULL };

static const struct field model_fields[] = {
    { "path", F_PATH, OFF(model_path), 0, 0, false, NULL, NULL },
    { "tokenizer", F_PATH, OFF(tokenizer_path), 0, 0, false, NULL, NULL },
    { "served_model_name", F_NAMES, 0, 0, 0, false, NULL, NULL },
    END
};

static const struct field spec_fields[] = {
    { "method", F_ESTR, OFF(speculative_method), 0, 0, false, spec_methods, NULL },
    { "num_speculative_tokens", F_INT, OFF(num_speculative_tokens), 1, 16, false, NULL, NULL },
    END
};

static const struct field gen_fields[] = {
    { "temperature", F_FLOAT, OFF(temperature), 0, 2, false, NULL, NULL },
    { "top_p", F_FLOAT, OFF(top_p), 0, 1, true, NULL, NULL },
    { "top_k", F_INT, OFF(top_k), -1, 1 << 20, false, NULL, NULL },
    { "min_p", F_FLOAT, OFF(min_p), 0, 1, false, NULL, NULL },
    { "max_tokens", F_INT, OFF(max_tokens), 1, INT_MAX, false, NULL, NULL },
    { "presence_penalty", F_FLOAT, OFF(presence_penalty), -2, 2, false, NULL, NULL },
    { "frequency_penalty", F_FLOAT, OFF(frequency_penalty), -2, 2, false, NULL, NULL },
    { "repetition_penalty", F_FLOAT, OFF(repetition_penalty), 0, 100, true, NULL, NULL },
    END
};

static const struct field chat_fields[] = {
    { "thinking", F_BOOL, OFF(thinking), 0, 0, false, NULL, NULL },
    { "reasoning_effort", F_ESTR, OFF(reasoning_effort), 0, 0, false, efforts, NULL },
    { "drop_thinking", F_BOOL, OFF(drop_thinking), 0, 0, false, NULL, NULL },
    END
};

static const struct field top_fields[] = {
    { "name", F_STR, OFF(name), 0, 0, false, NULL, NULL },
    { "run_dir", F_PATH, OFF(run_dir), 0, 0, false, NULL, NULL },
    { "backend", F_ENUM, OFF(backend), 0, 0, false, backends, NULL },
    { "model", F_MAP, 0, 0, 0, false, NULL, model_fields },
    { "tensor_parallel_size", F_INT, OFF(tensor_parallel_size), 1, 64, false, NULL, NULL },
    { "max_model_len", F_INT, OFF(max_model_len), 1, 1 << 24, false, NULL, NULL },
    { "max_num_seqs", F_INT, OFF(max_num_seqs), 1, 4096, false, NULL, NULL },
    { "max_num_batched_tokens", F_INT, OFF(max_num_batched_tokens), 1, 1 << 24, false, NULL, NULL },
    { "gpu_memory_utilization", F_FLOAT, OFF(gpu_memory_utilization), 0, 1, true, NULL, NULL },
    { "kv_cache_dtype", F_ENUM, OFF(kv_cache_dtype), 0, 0, false, kv_dtypes, NULL },
    { "kv_cache_memory_bytes", F_SIZE, OFF(kv_cache_memory_bytes), 0, 0, false, NULL, NULL },
    { "enable_prefix_caching", F_BOOL, OFF(enable_prefix_caching), 0, 0, false, NULL, NULL },
    { "kv_offloading_size", F_FLOAT, OFF(kv_offloading_size), 0, 1 << 20, false, NULL, NULL },
    { "kv_offloading_filesystem", F_BOOL, OFF(kv_offloading_filesystem), 0, 0, false, NULL, NULL },
    { "kv_offloading_path", F_PATH, OFF(kv_offloading_path), 0, 0, false, NULL, NULL },
    { "kv_offloading_filesystem_size", F_FLOAT, OFF(kv_offloading_filesystem_size), 0, 1 << 24,
      true, NULL, NULL },
    { "cpu_threads", F_INT, OFF(cpu_threads), 0, 1024, false, NULL, NULL },
    { "log_stats_interval", F_FLOAT, OFF(log_stats_interval), 0, 86400, false, NULL, NULL },
    { "gemm_mode", F_ENUM, OFF(modes.gemm), 0, 0, false, backend_gemm_names, NULL },
    { "moe_kernel", F_ENUM, OFF(modes.moe), 0, 0, false, backend_moe_names, NULL },
    { "attn_tokens", F_INT, OFF(modes.attn_tokens), 1, BACKEND_ATTN_TOKENS_MAX, false, NULL, NULL },
    { "speculative_config", F_SPEC, 0, 0, 0, false, NULL, spec_fields },
    { "override_generation_config", F_MAP, 0, 0, 0, false, NULL, gen_fields },
    { "default_chat_template_kwargs", F_MAP, 0, 0, 0, false, NULL, chat_fields },
    { "slots", F_INT, OFF(slots), 1, 65536, false, NULL, NULL },
    { "max_request_bytes", F_SIZE, OFF(max_request_bytes), 0, 0, false, NULL, NULL },
    END
};

/* ---- loader state ---------------------------------------------------- */

struct loader {
    recipe        *r;
    yaml_document_t doc;
    strbuf        *errors;
    int            nerr;
    char          *dir;         /* recipe directory, for relative paths */
    bool           seen_max_model_len, seen_model_path;
    struct { char key[256]; unsigned long line; } lines[64];
    int            nlines;
};

static unsigned long line_of(struct loader *L, const char *key)
{
    char k[256];
    snprintf(k, sizeof k, "%s", key);
    for (;;) {
        for (int i = 0; i < L->nlines; i++)
            if (!strcmp(L->lines[i].key, k)) return L->lines[i].line;
        char *dot = strrchr(k, '.');    /* model.path -> model */
        if (!dot) return 1;
        *dot = 0;
    }
}

/* n == NULL: a relation between keys; report at the key's own line. */
static void problem(struct loader *L, const yaml_node_t *n, const char *key,
                    const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void problem(struct loader *L, const yaml_node_t *n, const char *key,
                    const char *fmt, ...)
{
    va_list ap;
    sb_printf(L->errors, "%s:%lu: %s: ", L->r->path,
              n ? (unsigned long)n->start_mark.line + 1 : line_of(L, key), key);
    va_start(ap, fmt);
    sb_vprintf(L->errors, fmt, ap);
    va_end(ap);
    sb_putc(L->errors, '\n');
    L->nerr++;
}

static const char *scalar(const yaml_node_t *n)
{
    return n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

static bool is_null(const yaml_node_t *n)
{
    const char *s = scalar(n);
    if (!s || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return false;
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null")
           || !strcmp(s, "NULL");
}

static const char *describe(const yaml_node_t *n)
{
    if (n->type == YAML_MAPPING_NODE) return "a mapping";
    if (n->type == YAML_SEQUENCE_NODE) return "a list";
    return NULL;
}

/* Integer with optional '_' separators (YAML 1.1), full match. */
static bool parse_int(const char *s, long long *out)
{
    char buf[64];
    size_t j = 0;
    for (size_t i = 0; s[i]; i++) {
        if (s[i] == '_') continue;
        if (j + 1 >= sizeof buf) return false;
        buf[j++] = s[i];
    }
    buf[j] = 0;
    if (!j) return false;
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (*end || errno) return false;
    *out = v;
    return true;
}

static bool parse_float(const char *s, double *out)
{
    char *end;
    if (!*s) return false;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || errno || !isfinite(v)) return false;
    *out = v;
    return true;
}

static bool parse_bool(const char *s, bool *out)
{
    static const char *const yes[] = { "true", "True", "TRUE", "yes", "Yes", "on", "On", NULL };
    static const char *const no[] = { "false", "False", "FALSE", "no", "No", "off", "Off", NULL };
    for (int i = 0; yes[i]; i++) if (!strcmp(s, yes[i])) { *out = true; return true; }
    for (int i = 0; no[i]; i++) if (!strcmp(s, no[i])) { *out = false; return true; }
    return false;
}

/* "16GiB", "512 MiB", "2GB", "1073741824" -> bytes. */
static bool parse_size(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || v < 0 || !isfinite(v)) return false;
    while (*end == ' ') end++;
    static const struct { const char *u; double m; } units[] = {
        { "", 1 }, { "B", 1 },
        { "KiB", 1024.0 }, { "MiB", 1048576.0 }, { "GiB", 1073741824.0 },
        { "TiB", 1099511627776.0 },
        { "KB", 1e3 }, { "MB", 1e6 }, { "GB", 1e9 }, { "TB", 1e12 },
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (!strcmp(end, units[i].u)) {
            double b = v * units[i].m;
            if (b > 9.0e18 || b != floor(b)) return false;
            *out = (int64_t)b;
            return true;
        }
    }
    return false;
}

static char *resolve_path(struct loader *L, const char *p)
{
    if (p[0] == '/') return strdup(p);
    strbuf sb;
    sb_init(&sb);
    sb_printf(&sb, "%s/%s", L->dir, p);
    return sb_steal(&sb);
}

static void range_problem(struct loader *L, const yaml_node_t *n,
                          const char *key, const struct field *f)
{
    if (f->type == F_INT) {
        if (f->max >= INT_MAX)
            problem(L, n, key, "must be at least %.0f, got %s", f->min, scalar(n));
        else
            problem(L, n, key, "must be between %.0f and %.0f, got %s",
                    f->min, f->max, scalar(n));
    } else {
        problem(L, n, key, "must be in %c%g, %g], got %s",
                f->min_open ? '(' : '[', f->min, f->max, scalar(n));
    }
}

static void load_map(struct loader *L, yaml_node_t *map, const struct field *fields,
                     const char *prefix);


/* A served model name goes into the segment header: it must fit there. */
static void add_served(struct loader *L, yaml_node_t *n, const char *key, const char *s)
{
    if (strlen(s) >= LLM_IPC_MODEL_MAX) {
        problem(L, n, key, "'%.16s...' is longer than %d bytes", s, LLM_IPC_MODEL_MAX - 1);
        return;
    }
    L->r->served_model_name[L->r->n_served++] = strdup(s);
}

static void set_field(struct loader *L, const struct field *f, yaml_node_t *n,
                      const char *key)
{
    char *base = (char *)L->r;
    const char *s = scalar(n);
    const char *what = describe(n);

    if (f->type == F_MAP || f->type == F_SPEC) {
        if (f->type == F_SPEC && is_null(n)) return;
        if (n->type != YAML_MAPPING_NODE) {
            problem(L, n, key, "expected a mapping%s, got %s",
                    f->type == F_SPEC ? " or null" : "", what ? what : s);
            return;
        }
        load_map(L, n, f->sub, key);
        if (f->type == F_SPEC && !L->r->speculative_method)
            problem(L, n, key, "speculative_config needs a method (mtp) or null");
        return;
    }

    if (f->type == F_NAMES) {
        recipe *r = L->r;
        if (s && !is_null(n)) {
            add_served(L, n, key, s);
            return;
        }
        if (n->type != YAML_SEQUENCE_NODE || n->data.sequence.items.top
                == n->data.sequence.items.start) {
            problem(L, n, key, "expected a name or a non-empty list of names");
            return;
        }
        for (yaml_node_item_t *it = n->data.sequence.items.start;
             it < n->data.sequence.items.top; it++) {
            yaml_node_t *e = yaml_document_get_node(&L->doc, *it);
            const char *es = scalar(e);
            if (!es || !*es) { problem(L, e, key, "each name must be a non-empty string"); continue; }
            if (r->n_served == LLM_IPC_MODELS_MAX) {
                problem(L, e, key, "at most %d names", LLM_IPC_MODELS_MAX);
                break;
            }
            add_served(L, e, key, es);
        }
        return;
    }

    if (!s) {
        problem(L, n, key, "expected a scalar value, got %s", what);
        return;
    }

    switch (f->type) {
    case F_STR:
    case F_PATH: {
        if (is_null(n) || !*s) { problem(L, n, key, "must not be empty"); return; }
        char **dst = (char **)(base + f->off);
        free(*dst);
        *dst = f->type == F_PATH ? resolve_path(L, s) : strdup(s);
        return;
    }
    case F_INT: {
        long long v;
        if (!parse_int(s, &v)) { problem(L, n, key, "expected an integer, got '%s'", s); return; }
        if (v < f->min || v > f->max) { range_problem(L, n, key, f); return; }
        *(int *)(base + f->off) = (int)v;
        return;
    }
    case F_FLOAT: {
        double v;
        if (!parse_float(s, &v)) { problem(L, n, key, "expected a number, got '%s'", s); return; }
        if (v < f->min || v > f->max || (f->min_open && v == f->min)) {
            range_problem(L, n, key, f);
            return;
        }
        *(double *)(base + f->off) = v;
        return;
    }
    case F_BOOL: {
        bool v;
        if (!parse_bool(s, &v)) { problem(L, n, key, "expected true or false, got '%s'", s); return; }
        *(bool *)(base + f->off) = v;
        return;
    }
    case F_ENUM:
    case F_ESTR: {
        for (int i = 0; f->choices[i]; i++) {
            if (!strcmp(s, f->choices[i])) {
                if (f->type == F_ENUM) {
                    *(int *)(base + f->off) = i;
                } else {
                    char **dst = (char **)(base + f->off);
                    free(*dst);
                    *dst = strdup(s);
                }
                return;
            }
        }
        strbuf alt;
        sb_init(&alt);
        for (int i = 0; f->choices[i]; i++)
            sb_printf(&alt, "%s%s", i ? ", " : "", f->choices[i]);
        problem(L, n, key, "expected one of %s, got '%s'", alt.data, s);
        sb_free(&alt);
        return;
    }
    case F_SIZE: {
        int64_t v;
        if (!parse_size(s, &v)) {
            problem(L, n, key, "expected a size in bytes (e.g. 1073741824 or 16GiB), got '%s'", s);
            return;
        }
        *(int64_t *)(base + f->off) = v;
        return;
    }
    default:
        return;
    }
}

static void load_map(struct loader *L, yaml_node_t *map, const struct field *fields,
                     const char *prefix)
{
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start;
         p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(&L->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(&L->doc, p->value);
        const char *ks = scalar(k);
        char key[256];
        if (!ks) { problem(L, k, prefix ? prefix : "(top)", "keys must be strings"); continue; }
        snprintf(key, sizeof key, "%s%s%s", prefix ? prefix : "", prefix ? "." : "", ks);

        /* duplicate keys are a mistake YAML parsers silently accept */
        bool dup = false;
        for (yaml_node_pair_t *q = map->data.mapping.pairs.start; q < p; q++) {
            const char *qs = scalar(yaml_document_get_node(&L->doc, q->key));
            if (qs && !strcmp(qs, ks)) dup = true;
        }
        if (dup) { problem(L, k, key, "duplicate key"); continue; }

        const struct field *f = fields;
        while (f->key && strcmp(f->key, ks)) f++;
        if (!f->key) { problem(L, k, key, "unknown key"); continue; }
        if (L->nlines < 64) {
            snprintf(L->lines[L->nlines].key, sizeof L->lines[0].key, "%s", key);
            L->lines[L->nlines++].line = k->start_mark.line + 1;
        }
        if (!strcmp(key, "max_model_len")) L->seen_max_model_len = true;
        if (!strcmp(key, "model.path")) L->seen_model_path = true;
        set_field(L, f, v, key);
    }
}

static void set_defaults(recipe *r)
{
    r->backend = BACKEND_CUDA;
    r->tensor_parallel_size = 1;
    r->max_num_seqs = 1;
    r->max_num_batched_tokens = 8192;
    r->gpu_memory_utilization = 0.9;
    r->kv_cache_dtype = KV_DTYPE_AUTO;
    r->modes = (backend_modes)BACKEND_MODES_DEFAULT;
    r->enable_prefix_caching = true;
    r->kv_offloading_filesystem_size = 64;
    r->log_stats_interval = 10;
    r->temperature = 1.0;
    r->top_p = 1.0;
    r->top_k = -1;
    r->max_tokens = 4096;
    r->repetition_penalty = 1.0;
    r->thinking = false;
    r->drop_thinking = true;
    r->max_request_bytes = 16 << 20;
}

/* Relations between keys, checked once every key is read. */
static void check_relations(struct loader *L)
{
    recipe *r = L->r;
    if (!L->seen_model_path)
        problem(L, NULL, "model.path", "missing: the checkpoint directory is required");
    if (!L->seen_max_model_len)
        problem(L, NULL, "max_model_len", "missing: the context limit is required");
    if (r->speculative_method)
        problem(L, NULL, "speculative_config",
                "speculative decoding (%s) is not supported by this engine yet; use null",
                r->speculative_method);
    if (r->kv_offloading_filesystem && !r->kv_offloading_path)
        problem(L, NULL, "kv_offloading_path",
                "missing: kv_offloading_filesystem needs the directory it writes to");
    if (r->kv_offloading_filesystem && !(r->kv_offloading_size > 0))
        problem(L, NULL, "kv_offloading_filesystem",
                "needs the host tier it lies under: set kv_offloading_size (GiB) above 0");
    if (r->kv_offloading_filesystem && !r->enable_prefix_caching)
        problem(L, NULL, "kv_offloading_filesystem", "needs enable_prefix_caching");
    if (r->slots && r->slots < r->max_num_seqs)
        problem(L, NULL, "slots", "must be at least max_num_seqs (%d), got %d",
                r->max_num_seqs, r->slots);
    else if (r->slots && r->slots < r->max_num_seqs + LLM_IPC_PROBE_SEATS)
        problem(L, NULL, "slots",
                "must be at least max_num_seqs + %d (%d: a slot for health probes), got %d",
                LLM_IPC_PROBE_SEATS, r->max_num_seqs + LLM_IPC_PROBE_SEATS, r->slots);
    if (r->max_request_bytes && r->max_request_bytes < 4096)
        problem(L, NULL, "max_request_bytes", "must be at least 4096 bytes");
}

int recipe_load(recipe *r, const char *path, strbuf *errors)
{
    struct loader L;
    memset(r, 0, sizeof *r);
    memset(&L, 0, sizeof L);
    set_defaults(r);
    r->path = strdup(path);
    L.r = r;
    L.errors = errors;
    char *tmp = strdup(path);
    L.dir = strdup(dirname(tmp));
    free(tmp);

    FILE *f = fopen(path, "rb");
    if (!f) {
        sb_printf(errors, "%s: cannot open: %s\n", path, strerror(errno));
        free(L.dir);
        return 1;
    }
    yaml_parser_t parser;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_file(&parser, f);
    if (!yaml_parser_load(&parser, &L.doc)) {
        sb_printf(errors, "%s:%lu: YAML syntax error: %s%s%s\n", path,
                  (unsigned long)parser.problem_mark.line + 1,
                  parser.problem ? parser.problem : "unknown",
                  parser.context ? " " : "", parser.context ? parser.context : "");
        yaml_parser_delete(&parser);
        fclose(f);
        free(L.dir);
        return 1;
    }
    yaml_parser_delete(&parser);
    fclose(f);

    yaml_node_t *root = yaml_document_get_root_node(&L.doc);
    if (!root || root->type != YAML_MAPPING_NODE) {
        problem(&L, root, "(top)", "a recipe is a YAML mapping of keys to values");
    } else {
        load_map(&L, root, top_fields, NULL);
        check_relations(&L);
    }
    yaml_document_delete(&L.doc);

    if (!r->name) {
        /* default: the file name without .yaml */
        char *t = strdup(path);
        char *b = basename(t);
        char *dot = strrchr(b, '.');
        if (dot) *dot = 0;
        r->name = strdup(b);
        free(t);
    }
    if (!r->run_dir) r->run_dir = strdup("/run/llm");
    if (r->model_path && !r->tokenizer_path) {
        strbuf sb;
        sb_init(&sb);
        sb_printf(&sb, "%s/tokenizer.json", r->model_path);
        r->tokenizer_path = sb_steal(&sb);
    }
    if (r->model_path && !r->n_served) {
        char *t = strdup(r->model_path);
        r->served_model_name[r->n_served++] = strdup(basename(t));
        free(t);
    }
    if (!r->slots) r->slots = r->max_num_seqs + 64 > 256 ? r->max_num_seqs + 64 : 256;
    if (!r->reasoning_effort) r->reasoning_effort = strdup("high");
    if (!llm_ipc_valid_name(r->name, strlen(r->name)))
        problem(&L, NULL, "name", "'%s' must be " LLM_IPC_NAME_RULE, r->name);
    free(L.dir);
    return L.nerr;
}

void recipe_free(recipe *r)
{
    free(r->path);
    free(r->name);
    free(r->run_dir);
    free(r->kv_offloading_path);
    free(r->model_path);
    free(r->tokenizer_path);
    for (int i = 0; i < r->n_served; i++) free(r->served_model_name[i]);
    free(r->speculative_method);
    free(r->reasoning_effort);
    memset(r, 0, sizeof *r);
}

void recipe_fingerprint(const recipe *r, const backend_modes *modes, char *out, size_t len)
{
    sha256_ctx h;
    sha256_init(&h);
    const char *files[2] = { NULL, r->tokenizer_path };
    strbuf path, data;
    sb_init(&path);
    sb_init(&data);
    sb_printf(&path, "%s/config.json", r->model_path);
    files[0] = path.data;
    for (int i = 0; i < 2; i++) {
        sb_reset(&data);
        if (files[i] && sb_read_file(&data, files[i]) == 0) sha256_update(&h, data.data, data.len);
    }
    sb_reset(&data);
    sb_printf(&data, "dsv4-0731|%s|%d|%s|%s", LLM_ENGINE_VERSION, r->max_model_len,
              kv_cache_dtype_name(r->kv_cache_dtype), backend_name(r->backend));
    if (r->backend == BACKEND_CUDA) {
        char m[128];
        backend_modes_describe(modes, m, sizeof m);
        sb_printf(&data, "|%s", m);
    } else if (modes->gemm == BACKEND_GEMM_FP8) {   /* the one mode the CPU honours */
        sb_printf(&data, "|gemm_mode=fp8");
    }
    sha256_update(&h, data.data, data.len);
    uint8_t d[32];
    sha256_final(&h, d);
    snprintf(out, len, "fp_%02x%02x%02x%02x%02x", d[0], d[1], d[2], d[3], d[4]);
    sb_free(&path);
    sb_free(&data);
}

const char *backend_name(enum backend_kind b) { return backends[b]; }

const char *kv_cache_dtype_name(enum kv_cache_dtype d) { return kv_dtypes[d]; }

void recipe_chat_options(const recipe *r, chat_options *o)
{
    o->thinking = r->thinking;
    o->drop_thinking = r->drop_thinking;
    o->effort = CHAT_EFFORT_LOW;
    if (r->reasoning_effort) chat_effort_from_name(r->reasoning_effort, &o->effort);
}
