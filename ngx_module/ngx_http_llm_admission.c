/*
 * Global admission, shared by all workers through the zone: at most
 * max_num_seqs sequences run per engine (the engine header says how many),
 * up to llm_queue more wait in one FIFO for at most its timeout.
 *
 * The engine is the authority on its capacity: its header publishes the
 * seats max_num_seqs has left and the KV blocks still free, counting work
 * from every client.  An engine takes a place only when neither its own
 * count nor the places this nginx granted it (some not yet submitted)
 * fill max_num_seqs, and it has KV blocks free; whether a request's
 * blocks fit is the engine's FIFO's decision.  Capacity that frees
 * without a request of ours ending (another client's) is noticed at the
 * next health tick.
 *
 * A place is a ticket in the zone.  When capacity frees (a request ends,
 * an engine becomes healthy, a drain is undone, a route is promoted) the
 * worker that freed it grants waiting tickets in FIFO order, under the
 * zone lock, and wakes their workers.  Wake-ups cross workers through a
 * per-worker unix datagram socket in the abstract namespace
 * ("\0ngx-llm-wake-PID"): a one-byte datagram makes the owner scan its own
 * waiting requests.  No timer polls; the only timer a waiting request has
 * is its own queue timeout.  Tickets record their worker's pid, so the
 * health leader reaps the places of a worker that crashed.
 */

#include "ngx_http_llm_module.h"

#include <sys/un.h>


#define NGX_HTTP_LLM_WAKE_MAX  64


static void ngx_http_llm_wake_read(ngx_event_t *rev);


static ngx_connection_t  *ngx_http_llm_wake_conn;
static ngx_event_t        ngx_http_llm_wake_local;


static void
ngx_http_llm_wake_addr(struct sockaddr_un *sa, socklen_t *len, ngx_pid_t pid)
{
    u_char  *p;

    ngx_memzero(sa, sizeof(struct sockaddr_un));
    sa->sun_family = AF_UNIX;

    /* abstract namespace: sun_path[0] == '\0', nothing on disk */
    p = ngx_sprintf((u_char *) sa->sun_path + 1, "ngx-llm-wake-%P", pid);

    *len = offsetof(struct sockaddr_un, sun_path) + (p - (u_char *)
                                                         sa->sun_path);
}


ngx_int_t
ngx_http_llm_wake_init(ngx_cycle_t *cycle)
{
    socklen_t            len;
    ngx_socket_t         fd;
    ngx_connection_t    *c;
    struct sockaddr_un   sa;

    ngx_http_llm_wake_local.handler = ngx_http_llm_waiters_run;
    ngx_http_llm_wake_local.log = cycle->log;

    fd = ngx_socket(AF_UNIX, SOCK_DGRAM|SOCK_NONBLOCK|SOCK_CLOEXEC, 0);
    if (fd == (ngx_socket_t) -1) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, ngx_socket_errno,
                      "llm: wake-up socket() failed");
        return NGX_ERROR;
    }

    ngx_http_llm_wake_addr(&sa, &len, ngx_pid);

    if (bind(fd, (struct sockaddr *) &sa, len) == -1) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, ngx_socket_errno,
                      "llm: bind() of the wake-up socket failed");
        ngx_close_socket(fd);
        return NGX_ERROR;
    }

    c = ngx_get_connection(fd, cycle->log);
    if (c == NULL) {
        ngx_close_socket(fd);
        return NGX_ERROR;
    }

    c->read->handler = ngx_http_llm_wake_read;
    c->read->log = cycle->log;
    c->write->log = cycle->log;

    if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
        ngx_close_connection(c);
        return NGX_ERROR;
    }

    ngx_http_llm_wake_conn = c;

    return NGX_OK;
}


void
ngx_http_llm_wake_close(void)
{
    if (ngx_http_llm_wake_conn) {
        ngx_close_connection(ngx_http_llm_wake_conn);
        ngx_http_llm_wake_conn = NULL;
    }
}


static void
ngx_http_llm_wake_read(ngx_event_t *rev)
{
    u_char  buf[64];

    while (recv(ngx_http_llm_wake_conn->fd, buf, sizeof(buf), 0) > 0) {
        /* void */
    }

    ngx_http_llm_waiters_run(rev);

    if (ngx_http_llm_wake_conn
        && ngx_handle_read_event(ngx_http_llm_wake_conn->read, 0) != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ALERT, rev->log, 0,
                      "llm: wake-up socket failed");
    }
}


static void
ngx_http_llm_wake(ngx_pid_t *pids, ngx_uint_t n)
{
    u_char              one;
    socklen_t           len;
    ngx_uint_t          i;
    struct sockaddr_un  sa;

    one = 1;

    for (i = 0; i < n; i++) {

        if (pids[i] == ngx_pid) {
            ngx_post_event(&ngx_http_llm_wake_local, &ngx_posted_events);
            continue;
        }

        ngx_http_llm_wake_addr(&sa, &len, pids[i]);

        /*
         * EAGAIN: the owner has wake-ups queued already and will scan;
         * ECONNREFUSED: it is gone, and the leader reaps its tickets.
         */
        (void) sendto(ngx_http_llm_wake_conn->fd, &one, 1, MSG_DONTWAIT,
                      (struct sockaddr *) &sa, len);
    }
}


static uint64_t
ngx_http_llm_ticket_pool(ngx_http_llm_shctx_t *sh, ngx_http_llm_ticket_t *t)
{
    return t->route >= 0 ? sh->routes[t->route].pool : t->pool;
}


/*
 * Whether engine i has room for `need` more sequences, by what its header
 * publishes and by the places granted to it here.
 */
static ngx_uint_t
ngx_http_llm_has_room(ngx_http_llm_engine_sh_t *es, ngx_uint_t i,
    ngx_uint_t need)
{
    uint64_t              ctr[LLM_CTR_N];
    ngx_http_llm_link_t  *link;

    if (es->running + need > es->max_num_seqs) {
        return 0;
    }

    link = ngx_http_llm_link(i);

    if (link == NULL || !link->attached) {
        return 1;
    }

    llm_ipc_counters(&link->client, ctr);

    return ctr[LLM_CTR_SEQS_FREE] >= need && ctr[LLM_CTR_KV_BLOCKS_FREE] > 0;
}


/*
 * The admissible engine of mask with the fewest sequences and room for
 * the ticket's (a request for n choices is n sequences; more than an
 * engine runs at all is admitted alone there, and the engine refuses it
 * with a 400), or -1.
 */
static ngx_int_t
ngx_http_llm_pick(ngx_http_llm_shctx_t *sh, uint64_t mask,
    ngx_http_llm_ticket_t *t)
{
    ngx_int_t                  best;
    ngx_uint_t                 i;
    ngx_http_llm_engine_sh_t  *es;

    best = -1;

    for (i = 0; i < sh->nengines; i++) {
        es = &sh->engines[i];

        if (!(mask & ((uint64_t) 1 << i))
            || !ngx_http_llm_admissible(es)
            || !ngx_http_llm_has_room(es, i,
                                      ngx_min(t->weight, es->max_num_seqs)))
        {
            continue;
        }

        if (best == -1 || es->running < sh->engines[best].running) {
            best = i;
        }
    }

    return best;
}


static void
ngx_http_llm_run_locked(ngx_http_llm_main_conf_t *lmcf,
    ngx_http_llm_ticket_t *t, ngx_int_t engine)
{
    ngx_http_llm_engine_sh_t  *es;

    es = &lmcf->sh->engines[engine];
    t->weight = ngx_min(t->weight, es->max_num_seqs);
    es->running += t->weight;

    t->engine = engine;
    ngx_queue_insert_tail(&es->running_q, &t->link);

    ngx_http_llm_observe(lmcf, NGX_HTTP_LLM_H_QUEUE,
                         llm_ipc_now_ns() - t->enqueued);
}


/* grant waiting tickets in FIFO order; collects the workers to wake */
static void
ngx_http_llm_grant_locked(ngx_http_llm_main_conf_t *lmcf, ngx_pid_t *pids,
    ngx_uint_t *npids)
{
    ngx_int_t               e;
    ngx_uint_t              i;
    ngx_queue_t            *q, *next;
    ngx_http_llm_shctx_t   *sh = lmcf->sh;
    ngx_http_llm_ticket_t  *t;

    for (q = ngx_queue_head(&sh->waiters);
         q != ngx_queue_sentinel(&sh->waiters);
         q = next)
    {
        next = ngx_queue_next(q);
        t = ngx_queue_data(q, ngx_http_llm_ticket_t, link);

        e = ngx_http_llm_pick(sh, ngx_http_llm_ticket_pool(sh, t), t);
        if (e == -1) {
            continue;
        }

        ngx_queue_remove(q);
        sh->waiting--;

        ngx_http_llm_run_locked(lmcf, t, e);

        for (i = 0; i < *npids; i++) {
            if (pids[i] == t->pid) {
                break;
            }
        }

        if (i == *npids && *npids < NGX_HTTP_LLM_WAKE_MAX) {
            pids[(*npids)++] = t->pid;
        }
    }
}


ngx_int_t
ngx_http_llm_admit(ngx_http_llm_main_conf_t *lmcf, ngx_int_t route,
    uint64_t pool, ngx_uint_t weight, ngx_http_llm_ticket_t **tp,
    const char **why)
{
    ngx_int_t                  rc;
    ngx_uint_t                 i, n, draining, blocked;
    ngx_pid_t                  pids[NGX_HTTP_LLM_WAKE_MAX];
    ngx_http_llm_shctx_t      *sh = lmcf->sh;
    ngx_http_llm_ticket_t     *t;
    ngx_http_llm_engine_sh_t  *es;

    *tp = NULL;

    ngx_shmtx_lock(&lmcf->shpool->mutex);

    if (route >= 0) {
        pool = sh->routes[route].pool;
    }

    draining = 0;
    blocked = 1;

    for (i = 0; i < sh->nengines; i++) {
        es = &sh->engines[i];

        if (!(pool & ((uint64_t) 1 << i))) {
            continue;
        }

        if (ngx_http_llm_admissible(es)) {
            blocked = 0;

        } else if (es->state == NGX_HTTP_LLM_DRAINING) {
            draining = 1;
        }
    }

    if (blocked) {
        ngx_shmtx_unlock(&lmcf->shpool->mutex);

        *why = draining ? "the model's engines are draining"
                        : "no healthy engine serves this model now";
        return NGX_DECLINED;
    }

    t = ngx_slab_calloc_locked(lmcf->shpool, sizeof(ngx_http_llm_ticket_t));
    if (t == NULL) {
        ngx_shmtx_unlock(&lmcf->shpool->mutex);
        *why = "the llm_zone is full";
        return NGX_ERROR;
    }

    t->pid = ngx_pid;
    t->route = route;
    t->pool = pool;
    t->engine = -1;
    t->weight = ngx_max(weight, 1);
    t->enqueued = llm_ipc_now_ns();

    /*
     * Join the queue and let the grant pass decide, in FIFO order: the new
     * ticket runs now only if no earlier one can take its engine.
     */
    ngx_queue_insert_tail(&sh->waiters, &t->link);
    sh->waiting++;

    n = 0;
    ngx_http_llm_grant_locked(lmcf, pids, &n);

    if (t->engine >= 0) {
        rc = NGX_OK;

    } else if (sh->waiting > lmcf->queue) {
        ngx_queue_remove(&t->link);
        sh->waiting--;
        ngx_slab_free_locked(lmcf->shpool, t);
        t = NULL;
        *why = "the admission queue is full";
        rc = NGX_BUSY;

    } else {
        rc = NGX_AGAIN;
    }

    ngx_shmtx_unlock(&lmcf->shpool->mutex);

    /* the pass may have granted earlier tickets too */
    ngx_http_llm_wake(pids, n);

    *tp = t;

    return rc;
}


ngx_int_t
ngx_http_llm_admit_check(ngx_http_llm_main_conf_t *lmcf,
    ngx_http_llm_ticket_t *t, ngx_uint_t give_up)
{
    ngx_int_t  e;

    ngx_shmtx_lock(&lmcf->shpool->mutex);

    e = t->engine;

    if (e == -1 && give_up) {
        ngx_queue_remove(&t->link);
        lmcf->sh->waiting--;
        ngx_slab_free_locked(lmcf->shpool, t);
    }

    ngx_shmtx_unlock(&lmcf->shpool->mutex);

    return e;
}


static void
ngx_http_llm_release_locked(ngx_http_llm_main_conf_t *lmcf,
    ngx_http_llm_ticket_t *t)
{
    ngx_queue_remove(&t->link);

    if (t->engine >= 0) {
        lmcf->sh->engines[t->engine].running -= t->weight;

    } else {
        lmcf->sh->waiting--;
    }

    ngx_slab_free_locked(lmcf->shpool, t);
}


void
ngx_http_llm_admit_release(ngx_http_llm_main_conf_t *lmcf,
    ngx_http_llm_ticket_t *t)
{
    ngx_uint_t  n;
    ngx_pid_t   pids[NGX_HTTP_LLM_WAKE_MAX];

    n = 0;

    ngx_shmtx_lock(&lmcf->shpool->mutex);
    ngx_http_llm_release_locked(lmcf, t);
    ngx_http_llm_grant_locked(lmcf, pids, &n);
    ngx_shmtx_unlock(&lmcf->shpool->mutex);

    ngx_http_llm_wake(pids, n);
}


void
ngx_http_llm_admit_kick(ngx_http_llm_main_conf_t *lmcf)
{
    ngx_uint_t  n;
    ngx_pid_t   pids[NGX_HTTP_LLM_WAKE_MAX];

    n = 0;

    ngx_shmtx_lock(&lmcf->shpool->mutex);
    ngx_http_llm_grant_locked(lmcf, pids, &n);
    ngx_shmtx_unlock(&lmcf->shpool->mutex);

    ngx_http_llm_wake(pids, n);
}


static ngx_uint_t
ngx_http_llm_pid_dead(ngx_pid_t pid)
{
    return kill(pid, 0) == -1 && ngx_errno == NGX_ESRCH;
}


/* release the places of workers that died without releasing them */
void
ngx_http_llm_admit_reap(ngx_http_llm_main_conf_t *lmcf)
{
    ngx_uint_t              i, n, reaped;
    ngx_pid_t               pids[NGX_HTTP_LLM_WAKE_MAX];
    ngx_queue_t            *q, *next, *head;
    ngx_http_llm_shctx_t   *sh = lmcf->sh;
    ngx_http_llm_ticket_t  *t;

    n = 0;
    reaped = 0;

    ngx_shmtx_lock(&lmcf->shpool->mutex);

    for (i = 0; i <= sh->nengines; i++) {
        head = (i < sh->nengines) ? &sh->engines[i].running_q : &sh->waiters;

        for (q = ngx_queue_head(head); q != ngx_queue_sentinel(head); q = next)
        {
            next = ngx_queue_next(q);
            t = ngx_queue_data(q, ngx_http_llm_ticket_t, link);

            if (t->pid != ngx_pid && ngx_http_llm_pid_dead(t->pid)) {
                ngx_http_llm_release_locked(lmcf, t);
                reaped++;
            }
        }
    }

    if (reaped) {
        ngx_http_llm_grant_locked(lmcf, pids, &n);
    }

    ngx_shmtx_unlock(&lmcf->shpool->mutex);

    if (reaped) {
        ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                      "llm: released %ui admission places held by workers "
                      "that exited", reaped);
        ngx_http_llm_wake(pids, n);
    }
}
