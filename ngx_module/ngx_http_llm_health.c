/*
 * Routing and engine health (ARCHITECTURE.md §3).
 *
 * Each engine's state lives in the shared zone:
 *
 *   absent -> starting -> probing -> healthy <-> unhealthy -> probing ...
 *   healthy <-> draining (admin drain / resume, or the engine's own drain)
 *
 * Any worker marks an engine unhealthy at once when it sees the doorbell
 * socket close, a FAILED or STOPPED state, a stale heartbeat (the process
 * is gone or stopped) or a stalled scheduler (the process lives but its
 * scheduler loop has not come round for llm_health stall=); failed
 * requests count too (llm_health fails=), client errors never do.
 * Promotion back to healthy is driven by one worker, the leader: every
 * worker runs a timer each llm_health interval, and the first to find the
 * leader slot empty, its pid dead or its lease older than three intervals
 * takes it (under the zone lock).  The leader reaps admission places of
 * dead workers, moves reachable engines to probing, and sends probes: a
 * real one-token generation (LLM_KIND_PROBE) that must finish with a
 * token and, when llm_engine fingerprint= is set, the expected prompt
 * fingerprint.  llm_health passes= probes in a row readmit the engine.
 * Every transition is logged with its reason and counted.
 */

#include "ngx_http_llm_module.h"


static void ngx_http_llm_health_tick(ngx_event_t *ev);
static void ngx_http_llm_probe_events(ngx_http_llm_seq_t *seq);
static void ngx_http_llm_probe_timeout(ngx_event_t *ev);
static void ngx_http_llm_probe_done(ngx_http_llm_probe_t *p);


static ngx_event_t            ngx_http_llm_tick;
static ngx_http_llm_probe_t   ngx_http_llm_probes[NGX_HTTP_LLM_MAX_ENGINES];
static ngx_uint_t             ngx_http_llm_probe_no;


/* a transition to log once the zone lock is released */
typedef struct {
    u_char                     text[NGX_HTTP_LLM_REASON_LEN + 128];
    size_t                     len;
    ngx_uint_t                 level;
    ngx_uint_t                 healthy;      /* capacity may have appeared */
} ngx_http_llm_note_t;


ngx_uint_t
ngx_http_llm_admissible(ngx_http_llm_engine_sh_t *es)
{
    return es->state == NGX_HTTP_LLM_HEALTHY && es->max_num_seqs > 0;
}


static void
ngx_http_llm_transition_locked(ngx_http_llm_main_conf_t *lmcf,
    ngx_uint_t i, ngx_http_llm_state_e state, ngx_http_llm_note_t *note,
    const char *fmt, va_list args)
{
    u_char                    *p;
    ngx_http_llm_state_e       old;
    ngx_http_llm_engine_sh_t  *es;

    es = &lmcf->sh->engines[i];
    old = es->state;

    p = ngx_vslprintf(es->reason, es->reason + NGX_HTTP_LLM_REASON_LEN - 1,
                      fmt, args);
    *p = '\0';

    if (old == state) {
        return;
    }

    es->state = state;
    es->since = ngx_time();
    ngx_atomic_fetch_add(&es->entered[state], 1);

    if (state != NGX_HTTP_LLM_PROBING) {
        es->passes = 0;
    }

    if (state == NGX_HTTP_LLM_HEALTHY) {
        es->fails = 0;
        note->healthy = 1;
    }

    note->level = (state == NGX_HTTP_LLM_UNHEALTHY) ? NGX_LOG_WARN
                                                   : NGX_LOG_NOTICE;
    note->len = ngx_snprintf(note->text, sizeof(note->text),
                             "llm engine \"%s\": %s -> %s: %s", es->name,
                             ngx_http_llm_state_names[old],
                             ngx_http_llm_state_names[state], es->reason)
                - note->text;
}


static void
ngx_http_llm_transition(ngx_http_llm_main_conf_t *lmcf, ngx_uint_t i,
    ngx_http_llm_state_e state, ngx_http_llm_note_t *note,
    const char *fmt, ...)
{
    va_list  args;

    va_start(args, fmt);
    ngx_http_llm_transition_locked(lmcf, i, state, note, fmt, args);
    va_end(args);
}


/* the zone locked for transitions: they are noted, and logged by
   ngx_http_llm_unlock_note once the lock is released */
static void
ngx_http_llm_lock_note(ngx_http_llm_main_conf_t *lmcf,
    ngx_http_llm_note_t *note)
{
    note->len = 0;
    note->healthy = 0;

    ngx_shmtx_lock(&lmcf->shpool->mutex);
}


static void
ngx_http_llm_unlock_note(ngx_http_llm_main_conf_t *lmcf,
    ngx_http_llm_note_t *note)
{
    ngx_shmtx_unlock(&lmcf->shpool->mutex);

    if (note->len) {
        ngx_log_error(note->level, ngx_cycle->log, 0, "%*s", note->len,
                      note->text);
    }

    if (note->healthy) {
        ngx_http_llm_admit_kick(lmcf);
    }
}


/*
 * The engine's identity from its header: the build is there from the start,
 * the system fingerprint once the model is loaded, so readmission copies
 * them again.  Called with the zone locked.
 */
void
ngx_http_llm_engine_identity(ngx_http_llm_engine_sh_t *es, llm_ipc_header *h)
{
    ngx_cpystrn(es->system_fingerprint, (u_char *) h->fingerprint,
                sizeof(es->system_fingerprint));
    ngx_cpystrn(es->engine_build, (u_char *) h->engine_build,
                sizeof(es->engine_build));
}


/* a worker attached the engine's segment: record what its header says */
void
ngx_http_llm_engine_attached(ngx_http_llm_link_t *link)
{
    uint64_t                   old;
    ngx_uint_t                 i, m;
    llm_ipc_header            *h;
    ngx_http_llm_note_t        note;
    ngx_http_llm_engine_sh_t  *es;
    ngx_http_llm_main_conf_t  *lmcf = link->lmcf;

    h = link->client.hdr;
    i = link->conf->index;

    ngx_http_llm_lock_note(lmcf, &note);

    es = &lmcf->sh->engines[i];
    old = es->epoch;

    es->epoch = h->epoch;
    es->pid = h->pid;
    es->started = h->start_unix_ns / 1000000000;
    es->max_num_seqs = h->max_num_seqs;
    es->max_model_len = h->max_model_len;
    ngx_http_llm_engine_identity(es, h);

    m = ngx_min(h->n_models, LLM_IPC_MODELS_MAX);

    for (es->nmodels = 0; es->nmodels < m; es->nmodels++) {
        ngx_cpystrn(es->models[es->nmodels], (u_char *) h->models[es->nmodels],
                    LLM_IPC_MODEL_MAX);
    }

    if (old && old != h->epoch
        && (es->state == NGX_HTTP_LLM_HEALTHY
            || es->state == NGX_HTTP_LLM_DRAINING
            || es->state == NGX_HTTP_LLM_PROBING))
    {
        ngx_http_llm_transition(lmcf, i, NGX_HTTP_LLM_UNHEALTHY, &note,
                                "the engine restarted (epoch %016xL, was "
                                "%016xL)", h->epoch, old);
    }

    ngx_http_llm_unlock_note(lmcf, &note);
}


void
ngx_http_llm_engine_down(ngx_http_llm_main_conf_t *lmcf, ngx_uint_t engine,
    const char *fmt, ...)
{
    va_list                    args;
    ngx_http_llm_note_t        note;
    ngx_http_llm_engine_sh_t  *es;

    ngx_http_llm_lock_note(lmcf, &note);

    es = &lmcf->sh->engines[engine];

    if (es->state != NGX_HTTP_LLM_UNHEALTHY
        && es->state != NGX_HTTP_LLM_ABSENT)
    {
        va_start(args, fmt);
        ngx_http_llm_transition_locked(lmcf, engine, NGX_HTTP_LLM_UNHEALTHY,
                                       &note, fmt, args);
        va_end(args);
    }

    ngx_http_llm_unlock_note(lmcf, &note);
}


/* the engine announced a lifecycle state on the doorbell */
void
ngx_http_llm_engine_state(ngx_http_llm_link_t *link, uint32_t state)
{
    ngx_uint_t                 i;
    ngx_http_llm_note_t        note;
    ngx_http_llm_main_conf_t  *lmcf = link->lmcf;

    i = link->conf->index;

    switch (state) {

    case LLM_STATE_FAILED:
        ngx_http_llm_engine_down(lmcf, i, "the engine failed: %s",
                                 link->client.hdr->state_msg);
        return;

    case LLM_STATE_STOPPED:
        ngx_http_llm_engine_down(lmcf, i, "the engine stopped");
        return;

    case LLM_STATE_DRAINING:
        ngx_http_llm_lock_note(lmcf, &note);

        if (lmcf->sh->engines[i].state == NGX_HTTP_LLM_HEALTHY) {
            ngx_http_llm_transition(lmcf, i, NGX_HTTP_LLM_DRAINING, &note,
                                    "%s", link->client.hdr->state_msg);
        }

        ngx_http_llm_unlock_note(lmcf, &note);
        return;

    default:
        return;
    }
}


/* a request ended: NGX_OK served, NGX_ERROR failed on the engine's side */
void
ngx_http_llm_engine_outcome(ngx_http_llm_main_conf_t *lmcf,
    ngx_uint_t engine, ngx_int_t rc, ngx_str_t *why)
{
    ngx_http_llm_note_t        note;
    ngx_http_llm_engine_sh_t  *es;

    ngx_http_llm_lock_note(lmcf, &note);

    es = &lmcf->sh->engines[engine];

    if (rc == NGX_OK) {
        es->fails = 0;

    } else if (++es->fails >= lmcf->fails
               && es->state == NGX_HTTP_LLM_HEALTHY)
    {
        ngx_http_llm_transition(lmcf, engine, NGX_HTTP_LLM_UNHEALTHY, &note,
                                "%ui requests in a row failed, the last: %V",
                                es->fails, why);
    }

    ngx_http_llm_unlock_note(lmcf, &note);
}


/* ---- the leader's view of one engine ----------------------------------- */

static void
ngx_http_llm_health_engine(ngx_http_llm_main_conf_t *lmcf, ngx_uint_t i)
{
    int64_t                    age, stalled;
    uint32_t                   st;
    ngx_uint_t                 probe;
    ngx_http_llm_link_t       *link;
    ngx_http_llm_note_t        note;
    ngx_http_llm_probe_t      *p;
    ngx_http_llm_engine_sh_t  *es;

    link = ngx_http_llm_link(i);
    probe = 0;

    ngx_http_llm_lock_note(lmcf, &note);

    es = &lmcf->sh->engines[i];

    if (es->prober && es->prober != ngx_pid && kill(es->prober, 0) == -1
        && ngx_errno == NGX_ESRCH)
    {
        es->prober = 0;
    }

    if (!link->attached || link->conn == NULL) {

        if (es->state == NGX_HTTP_LLM_ABSENT
            && link->err_rc == LLM_IPC_ENOTREADY)
        {
            ngx_http_llm_transition(lmcf, i, NGX_HTTP_LLM_STARTING, &note,
                                    "%s", link->err);

        } else if (es->state == NGX_HTTP_LLM_ABSENT && !link->failed) {
            ngx_http_llm_transition(lmcf, i, es->state, &note,
                                    "not reachable: %s", link->err);

        } else if (es->state != NGX_HTTP_LLM_UNHEALTHY) {
            /* an unhealthy engine keeps the reason it went down for */
            ngx_http_llm_transition(lmcf, i, NGX_HTTP_LLM_UNHEALTHY, &note,
                                    "not reachable: %s", link->err);
        }

        goto done;
    }

    st = llm_ipc_engine_state(&link->client);
    age = llm_ipc_heartbeat_age_ms(&link->client);
    stalled = llm_ipc_progress_age_ms(&link->client);

    switch (st) {

    case LLM_STATE_STARTING:
    case LLM_STATE_LOADING:
        if (es->state == NGX_HTTP_LLM_ABSENT
            || es->state == NGX_HTTP_LLM_STARTING)
        {
            ngx_http_llm_transition(lmcf, i, NGX_HTTP_LLM_STARTING, &note,
                                    "the engine is loading");
        }

        break;

    case LLM_STATE_READY:
        if (age > (int64_t) lmcf->heartbeat
            || stalled > (int64_t) lmcf->stall)
        {
            break;
        }

        if (es->state == NGX_HTTP_LLM_ABSENT
            || es->state == NGX_HTTP_LLM_STARTING
            || es->state == NGX_HTTP_LLM_UNHEALTHY)
        {
            ngx_http_llm_transition(lmcf, i, NGX_HTTP_LLM_PROBING, &note,
                                    "the engine is ready: probing");
        }

        if (es->state == NGX_HTTP_LLM_PROBING && es->prober == 0) {
            es->prober = ngx_pid;
            probe = 1;
        }

        break;

    case LLM_STATE_DRAINING:
        if (es->state == NGX_HTTP_LLM_HEALTHY) {
            ngx_http_llm_transition(lmcf, i, NGX_HTTP_LLM_DRAINING, &note,
                                    "%s", link->client.hdr->state_msg);
        }

        break;

    default: /* FAILED, STOPPED: the doorbell said so already */
        break;
    }

done:

    ngx_http_llm_unlock_note(lmcf, &note);

    if (!probe) {
        return;
    }

    p = &ngx_http_llm_probes[i];

    if (p->running) {
        return;
    }

    p->lmcf = lmcf;
    p->engine = i;
    p->handler = ngx_http_llm_probe_done;

    if (ngx_http_llm_probe_start(p) != NGX_OK) {
        ngx_http_llm_probe_done(p);
    }
}


static ngx_uint_t
ngx_http_llm_lead(ngx_http_llm_main_conf_t *lmcf, ngx_uint_t resign)
{
    uint64_t               now;
    ngx_uint_t             leader;
    ngx_http_llm_shctx_t  *sh = lmcf->sh;

    now = llm_ipc_now_ns();
    leader = 0;

    ngx_shmtx_lock(&lmcf->shpool->mutex);

    if (resign) {
        if (sh->leader == ngx_pid) {
            sh->leader = 0;
        }

    } else if (sh->leader == ngx_pid || sh->leader == 0
               || now - sh->leader_seen > 3 * lmcf->interval * 1000000
               || (kill(sh->leader, 0) == -1 && ngx_errno == NGX_ESRCH))
    {
        sh->leader = ngx_pid;
        sh->leader_seen = now;
        leader = 1;
    }

    ngx_shmtx_unlock(&lmcf->shpool->mutex);

    return leader;
}


static void
ngx_http_llm_health_tick(ngx_event_t *ev)
{
    int64_t                    age;
    ngx_uint_t                 i;
    ngx_http_llm_link_t       *link;
    ngx_http_llm_main_conf_t  *lmcf = ev->data;

    if (ngx_exiting || ngx_quit || ngx_terminate) {
        ngx_http_llm_lead(lmcf, 1);
        return;
    }

    /* every worker watches the heartbeats and the scheduler progress of
       the engines it has mapped */
    for (i = 0; i < lmcf->engines.nelts; i++) {
        link = ngx_http_llm_link(i);

        if (!link->attached || link->conn == NULL
            || (llm_ipc_engine_state(&link->client) != LLM_STATE_READY
                && llm_ipc_engine_state(&link->client) != LLM_STATE_DRAINING))
        {
            continue;
        }

        age = llm_ipc_heartbeat_age_ms(&link->client);

        if (age > (int64_t) lmcf->heartbeat) {
            ngx_http_llm_engine_down(lmcf, i, "heartbeat stale: no sign of "
                                     "life for %L ms", age);
            continue;
        }

        age = llm_ipc_progress_age_ms(&link->client);

        if (age > (int64_t) lmcf->stall) {
            ngx_http_llm_engine_down(lmcf, i, "the scheduler made no progress "
                                     "for %L ms (the process lives; a step "
                                     "is stuck)", age);
        }
    }

    /* capacity another client of an engine freed: grant waiting places */
    if (lmcf->sh->waiting) {
        ngx_http_llm_admit_kick(lmcf);
    }

    if (ngx_http_llm_lead(lmcf, 0)) {
        ngx_http_llm_admit_reap(lmcf);

        for (i = 0; i < lmcf->engines.nelts; i++) {
            ngx_http_llm_health_engine(lmcf, i);
        }
    }

    ngx_add_timer(ev, lmcf->interval);
}


ngx_int_t
ngx_http_llm_health_init(ngx_cycle_t *cycle, ngx_http_llm_main_conf_t *lmcf)
{
    ngx_http_llm_tick.handler = ngx_http_llm_health_tick;
    ngx_http_llm_tick.data = lmcf;
    ngx_http_llm_tick.log = cycle->log;
    ngx_http_llm_tick.cancelable = 1;

    /* the first tick soon, so a fresh nginx finds its engines at once */
    ngx_add_timer(&ngx_http_llm_tick, ngx_min(lmcf->interval, 100));

    return NGX_OK;
}


void
ngx_http_llm_health_exit(ngx_http_llm_main_conf_t *lmcf)
{
    ngx_uint_t  i;

    for (i = 0; i < NGX_HTTP_LLM_MAX_ENGINES; i++) {
        ngx_http_llm_probe_abort(&ngx_http_llm_probes[i]);
    }

    ngx_http_llm_lead(lmcf, 1);
}


/* ---- probes ------------------------------------------------------------ */

static void
ngx_http_llm_probe_fail(ngx_http_llm_probe_t *p, const char *fmt, ...)
{
    u_char   *last;
    va_list   args;

    p->rc = NGX_ERROR;

    va_start(args, fmt);
    last = ngx_vslprintf(p->reason, p->reason + NGX_HTTP_LLM_REASON_LEN - 1,
                         fmt, args);
    va_end(args);

    *last = '\0';
}


ngx_int_t
ngx_http_llm_probe_start(ngx_http_llm_probe_t *p)
{
    u_char                     buf[512], *last;
    ngx_str_t                  req, why, *name;
    ngx_http_llm_engine_conf_t *ec;

    ec = &((ngx_http_llm_engine_conf_t *) p->lmcf->engines.elts)[p->engine];
    name = &ec->name;

    p->rc = NGX_OK;
    p->reason[0] = '\0';
    p->fingerprint = 0;
    p->completion = 0;

    last = ngx_snprintf(buf, sizeof(buf),
                        "{\"kind\":\"probe\",\"id\":\"probe-%P-%ui\","
                        "\"model\":\"%V\",\"messages\":[{\"role\":\"user\","
                        "\"content\":\"Reply with OK.\"}],\"max_tokens\":1,"
                        "\"temperature\":0}",
                        ngx_pid, ngx_http_llm_probe_no++, name);

    req.data = buf;
    req.len = last - buf;

    ngx_memzero(&p->seq, sizeof(ngx_http_llm_seq_t));
    p->seq.handler = ngx_http_llm_probe_events;
    p->seq.data = p;

    if (ngx_http_llm_seq_submit(&p->seq, ngx_http_llm_link(p->engine),
                                LLM_KIND_PROBE, &req, &why)
        != NGX_OK)
    {
        ngx_http_llm_probe_fail(p, "cannot submit: %V", &why);
        return NGX_ERROR;
    }

    p->running = 1;

    p->timer.handler = ngx_http_llm_probe_timeout;
    p->timer.data = p;
    p->timer.log = ngx_cycle->log;
    p->timer.cancelable = 1;

    ngx_add_timer(&p->timer, p->lmcf->probe_timeout);

    return NGX_OK;
}


void
ngx_http_llm_probe_abort(ngx_http_llm_probe_t *p)
{
    if (!p->running) {
        return;
    }

    p->running = 0;

    if (p->timer.timer_set) {
        ngx_del_timer(&p->timer);
    }

    ngx_http_llm_seq_release(&p->seq);
}


static void
ngx_http_llm_probe_end(ngx_http_llm_probe_t *p)
{
    uint64_t                     want;
    ngx_http_llm_engine_conf_t  *ec;

    ngx_http_llm_probe_abort(p);

    ec = &((ngx_http_llm_engine_conf_t *) p->lmcf->engines.elts)[p->engine];
    want = ec->fingerprint;

    if (p->rc == NGX_OK && want && p->fingerprint != want) {
        ngx_http_llm_probe_fail(p, "prompt fingerprint %016xL, expected "
                                "%016xL", p->fingerprint, want);
    }

    if (p->rc == NGX_OK) {
        ngx_atomic_fetch_add(&p->lmcf->sh->metrics.probes_ok, 1);

    } else {
        ngx_atomic_fetch_add(&p->lmcf->sh->metrics.probes_failed, 1);
    }

    p->handler(p);
}


static void
ngx_http_llm_probe_events(ngx_http_llm_seq_t *seq)
{
    long                   n;
    size_t                 off;
    llm_ipc_event          ev;
    ngx_http_llm_probe_t  *p = seq->data;

    for ( ;; ) {
        n = ngx_http_llm_seq_read(seq, ngx_http_llm_evbuf,
                                  NGX_HTTP_LLM_EVBUF);
        if (n < 0) {
            ngx_http_llm_probe_fail(p, "reading events: %s",
                                    llm_ipc_strerror((int) n));
            ngx_http_llm_probe_end(p);
            return;
        }

        if (n == 0) {
            break;
        }

        off = 0;

        while (llm_ipc_event_next(ngx_http_llm_evbuf, n, &off, &ev) == 1) {

            switch (ev.type) {

            case LLM_EV_PROMPT_INFO:
                p->fingerprint = ev.fingerprint;
                break;

            case LLM_EV_USAGE:
                p->completion = ev.usage.completion_tokens;
                break;

            case LLM_EV_ERROR:
                ngx_http_llm_probe_fail(p, "engine error %uD %*s: %*s",
                                        ev.status, ev.code_len, ev.code,
                                        ev.text_len, ev.text);
                break;

            case LLM_EV_FINISH:
                if (p->rc == NGX_OK && ev.reason != LLM_FINISH_STOP
                    && ev.reason != LLM_FINISH_LENGTH)
                {
                    ngx_http_llm_probe_fail(p, "finished with \"%s\"",
                                            llm_ipc_finish_name(ev.reason));

                } else if (p->rc == NGX_OK && p->completion == 0) {
                    ngx_http_llm_probe_fail(p, "no token was generated");
                }

                ngx_http_llm_probe_end(p);
                return;

            default:
                break;
            }
        }
    }

    if (seq->dead) {
        ngx_http_llm_probe_fail(p, "the engine went away during the probe");
        ngx_http_llm_probe_end(p);
    }
}


static void
ngx_http_llm_probe_timeout(ngx_event_t *ev)
{
    ngx_http_llm_probe_t  *p = ev->data;

    ngx_http_llm_probe_fail(p, "no answer within %M ms",
                            p->lmcf->probe_timeout);
    ngx_http_llm_probe_end(p);
}


/* the leader's readmission probe came back */
static void
ngx_http_llm_probe_done(ngx_http_llm_probe_t *p)
{
    ngx_http_llm_note_t          note;
    ngx_http_llm_engine_sh_t    *es;
    ngx_http_llm_main_conf_t    *lmcf = p->lmcf;
    ngx_http_llm_engine_conf_t  *ec;

    ec = &((ngx_http_llm_engine_conf_t *) lmcf->engines.elts)[p->engine];

    ngx_http_llm_lock_note(lmcf, &note);

    es = &lmcf->sh->engines[p->engine];

    if (es->prober == ngx_pid) {
        es->prober = 0;
    }

    if (es->state == NGX_HTTP_LLM_PROBING) {

        if (p->rc != NGX_OK) {
            es->passes = 0;
            ngx_http_llm_transition(lmcf, p->engine, NGX_HTTP_LLM_PROBING,
                                    &note, "probe failed: %s", p->reason);

        } else if (++es->passes >= lmcf->passes) {
            es->fingerprint = p->fingerprint;
            if (p->seq.link && p->seq.link->client.hdr) {
                ngx_http_llm_engine_identity(es, p->seq.link->client.hdr);
            }
            ngx_http_llm_transition(lmcf, p->engine,
                                    es->drain ? NGX_HTTP_LLM_DRAINING
                                              : NGX_HTTP_LLM_HEALTHY,
                                    &note, "%ui probes in a row passed%s",
                                    es->passes,
                                    es->drain ? " (drained by admin)" : "");

        } else {
            es->fingerprint = p->fingerprint;
            ngx_http_llm_transition(lmcf, p->engine, NGX_HTTP_LLM_PROBING,
                                    &note, "probe %ui of %ui passed",
                                    es->passes, lmcf->passes);
        }
    }

    /* a failed probe leaves the engine probing: nothing is noted */
    ngx_http_llm_unlock_note(lmcf, &note);

    if (p->rc != NGX_OK) {
        ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                      "llm engine \"%V\": probe failed: %s", &ec->name,
                      p->reason);
    }
}


/* ---- routes ------------------------------------------------------------ */

static ngx_int_t
ngx_http_llm_served(ngx_http_llm_engine_sh_t *es, u_char *model, size_t len)
{
    ngx_uint_t  i;

    for (i = 0; i < es->nmodels; i++) {
        if (ngx_strlen(es->models[i]) == len
            && ngx_strncmp(es->models[i], model, len) == 0)
        {
            return 1;
        }
    }

    return 0;
}


static ngx_int_t
ngx_http_llm_route_index(ngx_http_llm_shctx_t *sh, u_char *model,
    size_t len)
{
    ngx_uint_t  i;

    for (i = 0; i < sh->nroutes; i++) {
        if (sh->routes[i].len == len
            && ngx_strncmp(sh->routes[i].model, model, len) == 0)
        {
            return i;
        }
    }

    return -1;
}


/* the engines whose headers list model as a served name */
static uint64_t
ngx_http_llm_served_pool(ngx_http_llm_shctx_t *sh, u_char *model, size_t len)
{
    uint64_t    pool;
    ngx_uint_t  i;

    pool = 0;

    for (i = 0; i < sh->nengines; i++) {
        if (ngx_http_llm_served(&sh->engines[i], model, len)) {
            pool |= (uint64_t) 1 << i;
        }
    }

    return pool;
}


/*
 * A route named in llm_route (or created by promote) wins; otherwise the
 * model routes to every engine whose header lists it as a served name.
 */
ngx_int_t
ngx_http_llm_route_find(ngx_http_llm_main_conf_t *lmcf, ngx_str_t *model,
    ngx_int_t *route, uint64_t *pool)
{
    ngx_http_llm_shctx_t  *sh = lmcf->sh;

    *pool = 0;

    if (sh == NULL) {
        *route = -1;
        return NGX_DECLINED;
    }

    ngx_shmtx_lock(&lmcf->shpool->mutex);

    *route = ngx_http_llm_route_index(sh, model->data, model->len);

    if (*route >= 0) {
        *pool = sh->routes[*route].pool;

    } else {
        *pool = ngx_http_llm_served_pool(sh, model->data, model->len);
    }

    ngx_shmtx_unlock(&lmcf->shpool->mutex);

    return *pool ? NGX_OK : NGX_DECLINED;
}


static ngx_uint_t
ngx_http_llm_pool_ready(ngx_http_llm_shctx_t *sh, uint64_t pool)
{
    ngx_uint_t  i;

    for (i = 0; i < sh->nengines; i++) {
        if ((pool & ((uint64_t) 1 << i))
            && ngx_http_llm_admissible(&sh->engines[i]))
        {
            return 1;
        }
    }

    return 0;
}


ngx_int_t
ngx_http_llm_engine_find(ngx_http_llm_main_conf_t *lmcf, ngx_str_t *name)
{
    ngx_uint_t                   i;
    ngx_http_llm_engine_conf_t  *ec;

    ec = lmcf->engines.elts;

    for (i = 0; i < lmcf->engines.nelts; i++) {
        if (ec[i].name.len == name->len
            && ngx_strncmp(ec[i].name.data, name->data, name->len) == 0)
        {
            return i;
        }
    }

    return -1;
}


ngx_int_t
ngx_http_llm_engine_drain(ngx_http_llm_main_conf_t *lmcf, ngx_uint_t engine,
    ngx_uint_t drain, const char **why)
{
    ngx_uint_t                 own;
    ngx_http_llm_link_t       *link;
    ngx_http_llm_note_t        note;
    ngx_http_llm_engine_sh_t  *es;

    ngx_http_llm_lock_note(lmcf, &note);

    es = &lmcf->sh->engines[engine];
    es->drain = drain;

    /* an engine draining on its own stays draining */
    link = ngx_http_llm_link(engine);
    own = link->attached
          && llm_ipc_engine_state(&link->client) == LLM_STATE_DRAINING;

    if (drain && es->state == NGX_HTTP_LLM_HEALTHY) {
        ngx_http_llm_transition(lmcf, engine, NGX_HTTP_LLM_DRAINING, &note,
                                "drained by admin: running requests finish, "
                                "new ones are not admitted");

    } else if (!drain && es->state == NGX_HTTP_LLM_DRAINING && !own) {
        ngx_http_llm_transition(lmcf, engine, NGX_HTTP_LLM_HEALTHY, &note,
                                "resumed by admin");
    }

    ngx_http_llm_unlock_note(lmcf, &note);

    *why = NULL;

    return NGX_OK;
}


/* switch the route to one engine, atomically, if it is healthy */
ngx_int_t
ngx_http_llm_route_promote(ngx_http_llm_main_conf_t *lmcf, ngx_str_t *model,
    ngx_uint_t engine, const char **why)
{
    ngx_int_t                 r;
    ngx_http_llm_shctx_t     *sh = lmcf->sh;
    ngx_http_llm_route_sh_t  *rs;

    if (model->len == 0 || model->len >= LLM_IPC_MODEL_MAX) {
        *why = "the route name is empty or too long";
        return NGX_DECLINED;
    }

    ngx_shmtx_lock(&lmcf->shpool->mutex);

    if (!ngx_http_llm_admissible(&sh->engines[engine])) {
        ngx_shmtx_unlock(&lmcf->shpool->mutex);
        *why = "the engine is not healthy";
        return NGX_DECLINED;
    }

    r = ngx_http_llm_route_index(sh, model->data, model->len);

    if (r == -1) {
        if (sh->nroutes == NGX_HTTP_LLM_MAX_ROUTES) {
            ngx_shmtx_unlock(&lmcf->shpool->mutex);
            *why = "too many routes";
            return NGX_DECLINED;
        }

        r = sh->nroutes++;
        rs = &sh->routes[r];
        ngx_memcpy(rs->model, model->data, model->len);
        rs->len = model->len;
    }

    rs = &sh->routes[r];
    rs->pool = (uint64_t) 1 << engine;
    rs->promoted = 1;

    ngx_shmtx_unlock(&lmcf->shpool->mutex);

    ngx_log_error(NGX_LOG_NOTICE, ngx_cycle->log, 0,
                  "llm route \"%V\": promoted to engine \"%s\"", model,
                  sh->engines[engine].name);

    ngx_http_llm_admit_kick(lmcf);

    *why = NULL;

    return NGX_OK;
}


/* ---- JSON views -------------------------------------------------------- */

static void
ngx_http_llm_pool_json(ngx_http_llm_shctx_t *sh, uint64_t pool,
    ngx_http_llm_wbuf_t *w)
{
    ngx_uint_t  i, n;

    ngx_http_llm_puts(w, "[");

    for (i = 0, n = 0; i < sh->nengines; i++) {
        if (pool & ((uint64_t) 1 << i)) {
            ngx_http_llm_puts(w, n++ ? "," : "");
            ngx_http_llm_put_string(w, sh->engines[i].name,
                                    ngx_strlen(sh->engines[i].name));
        }
    }

    ngx_http_llm_puts(w, "]");
}


static void
ngx_http_llm_route_json(ngx_http_llm_shctx_t *sh, u_char *model, size_t len,
    uint64_t pool, ngx_uint_t promoted, ngx_uint_t *n, ngx_uint_t *ready,
    ngx_http_llm_wbuf_t *w)
{
    ngx_uint_t  ok;

    ok = ngx_http_llm_pool_ready(sh, pool);
    *ready = *ready && ok;

    ngx_http_llm_puts(w, (*n)++ ? ",{\"model\":" : "{\"model\":");
    ngx_http_llm_put_string(w, model, len);
    ngx_http_llm_puts(w, ",\"engines\":");
    ngx_http_llm_pool_json(sh, pool, w);
    ngx_http_llm_printf(w, ",\"ready\":%s,\"promoted\":%s}",
                        ok ? "true" : "false", promoted ? "true" : "false");
}


/*
 * Whether engine i's model j is a name no route has, met for the first
 * time: served names are listed once, by the first engine serving them.
 */
static ngx_uint_t
ngx_http_llm_served_first(ngx_http_llm_shctx_t *sh, ngx_uint_t i,
    ngx_uint_t j)
{
    u_char      *m;
    size_t       len;
    ngx_uint_t   k;

    m = sh->engines[i].models[j];
    len = ngx_strlen(m);

    if (ngx_http_llm_route_index(sh, m, len) != -1) {
        return 0;
    }

    for (k = 0; k < i; k++) {
        if (ngx_http_llm_served(&sh->engines[k], m, len)) {
            return 0;
        }
    }

    return 1;
}


/* routes (configured, promoted, and served names) into w; *ready: all
   of them can serve (and there is at least one) */
static void
ngx_http_llm_routes_json(ngx_http_llm_shctx_t *sh, ngx_str_t *only,
    ngx_http_llm_wbuf_t *w, ngx_uint_t *ready)
{
    u_char                    *m;
    size_t                     len;
    ngx_uint_t                 i, j, n;
    ngx_http_llm_route_sh_t   *rs;
    ngx_http_llm_engine_sh_t  *es;

    n = 0;
    *ready = 1;

    ngx_http_llm_puts(w, "\"routes\":[");

    for (i = 0; i < sh->nroutes; i++) {
        rs = &sh->routes[i];

        if (only && (only->len != rs->len
                     || ngx_strncmp(only->data, rs->model, rs->len) != 0))
        {
            continue;
        }

        ngx_http_llm_route_json(sh, rs->model, rs->len, rs->pool,
                                rs->promoted, &n, ready, w);
    }

    for (i = 0; i < sh->nengines; i++) {
        es = &sh->engines[i];

        for (j = 0; j < es->nmodels; j++) {
            m = es->models[j];
            len = ngx_strlen(m);

            if (!ngx_http_llm_served_first(sh, i, j)
                || (only && (only->len != len
                             || ngx_strncmp(only->data, m, len) != 0)))
            {
                continue;
            }

            ngx_http_llm_route_json(sh, m, len,
                                    ngx_http_llm_served_pool(sh, m, len),
                                    0, &n, ready, w);
        }
    }

    ngx_http_llm_puts(w, "]");

    if (n == 0) {
        *ready = 0;
    }
}


static ngx_http_llm_shctx_t *
ngx_http_llm_snapshot(ngx_http_llm_main_conf_t *lmcf, ngx_pool_t *pool)
{
    ngx_http_llm_shctx_t  *sh;

    sh = ngx_palloc(pool, sizeof(ngx_http_llm_shctx_t));
    if (sh == NULL) {
        return NULL;
    }

    ngx_shmtx_lock(&lmcf->shpool->mutex);
    ngx_memcpy(sh, lmcf->sh, sizeof(ngx_http_llm_shctx_t));
    ngx_shmtx_unlock(&lmcf->shpool->mutex);

    return sh;
}


void
ngx_http_llm_status_json(ngx_http_llm_main_conf_t *lmcf,
    ngx_http_llm_wbuf_t *w, ngx_str_t *model, ngx_uint_t *ready)
{
    u_char                    *vp;
    uint64_t                   ctr[LLM_CTR_N];
    ngx_uint_t                 i, j;
    ngx_http_llm_link_t       *link;
    ngx_http_llm_shctx_t      *sh;
    ngx_http_llm_wbuf_t        routes;
    ngx_http_llm_engine_sh_t  *es;

    *ready = 0;

    sh = ngx_http_llm_snapshot(lmcf, w->pool);
    if (sh == NULL) {
        w->failed = 1;
        return;
    }

    ngx_http_llm_wbuf_init(&routes, w->pool);
    ngx_http_llm_routes_json(sh, model, &routes, ready);

    ngx_http_llm_printf(w, "{\"status\":\"%s\",\"leader\":%P,"
                        "\"waiting\":%ui,",
                        *ready ? "ok" : "unavailable", sh->leader,
                        sh->waiting);
    ngx_http_llm_put(w, routes.start, ngx_http_llm_wbuf_len(&routes));
    ngx_http_llm_puts(w, ",\"engines\":[");

    for (i = 0; i < sh->nengines; i++) {
        es = &sh->engines[i];

        ngx_http_llm_puts(w, i ? ",{\"name\":" : "{\"name\":");
        ngx_http_llm_put_string(w, es->name, ngx_strlen(es->name));
        ngx_http_llm_printf(w, ",\"state\":\"%s\",\"reason\":",
                            ngx_http_llm_state_names[es->state]);
        ngx_http_llm_put_string(w, es->reason, ngx_strlen(es->reason));
        ngx_http_llm_printf(w, ",\"since\":%T,\"draining\":%s,"
                            "\"epoch\":\"%016xL\",\"pid\":%P,"
                            "\"running\":%ui,\"max_num_seqs\":%ui,",
                            es->since, es->drain ? "true" : "false",
                            es->epoch, es->pid, es->running,
                            es->max_num_seqs);
        ngx_http_llm_printf(w, "\"max_model_len\":%ui,\"fails\":%ui,"
                            "\"passes\":%ui,\"prompt_fingerprint\":"
                            "\"%016xL\",\"system_fingerprint\":",
                            es->max_model_len, es->fails, es->passes,
                            es->fingerprint);
        ngx_http_llm_put_string(w, es->system_fingerprint,
                                ngx_strlen(es->system_fingerprint));
        /* the build string starts with the version: "0.1.0 (git ...)" */
        vp = (u_char *) ngx_strchr(es->engine_build, ' ');
        ngx_http_llm_printf(w, ",\"engine_version\":");
        ngx_http_llm_put_string(w, es->engine_build,
                                vp ? (size_t) (vp - es->engine_build)
                                   : ngx_strlen(es->engine_build));
        ngx_http_llm_printf(w, ",\"engine_build\":");
        ngx_http_llm_put_string(w, es->engine_build,
                                ngx_strlen(es->engine_build));

        /* the engine's own numbers, as this worker maps its segment */
        link = ngx_http_llm_link(i);

        if (link && link->attached) {
            llm_ipc_counters(&link->client, ctr);

            ngx_http_llm_printf(w, ",\"kv_capacity_tokens\":%uL,"
                                "\"kv_capacity_bytes\":%uL,"
                                "\"kv_blocks_used\":%uL,"
                                "\"kv_blocks_total\":%uL",
                                ctr[LLM_CTR_KV_CAPACITY_TOKENS],
                                ctr[LLM_CTR_KV_CAPACITY_BYTES],
                                ctr[LLM_CTR_KV_BLOCKS_USED],
                                ctr[LLM_CTR_KV_BLOCKS_TOTAL]);
        }

        ngx_http_llm_puts(w, ",\"models\":[");

        for (j = 0; j < es->nmodels; j++) {
            ngx_http_llm_puts(w, j ? "," : "");
            ngx_http_llm_put_string(w, es->models[j],
                                    ngx_strlen(es->models[j]));
        }

        ngx_http_llm_puts(w, "]}");
    }

    ngx_http_llm_puts(w, "]}");

    if (routes.failed) {
        w->failed = 1;
    }
}


/* the smallest max_model_len of the pool's engines that told theirs */
static ngx_uint_t
ngx_http_llm_pool_max_len(ngx_http_llm_shctx_t *sh, uint64_t pool,
    time_t *created)
{
    ngx_uint_t  i, len;

    len = 0;
    *created = 0;

    for (i = 0; i < sh->nengines; i++) {
        if (!(pool & ((uint64_t) 1 << i)) || !sh->engines[i].max_model_len) {
            continue;
        }

        if (len == 0 || sh->engines[i].max_model_len < len) {
            len = sh->engines[i].max_model_len;
        }

        *created = ngx_max(*created, sh->engines[i].started);
    }

    return len;
}


static void
ngx_http_llm_model_json(ngx_http_llm_shctx_t *sh, u_char *model, size_t len,
    uint64_t pool, ngx_uint_t *n, ngx_http_llm_wbuf_t *w)
{
    time_t      created;
    ngx_uint_t  max;

    max = ngx_http_llm_pool_max_len(sh, pool, &created);

    ngx_http_llm_puts(w, (*n)++ ? ",{\"id\":" : "{\"id\":");
    ngx_http_llm_put_string(w, model, len);
    ngx_http_llm_printf(w, ",\"object\":\"model\",\"created\":%T,"
                        "\"owned_by\":\"llm-serve\"", created);

    if (max) {
        ngx_http_llm_printf(w, ",\"max_model_len\":%ui", max);
    }

    ngx_http_llm_puts(w, "}");
}


void
ngx_http_llm_models_json(ngx_http_llm_main_conf_t *lmcf,
    ngx_http_llm_wbuf_t *w)
{
    u_char                    *m;
    size_t                     len;
    ngx_uint_t                 i, j, n;
    ngx_http_llm_shctx_t      *sh;
    ngx_http_llm_route_sh_t   *rs;
    ngx_http_llm_engine_sh_t  *es;

    sh = ngx_http_llm_snapshot(lmcf, w->pool);
    if (sh == NULL) {
        w->failed = 1;
        return;
    }

    n = 0;

    ngx_http_llm_puts(w, "{\"object\":\"list\",\"data\":[");

    for (i = 0; i < sh->nroutes; i++) {
        rs = &sh->routes[i];
        ngx_http_llm_model_json(sh, rs->model, rs->len, rs->pool, &n, w);
    }

    for (i = 0; i < sh->nengines; i++) {
        es = &sh->engines[i];

        for (j = 0; j < es->nmodels; j++) {
            if (!ngx_http_llm_served_first(sh, i, j)) {
                continue;
            }

            m = es->models[j];
            len = ngx_strlen(m);

            ngx_http_llm_model_json(sh, m, len,
                                    ngx_http_llm_served_pool(sh, m, len),
                                    &n, w);
        }
    }

    ngx_http_llm_puts(w, "]}");
}
