/* llm-qualify: the r33 qualification gates run against an OpenAI-style
 * endpoint (qualify/README.md).  This header holds the run context, the
 * gate record every gate fills, and the helpers gates share. */
#ifndef QUALIFY_H
#define QUALIFY_H

#include <stdbool.h>
#include <sys/types.h>
#include <yajl/yajl_tree.h>

#include "artifacts.h"
#include "http.h"
#include "jsonw.h"
#include "strbuf.h"

#define QUALIFY_VERSION "1"
#define QUALIFY_SCHEMA  "llm-qualify/status/1"

enum gate_id {
    G_COLD_START,
    G_CONTRACT,
    G_FUNCTIONAL,
    G_QUALITY,
    G_CAPACITY,
    G_KV,
    G_JANITOR,
    G_ROUTE,
    G_N
};

enum gate_status { ST_PASS, ST_FAIL, ST_SKIPPED, ST_NOT_MEANINGFUL };
const char *status_name(enum gate_status s);

/* What one gate found.  measurements/checks/caveats are JSON built with
 * jw while the gate runs; the report writer splices them in. */
typedef struct {
    const char *id, *title;
    bool   selected, required, ran;
    enum gate_status status;
    bool   skipped;
    strbuf skip_reason;
    strbuf summary;                  /* one line for the report table */
    strbuf meas;    jw mw;           /* members of "measurements" */
    strbuf checks;  jw cw;           /* elements of "checks" */
    strbuf caveats; jw vw;           /* elements of "caveats" (strings) */
    strbuf arts;    jw aw;           /* artifact paths of this gate */
    int    n_pass, n_fail, n_not_meaningful;
    strbuf first_failure;            /* "check: detail" of the first failure */
    double t0, duration_s, bound_s;
    bool   out_of_time;
} gate;

#define MAX_TARGETS 32

typedef struct {
    /* options */
    const char *base_url, *model, *out_dir, *recipe_path, *start_cmd;
    const char *contract_path, *write_contract_path, *admin_token, *engine_bin;
    const char *engine_name, *scratch_dir, *quality_effort;
    bool   model_is_random, keep_running, drain_check;
    double request_timeout_s, readmit_timeout_s;
    int    tool_calls, quality_k, quality_max_tokens, needle_tokens, capacity_max_tokens;
    int    capacity_retries;
    long   targets[MAX_TARGETS];
    double target_fracs[MAX_TARGETS];
    int    n_targets, n_fracs;

    /* identity, filled by identity_collect */
    long   max_model_len;           /* from /v1/models; 0 when unknown */
    bool   model_served;
    strbuf identity;   jw iw;       /* members of "identity" */
    strbuf identity_problem;        /* why the served model is unusable */

    /* runtime */
    http_client   *http;
    artifact_store art;
    gate           gates[G_N];
    gate          *g;               /* the running gate */
    double         deadline;        /* of the running gate (now_s clock) */
    pid_t          stack_pid;       /* managed stack's process group, 0 if none */
    bool           stack_exited;    /* its leader (the shell) exited ... */
    int            stack_status;    /* ... with this wait status */
    strbuf         stack_log;       /* its log file (absolute path) */
} qctx;

/* ---- gate record ----------------------------------------------------- */

void gate_init(gate *g, const char *id, const char *title, double bound_s);
void gate_free(gate *g);
void gate_begin(qctx *q, gate *g);
void gate_end(qctx *q, gate *g);
void gate_skip(gate *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* One named check with its outcome and a detail a person can act on. */
void gate_check(gate *g, enum gate_status st, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void gate_caveat(gate *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void gate_summary(gate *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Seconds left in the running gate's bound; when none are left, records
 * a failed "bound" check once and returns 0. */
double time_left(qctx *q);
/* Timeout for one request: the request timeout, cut to the time left. */
double req_timeout(qctx *q);

/* ---- HTTP with artifacts --------------------------------------------- */

/* A request whose exchange is kept as artifacts (request body and the
 * response with its status line and headers).  Same return as
 * http_request. */
int q_http(qctx *q, const char *label, const char *method, const char *path, const char *body,
           size_t body_len, bool auth, http_data_fn on_data, void *user, http_resp *r);
/* Keep some bytes as an artifact of the running gate. */
void q_keep(qctx *q, const char *label, const char *ext, const char *data, size_t n);

/* The error object of a non-2xx response: "status type/code: message". */
void describe_error(const http_resp *r, strbuf *out);

/* GET path and parse JSON; NULL with a reason in why. */
yajl_val get_json(qctx *q, const char *label, const char *path, bool auth, strbuf *why);

/* Wait until /health?model= answers 200 and a one-token chat request
 * succeeds, polling within bound_s.  Returns seconds taken, or -1 with
 * the last reason in why. */
double wait_ready(qctx *q, const char *label, double bound_s, strbuf *why);
/* One-token chat request: 0, or -1 with a reason. */
int one_token(qctx *q, const char *label, strbuf *why);

/* ---- identity and gates ---------------------------------------------- */

void identity_collect(qctx *q);
/* Engine names serving the model, from /admin/status (routes, then
 * engines' model lists); returns how many were stored. */
int route_engines(yajl_val status, const char *model, char names[][128], int max);

void gate_cold_start(qctx *q, gate *g);
void gate_contract(qctx *q, gate *g);
void gate_functional(qctx *q, gate *g);
void gate_quality(qctx *q, gate *g);
void gate_capacity(qctx *q, gate *g);
void gate_kv(qctx *q, gate *g);
void gate_janitor(qctx *q, gate *g);
void gate_route(qctx *q, gate *g);

/* Stop the managed stack (process group), if we started it. */
void stack_stop(qctx *q);
/* The managed start command exited unsuccessfully (a launcher that
 * exits 0 may have left the stack running). */
bool stack_failed(qctx *q);

/* ---- output ---------------------------------------------------------- */

/* Write OUT/qualification-status.json and OUT/report.md; 0 or -1. */
int report_write(qctx *q, double started_unix, double duration_s, strbuf *err);

#endif
