/*
 * Private header of ngx_http_llm_module: the types shared by its files.
 *
 *   ngx_http_llm_module.c     module definition, directives, shared zone
 *   ngx_http_llm_json.c       JSON tree (yajl) and the output writer
 *   ngx_http_llm_request.c    request validation -> canonical engine JSON
 *   ngx_http_llm_openai.c     OpenAI response bodies and SSE (pure)
 *   ngx_http_llm_handler.c    the API request life cycle
 *   ngx_http_llm_admission.c  global admission queue in the shared zone
 *   ngx_http_llm_health.c     engine health, probes, routing, /health
 *   ngx_http_llm_engine.c     per-worker doorbell connections to engines
 *   ngx_http_llm_metrics.c    Prometheus /metrics
 *   ngx_http_llm_admin.c      /admin/{status,drain,resume,promote}, models
 *   ngx_http_llm_auth.c       API keys
 *   ngx_http_llm_anthropic.c  Anthropic's Messages API
 */

#ifndef _NGX_HTTP_LLM_MODULE_H_INCLUDED_
#define _NGX_HTTP_LLM_MODULE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "llm_ipc_client.h"
#include "llm_request.h"


#define NGX_HTTP_LLM_MAX_ENGINES   32
#define NGX_HTTP_LLM_MAX_ROUTES    64
#define NGX_HTTP_LLM_REASON_LEN    256


/* API endpoints served by llm_api */
typedef enum {
    NGX_HTTP_LLM_API_CHAT = 0,
    NGX_HTTP_LLM_API_COMPLETIONS,
    NGX_HTTP_LLM_API_RESPONSES,
    NGX_HTTP_LLM_API_TOKENIZE,
    NGX_HTTP_LLM_API_DETOKENIZE,
    NGX_HTTP_LLM_API_MODELS,
    NGX_HTTP_LLM_API_HEALTH,
    NGX_HTTP_LLM_API_METRICS,
    NGX_HTTP_LLM_API_ADMIN,
    NGX_HTTP_LLM_API_NOT_FOUND,
    NGX_HTTP_LLM_API_MESSAGES,         /* Anthropic: converted to chat */
    NGX_HTTP_LLM_API_COUNT_TOKENS,     /* Anthropic: converted to tokenize */
    NGX_HTTP_LLM_API_ERROR,            /* error_page for nginx's own */
    NGX_HTTP_LLM_API_COUNT
} ngx_http_llm_api_e;

#define ngx_http_llm_api_generates(api)                                      \
    ((api) <= NGX_HTTP_LLM_API_DETOKENIZE                                     \
     || (api) == NGX_HTTP_LLM_API_MESSAGES                                    \
     || (api) == NGX_HTTP_LLM_API_COUNT_TOKENS)

extern ngx_str_t  ngx_http_llm_api_names[];


/* ---- configuration ----------------------------------------------------- */

typedef struct {
    ngx_str_t                  name;
    ngx_str_t                  run_dir;
    uint64_t                   fingerprint;  /* expected prompt fingerprint
                                                of probes; 0: any */
    ngx_uint_t                 index;
} ngx_http_llm_engine_conf_t;

typedef struct {
    ngx_str_t                  model;
    ngx_array_t               *names;        /* ngx_str_t, until resolved */
    uint64_t                   pool;         /* engine bit mask */
} ngx_http_llm_route_conf_t;

typedef struct ngx_http_llm_shctx_s  ngx_http_llm_shctx_t;

typedef struct {
    ngx_array_t                engines;      /* ngx_http_llm_engine_conf_t */
    ngx_array_t                routes;       /* ngx_http_llm_route_conf_t */

    ngx_shm_zone_t            *shm_zone;
    size_t                     zone_size;
    ngx_slab_pool_t           *shpool;
    ngx_http_llm_shctx_t      *sh;

    ngx_uint_t                 queue;
    ngx_msec_t                 queue_timeout;
    ngx_msec_t                 interval;
    ngx_msec_t                 heartbeat;
    ngx_msec_t                 stall;        /* longest step allowed */
    ngx_msec_t                 probe_timeout;
    ngx_uint_t                 fails;
    ngx_uint_t                 passes;
    time_t                     retry_after;
} ngx_http_llm_main_conf_t;

typedef struct {
    ngx_uint_t                 api;          /* ngx_http_llm_api_e */
    size_t                     max_body_size;
    ngx_msec_t                 read_timeout;
    ngx_str_t                  admin_token;
    ngx_flag_t                 test_script;
    ngx_array_t               *api_keys;     /* ngx_str_t */
    ngx_flag_t                 api_key_required;
} ngx_http_llm_loc_conf_t;

extern ngx_module_t  ngx_http_llm_module;


/* ---- shared zone ------------------------------------------------------- */

/* engine health states (ARCHITECTURE.md §3) */
typedef enum {
    NGX_HTTP_LLM_ABSENT = 0,
    NGX_HTTP_LLM_STARTING,
    NGX_HTTP_LLM_PROBING,
    NGX_HTTP_LLM_HEALTHY,
    NGX_HTTP_LLM_UNHEALTHY,
    NGX_HTTP_LLM_DRAINING,
    NGX_HTTP_LLM_STATES
} ngx_http_llm_state_e;

extern const char  *ngx_http_llm_state_names[];

typedef struct {
    u_char                     name[LLM_IPC_NAME_MAX];
    ngx_http_llm_state_e       state;
    ngx_uint_t                 drain;        /* admin drain (mode-leave) */
    u_char                     reason[NGX_HTTP_LLM_REASON_LEN];
    time_t                     since;        /* last transition */
    uint64_t                   epoch;        /* engine instance seen last */
    ngx_pid_t                  pid;          /* engine process */
    time_t                     started;      /* engine start, unix time */
    ngx_uint_t                 max_num_seqs;
    ngx_uint_t                 max_model_len;
    ngx_uint_t                 running;      /* admitted by nginx now */
    ngx_uint_t                 fails;        /* consecutive failures */
    ngx_uint_t                 passes;       /* consecutive good probes */
    ngx_pid_t                  prober;       /* worker with a probe out */
    uint64_t                   fingerprint;  /* prompt fingerprint, last
                                                good probe */
    u_char                     system_fingerprint[64];
    u_char                     engine_build[LLM_IPC_BUILD];
    ngx_uint_t                 nmodels;
    u_char                     models[LLM_IPC_MODELS_MAX]
                                     [LLM_IPC_MODEL_MAX];
    ngx_queue_t                running_q;    /* ngx_http_llm_ticket_t */
    ngx_atomic_t               entered[NGX_HTTP_LLM_STATES];
} ngx_http_llm_engine_sh_t;

typedef struct {
    u_char                     model[LLM_IPC_MODEL_MAX];
    size_t                     len;
    uint64_t                   pool;         /* engine bit mask */
    ngx_uint_t                 promoted;
} ngx_http_llm_route_sh_t;

/* A place in admission: waiting in sh->waiters, then running on engine. */
typedef struct {
    ngx_queue_t                link;
    ngx_pid_t                  pid;          /* owning worker */
    ngx_int_t                  route;        /* sh route, -1: by served name */
    uint64_t                   pool;         /* engines when route is -1 */
    ngx_int_t                  engine;       /* granted engine, -1 waiting */
    ngx_uint_t                 weight;       /* sequences it runs (n) */
    uint64_t                   enqueued;     /* ns, monotonic */
} ngx_http_llm_ticket_t;

#define NGX_HTTP_LLM_BUCKETS  16

typedef struct {
    ngx_atomic_t               bucket[NGX_HTTP_LLM_BUCKETS + 1];
    ngx_atomic_t               sum_us;
} ngx_http_llm_hist_t;

typedef enum {
    NGX_HTTP_LLM_H_QUEUE = 0,
    NGX_HTTP_LLM_H_TTFT,
    NGX_HTTP_LLM_H_ITL,
    NGX_HTTP_LLM_H_DURATION,
    NGX_HTTP_LLM_HISTS
} ngx_http_llm_hist_e;

typedef enum {
    NGX_HTTP_LLM_T_PROMPT = 0,
    NGX_HTTP_LLM_T_COMPLETION,
    NGX_HTTP_LLM_T_REASONING,
    NGX_HTTP_LLM_T_CACHED,
    NGX_HTTP_LLM_TOKEN_KINDS
} ngx_http_llm_token_e;

#define NGX_HTTP_LLM_STATUSES  14

typedef struct {
    ngx_atomic_t               requests[NGX_HTTP_LLM_API_COUNT]
                                       [NGX_HTTP_LLM_STATUSES];
    ngx_http_llm_hist_t        hist[NGX_HTTP_LLM_HISTS];
    ngx_atomic_t               tokens[NGX_HTTP_LLM_TOKEN_KINDS];
    ngx_atomic_t               probes_ok;
    ngx_atomic_t               probes_failed;
} ngx_http_llm_metrics_t;

struct ngx_http_llm_shctx_s {
    ngx_uint_t                 nengines;
    ngx_http_llm_engine_sh_t   engines[NGX_HTTP_LLM_MAX_ENGINES];
    ngx_uint_t                 nroutes;
    ngx_http_llm_route_sh_t    routes[NGX_HTTP_LLM_MAX_ROUTES];
    ngx_queue_t                waiters;      /* ngx_http_llm_ticket_t */
    ngx_uint_t                 waiting;
    ngx_pid_t                  leader;       /* worker driving health */
    uint64_t                   leader_seen;  /* ns, monotonic */
    ngx_http_llm_metrics_t     metrics;
};


/* ---- JSON (ngx_http_llm_json.c) ---------------------------------------- */

typedef enum {
    NGX_HTTP_LLM_JSON_NULL = 0,
    NGX_HTTP_LLM_JSON_FALSE,
    NGX_HTTP_LLM_JSON_TRUE,
    NGX_HTTP_LLM_JSON_NUMBER,
    NGX_HTTP_LLM_JSON_STRING,
    NGX_HTTP_LLM_JSON_ARRAY,
    NGX_HTTP_LLM_JSON_OBJECT
} ngx_http_llm_json_type_e;

typedef struct ngx_http_llm_json_s  ngx_http_llm_json_t;

struct ngx_http_llm_json_s {
    ngx_http_llm_json_type_e   type;
    ngx_str_t                  key;      /* member name inside an object */
    ngx_str_t                  value;    /* string bytes, or number text */
    ngx_uint_t                 count;    /* members of an array/object */
    ngx_http_llm_json_t       *child;    /* first member */
    ngx_http_llm_json_t       *last;     /* last member */
    ngx_http_llm_json_t       *next;     /* next sibling */
};

#define NGX_HTTP_LLM_JSON_MAX_DEPTH  128

/* NULL: err says why, for the client (empty: out of memory), param names
 * the field when a string in it is not text */
ngx_http_llm_json_t *ngx_http_llm_json_parse(ngx_pool_t *pool, u_char *data,
    size_t len, ngx_str_t *err, ngx_str_t *param);
/* member by key (the last one wins, as in Python); NULL if absent */
ngx_http_llm_json_t *ngx_http_llm_json_get(ngx_http_llm_json_t *obj,
    const char *key);
/* like _get, but a JSON null counts as absent */
ngx_http_llm_json_t *ngx_http_llm_json_member(ngx_http_llm_json_t *obj,
    const char *key);
/* NGX_OK; NGX_DECLINED not a number (int: or not integral); NGX_ABORT a
 * number out of the representable range */
ngx_int_t ngx_http_llm_json_int(ngx_http_llm_json_t *v, int64_t *out);
ngx_int_t ngx_http_llm_json_double(ngx_http_llm_json_t *v, double *out);
ngx_int_t ngx_http_llm_json_is_string(ngx_http_llm_json_t *v,
    const char *s);
const char *ngx_http_llm_json_type_name(ngx_http_llm_json_t *v);


/*
 * A growable output buffer in a pool.  Writers never fail individually:
 * an allocation failure sets "failed" and later writes are dropped, so a
 * caller checks once at the end.
 */
typedef struct {
    u_char       *start;
    u_char       *last;
    u_char       *end;
    ngx_pool_t   *pool;
    unsigned      failed:1;
} ngx_http_llm_wbuf_t;

void ngx_http_llm_wbuf_init(ngx_http_llm_wbuf_t *w, ngx_pool_t *pool);
u_char *ngx_http_llm_wbuf_reserve(ngx_http_llm_wbuf_t *w, size_t n);
void ngx_http_llm_put(ngx_http_llm_wbuf_t *w, const void *data, size_t len);
void ngx_http_llm_put_str(ngx_http_llm_wbuf_t *w, ngx_str_t *s);
void ngx_http_llm_put_string(ngx_http_llm_wbuf_t *w, u_char *data,
    size_t len);
void ngx_http_llm_put_json(ngx_http_llm_wbuf_t *w, ngx_http_llm_json_t *v);
void ngx_http_llm_printf(ngx_http_llm_wbuf_t *w, const char *fmt, ...);

#define ngx_http_llm_wbuf_len(w)   ((size_t) ((w)->last - (w)->start))

static ngx_inline void
ngx_http_llm_puts(ngx_http_llm_wbuf_t *w, const char *s)
{
    ngx_http_llm_put(w, s, ngx_strlen(s));
}


/* ---- requests (ngx_http_llm_request.c) --------------------------------- */

/*
 * A validated request.  "canonical" is the JSON handed to the engine; the
 * other fields are what nginx itself needs to answer.  When validation
 * fails, status and the error fields describe the client error.
 */
typedef struct {
    ngx_uint_t           api;            /* ngx_http_llm_api_e */
    ngx_str_t            id;             /* 32 hex digits, ours */
    ngx_str_t            model;
    ngx_str_t            canonical;
    ngx_str_t            echo;           /* responses: request fields that
                                            the response object repeats */
    unsigned             stream:1;
    unsigned             include_usage:1;
    unsigned             test_script:1;  /* forward "test_script" */
    unsigned             logprobs:1;     /* return log probabilities */
    unsigned             anthropic:1;    /* answer in Anthropic's shapes */
    ngx_uint_t           n;              /* choices (chat, completions) */
    ngx_array_t         *stops;          /* Anthropic: stop_sequences */

    ngx_uint_t           status;         /* error: HTTP status */
    ngx_str_t            err_message;
    ngx_str_t            err_param;      /* empty: null */
    ngx_str_t            err_code;       /* empty: null */
} ngx_http_llm_req_t;

ngx_int_t ngx_http_llm_request_parse(ngx_pool_t *pool,
    ngx_http_llm_req_t *req, u_char *body, size_t len);


/* ---- responses (ngx_http_llm_openai.c) --------------------------------- */

/* an alternative token of a logprob event */
typedef struct {
    ngx_str_t                   bytes;
    double                      logprob;
} ngx_http_llm_top_t;

/*
 * One engine event, decoded from the slot's ring (llm_ipc_event_next) and
 * held in nginx types; its type is the protocol's own.
 */
typedef struct {
    enum llm_ev_type            type;
    ngx_uint_t                  index;     /* tool call index; finish: 1 +
                                              the stop string that ended it */
    ngx_str_t                   text;      /* delta / error message */
    ngx_str_t                   id;        /* tool call id / error code */
    ngx_str_t                   name;      /* tool name / finish reason */
    uint64_t                    prompt;    /* usage */
    uint64_t                    completion;
    uint64_t                    reasoning;
    uint64_t                    cached;
    uint32_t                   *tokens;    /* tokens: ids */
    ngx_uint_t                  ntokens;
    double                      logprob;   /* logprob: text is the token */
    ngx_http_llm_top_t         *top;
    ngx_uint_t                  ntop;
} ngx_http_llm_event_t;

typedef enum {
    NGX_HTTP_LLM_ITEM_REASONING = 1,
    NGX_HTTP_LLM_ITEM_MESSAGE,
    NGX_HTTP_LLM_ITEM_TOOL
} ngx_http_llm_item_kind_e;

/* An output item being accumulated (reasoning, message, tool call). */
typedef struct {
    ngx_http_llm_item_kind_e   kind;
    ngx_uint_t                 index;      /* tool call index */
    ngx_str_t                  id;         /* tool call id */
    ngx_str_t                  name;
    ngx_http_llm_wbuf_t        text;       /* text or arguments */
    unsigned                   done:1;
} ngx_http_llm_item_t;

/*
 * Formatter state.  The formatter is pure: it turns a sequence of engine
 * events into bytes (SSE events, or one JSON body at the end) and does no
 * I/O, so the same event sequence always gives the same output.  With n
 * choices there is one per choice; choice 0's writes the body and the
 * stream's end.
 */
typedef struct ngx_http_llm_fmt_s {
    ngx_pool_t            *pool;
    ngx_http_llm_req_t    *req;
    ngx_str_t              fingerprint;
    time_t                 created;
    uint64_t               max_model_len;

    ngx_array_t            items;          /* ngx_http_llm_item_t */
    ngx_http_llm_item_t   *open;           /* item receiving deltas */
    ngx_uint_t             seq;            /* responses: sequence_number */
    ngx_str_t              finish;         /* finish reason */
    uint64_t               prompt;         /* usage */
    uint64_t               completion;
    uint64_t               reasoning;
    uint64_t               cached;
    ngx_http_llm_wbuf_t    tokens;         /* tokenize: uint32_t ids */
    ngx_http_llm_wbuf_t    lp;             /* logprob entries (chat), or
                                              "tokens" (completions) */
    ngx_http_llm_wbuf_t    lp_values;      /* completions: token_logprobs */
    ngx_http_llm_wbuf_t    lp_tops;        /* completions: top_logprobs */
    ngx_http_llm_wbuf_t    lp_offsets;     /* completions: text_offset */
    uint64_t               text_offset;    /* completions: characters */
    void                  *anthropic;      /* Anthropic formatter state */
    ngx_uint_t             choice;         /* the choice this one formats */
    struct ngx_http_llm_fmt_s *more;       /* on choice 0: choices 1..n-1 */
    ngx_uint_t             n_more;

    unsigned               started:1;
    unsigned               usage:1;
    unsigned               finished:1;
    unsigned               failed:1;
} ngx_http_llm_fmt_t;

/* A new item of this kind at the end of items (a tool call's: with ev's
 * index, id and name); NULL and f->failed when out of memory. */
ngx_http_llm_item_t *ngx_http_llm_item_push(ngx_http_llm_fmt_t *f,
    ngx_array_t *items, ngx_http_llm_item_kind_e kind,
    ngx_http_llm_event_t *ev);
ngx_int_t ngx_http_llm_fmt_init(ngx_http_llm_fmt_t *f, ngx_pool_t *pool,
    ngx_http_llm_req_t *req, ngx_str_t *fingerprint, time_t created);
/* n > 1: a formatter per further choice (f->more) */
ngx_int_t ngx_http_llm_fmt_choices(ngx_http_llm_fmt_t *f, ngx_uint_t n);
/* stream prologue: role chunk, response.created/in_progress */
void ngx_http_llm_fmt_begin(ngx_http_llm_fmt_t *f, ngx_http_llm_wbuf_t *out);
void ngx_http_llm_fmt_event(ngx_http_llm_fmt_t *f, ngx_http_llm_event_t *ev,
    ngx_http_llm_wbuf_t *out);
/* stream epilogue, or the whole body when not streaming */
void ngx_http_llm_fmt_end(ngx_http_llm_fmt_t *f, ngx_http_llm_wbuf_t *out);
/* an error after the response headers went out */
void ngx_http_llm_fmt_fail(ngx_http_llm_fmt_t *f, ngx_str_t *code,
    ngx_str_t *message, ngx_http_llm_wbuf_t *out);

/* {"error":{...}} */
void ngx_http_llm_error_body(ngx_http_llm_wbuf_t *w, ngx_uint_t status,
    ngx_str_t *message, ngx_str_t *param, ngx_str_t *code);


/* ---- handlers (ngx_http_llm_handler.c) -------------------------------- */

ngx_int_t ngx_http_llm_handler(ngx_http_request_t *r);
ngx_int_t ngx_http_llm_log_handler(ngx_http_request_t *r);
ngx_int_t ngx_http_llm_body_filter_init(ngx_conf_t *cf);
ngx_int_t ngx_http_llm_send_json(ngx_http_request_t *r, ngx_uint_t status,
    ngx_http_llm_wbuf_t *body);
ngx_int_t ngx_http_llm_send_model_not_found(ngx_http_request_t *r,
    ngx_str_t *model);
ngx_int_t ngx_http_llm_send_error(ngx_http_request_t *r, ngx_uint_t status,
    const char *message, ngx_str_t *param, const char *code);
ngx_int_t ngx_http_llm_send_error_str(ngx_http_request_t *r,
    ngx_uint_t status, ngx_str_t *message, ngx_str_t *param,
    ngx_str_t *code);
/* a wake-up: granted admissions of this worker's requests can start */
void ngx_http_llm_waiters_run(ngx_event_t *ev);


/* ---- engine links (ngx_http_llm_engine.c) ------------------------------ */

typedef struct ngx_http_llm_seq_s   ngx_http_llm_seq_t;
typedef struct ngx_http_llm_link_s  ngx_http_llm_link_t;

/* called when the slot may have events, or when the engine went away */
typedef void (*ngx_http_llm_seq_pt)(ngx_http_llm_seq_t *seq);

/* One sequence on an engine slot, owned by this worker. */
struct ngx_http_llm_seq_s {
    ngx_http_llm_link_t       *link;
    llm_ipc_handle             handle;
    ngx_http_llm_seq_pt        handler;
    void                      *data;
    unsigned                   active:1;     /* holds the slot */
    unsigned                   dead:1;       /* the engine went away */
};

/* This worker's connection to one engine. */
struct ngx_http_llm_link_s {
    ngx_http_llm_main_conf_t    *lmcf;
    ngx_http_llm_engine_conf_t  *conf;
    llm_ipc_client               client;
    ngx_connection_t            *conn;       /* doorbell socket */
    ngx_event_t                  retry;      /* reconnect timer */
    ngx_msec_t                   backoff;
    ngx_http_llm_seq_t         **owners;     /* by slot */
    uint32_t                     nslots;
    ngx_int_t                    err_rc;     /* last attach failure */
    u_char                       err[256];
    unsigned                     attached:1;
    unsigned                     failed:1;   /* segment says FAILED or
                                                STOPPED */
};

ngx_int_t ngx_http_llm_links_init(ngx_cycle_t *cycle,
    ngx_http_llm_main_conf_t *lmcf);
void ngx_http_llm_links_close(void);
ngx_http_llm_link_t *ngx_http_llm_link(ngx_uint_t engine);
ngx_int_t ngx_http_llm_seq_submit(ngx_http_llm_seq_t *seq,
    ngx_http_llm_link_t *link, enum llm_ipc_kind kind, ngx_str_t *request,
    ngx_str_t *why);
long ngx_http_llm_seq_read(ngx_http_llm_seq_t *seq, void *buf, size_t cap);

/* one worker-wide buffer for reading event records: readers drain it
   before they return to the event loop */
#define NGX_HTTP_LLM_EVBUF  65536
extern u_char  ngx_http_llm_evbuf[NGX_HTTP_LLM_EVBUF];
void ngx_http_llm_seq_release(ngx_http_llm_seq_t *seq);


/* ---- admission (ngx_http_llm_admission.c) ------------------------------ */

/*
 * ngx_http_llm_admit() returns NGX_OK (running on (*t)->engine), NGX_AGAIN
 * (queued: the worker is woken when granted), NGX_BUSY (queue full),
 * NGX_DECLINED (no engine of the pool can serve; why says so) or
 * NGX_ERROR (zone memory exhausted).
 */
ngx_int_t ngx_http_llm_admit(ngx_http_llm_main_conf_t *lmcf,
    ngx_int_t route, uint64_t pool, ngx_uint_t weight,
    ngx_http_llm_ticket_t **t, const char **why);
/* the queued ticket's engine now, or -1; removes it when still waiting
   and giving up */
ngx_int_t ngx_http_llm_admit_check(ngx_http_llm_main_conf_t *lmcf,
    ngx_http_llm_ticket_t *t, ngx_uint_t give_up);
void ngx_http_llm_admit_release(ngx_http_llm_main_conf_t *lmcf,
    ngx_http_llm_ticket_t *t);
/* capacity may have appeared: grant waiters, wake their workers */
void ngx_http_llm_admit_kick(ngx_http_llm_main_conf_t *lmcf);
/* drop tickets of workers that died (leader only) */
void ngx_http_llm_admit_reap(ngx_http_llm_main_conf_t *lmcf);
ngx_int_t ngx_http_llm_wake_init(ngx_cycle_t *cycle);
void ngx_http_llm_wake_close(void);


/* ---- routing and health (ngx_http_llm_health.c) ------------------------ */

/* the engines serving model: NGX_OK, or NGX_DECLINED for no such route */
ngx_int_t ngx_http_llm_route_find(ngx_http_llm_main_conf_t *lmcf,
    ngx_str_t *model, ngx_int_t *route, uint64_t *pool);
ngx_uint_t ngx_http_llm_admissible(ngx_http_llm_engine_sh_t *es);

void ngx_http_llm_engine_attached(ngx_http_llm_link_t *link);
void ngx_http_llm_engine_identity(ngx_http_llm_engine_sh_t *es,
    llm_ipc_header *h);
void ngx_http_llm_engine_down(ngx_http_llm_main_conf_t *lmcf,
    ngx_uint_t engine, const char *fmt, ...);
void ngx_http_llm_engine_state(ngx_http_llm_link_t *link, uint32_t state);
/* a request ended: NGX_OK served, NGX_ERROR engine-side failure */
void ngx_http_llm_engine_outcome(ngx_http_llm_main_conf_t *lmcf,
    ngx_uint_t engine, ngx_int_t rc, ngx_str_t *why);
ngx_int_t ngx_http_llm_health_init(ngx_cycle_t *cycle,
    ngx_http_llm_main_conf_t *lmcf);
void ngx_http_llm_health_exit(ngx_http_llm_main_conf_t *lmcf);

/* admin: NGX_OK, or NGX_DECLINED with why */
ngx_int_t ngx_http_llm_engine_drain(ngx_http_llm_main_conf_t *lmcf,
    ngx_uint_t engine, ngx_uint_t drain, const char **why);
ngx_int_t ngx_http_llm_route_promote(ngx_http_llm_main_conf_t *lmcf,
    ngx_str_t *model, ngx_uint_t engine, const char **why);
ngx_int_t ngx_http_llm_engine_find(ngx_http_llm_main_conf_t *lmcf,
    ngx_str_t *name);

/* engines and routes as JSON (/health, /admin/status, /v1/models);
   model: only that route (NULL: all) */
void ngx_http_llm_status_json(ngx_http_llm_main_conf_t *lmcf,
    ngx_http_llm_wbuf_t *w, ngx_str_t *model, ngx_uint_t *ready);
void ngx_http_llm_models_json(ngx_http_llm_main_conf_t *lmcf,
    ngx_http_llm_wbuf_t *w);

typedef struct ngx_http_llm_probe_s  ngx_http_llm_probe_t;

typedef void (*ngx_http_llm_probe_pt)(ngx_http_llm_probe_t *probe);

/* a one-token generation on one engine */
struct ngx_http_llm_probe_s {
    ngx_http_llm_main_conf_t  *lmcf;
    ngx_uint_t                 engine;
    ngx_http_llm_seq_t         seq;
    ngx_event_t                timer;
    ngx_http_llm_probe_pt      handler;     /* result */
    void                      *data;
    ngx_int_t                  rc;          /* NGX_OK passed */
    u_char                     reason[NGX_HTTP_LLM_REASON_LEN];
    uint64_t                   fingerprint;
    uint64_t                   completion;
    unsigned                   running:1;
};

ngx_int_t ngx_http_llm_probe_start(ngx_http_llm_probe_t *probe);
void ngx_http_llm_probe_abort(ngx_http_llm_probe_t *probe);


/* ---- API keys (ngx_http_llm_auth.c) ---------------------------------- */

char *ngx_http_llm_api_key(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
char *ngx_http_llm_api_key_file(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
/* NGX_DECLINED: allowed; else the 401 was sent and this is its rc */
ngx_int_t ngx_http_llm_auth(ngx_http_request_t *r);
ngx_uint_t ngx_http_llm_api_anthropic(ngx_uint_t api);


/* ---- Anthropic Messages API (ngx_http_llm_anthropic.c) ----------------- */

/* /v1/messages, /v1/messages/count_tokens: validate and convert the body
   to a chat (tokenize) request, then ngx_http_llm_request_parse() it */
ngx_int_t ngx_http_llm_anthropic_parse(ngx_pool_t *pool,
    ngx_http_llm_req_t *req, u_char *body, size_t len);
void ngx_http_llm_anthropic_error_body(ngx_http_llm_wbuf_t *w,
    ngx_uint_t status, ngx_str_t *message);
void ngx_http_llm_anthropic_begin(ngx_http_llm_fmt_t *f,
    ngx_http_llm_wbuf_t *out);
void ngx_http_llm_anthropic_event(ngx_http_llm_fmt_t *f,
    ngx_http_llm_event_t *ev, ngx_http_llm_wbuf_t *out);
void ngx_http_llm_anthropic_end(ngx_http_llm_fmt_t *f,
    ngx_http_llm_wbuf_t *out);
void ngx_http_llm_anthropic_fail(ngx_http_llm_fmt_t *f, ngx_str_t *code,
    ngx_str_t *message, ngx_http_llm_wbuf_t *out);


/* ---- metrics (ngx_http_llm_metrics.c) ---------------------------------- */

void ngx_http_llm_observe(ngx_http_llm_main_conf_t *lmcf,
    ngx_http_llm_hist_e hist, uint64_t ns);
void ngx_http_llm_count_request(ngx_http_llm_main_conf_t *lmcf,
    ngx_uint_t api, ngx_uint_t status);
void ngx_http_llm_count_tokens(ngx_http_llm_main_conf_t *lmcf,
    llm_ipc_usage *u);
ngx_int_t ngx_http_llm_metrics_handler(ngx_http_request_t *r);


/* ---- informational and admin endpoints (ngx_http_llm_admin.c) ---------- */

ngx_int_t ngx_http_llm_info_handler(ngx_http_request_t *r);


#endif /* _NGX_HTTP_LLM_MODULE_H_INCLUDED_ */
