/*
 * Per-worker engine links: each worker maps every engine's segment and
 * keeps one doorbell connection to it in nginx's event loop.  "Slot k has
 * events" messages are dispatched to the sequence that owns slot k.  A
 * closed socket means the engine died: its sequences are told at once
 * (they drain what is left in their rings, then fail), the engine is
 * marked down in the shared zone, and the link reconnects with backoff;
 * a new engine instance shows as a new epoch.
 */

#include "ngx_http_llm_module.h"


#define NGX_HTTP_LLM_BACKOFF_MIN  50
#define NGX_HTTP_LLM_BACKOFF_MAX  1000


static ngx_int_t ngx_http_llm_link_open(ngx_http_llm_link_t *link);
static void ngx_http_llm_link_close(ngx_http_llm_link_t *link,
    const char *why);
static void ngx_http_llm_link_read(ngx_event_t *rev);
static void ngx_http_llm_link_retry(ngx_event_t *ev);


u_char  ngx_http_llm_evbuf[NGX_HTTP_LLM_EVBUF];

static ngx_http_llm_link_t  *ngx_http_llm_links;
static ngx_uint_t            ngx_http_llm_nlinks;


ngx_http_llm_link_t *
ngx_http_llm_link(ngx_uint_t engine)
{
    return engine < ngx_http_llm_nlinks ? &ngx_http_llm_links[engine] : NULL;
}


ngx_int_t
ngx_http_llm_links_init(ngx_cycle_t *cycle, ngx_http_llm_main_conf_t *lmcf)
{
    ngx_uint_t            i;
    ngx_http_llm_link_t  *link;

    ngx_http_llm_nlinks = lmcf->engines.nelts;
    ngx_http_llm_links = ngx_pcalloc(cycle->pool,
                                     ngx_http_llm_nlinks
                                     * sizeof(ngx_http_llm_link_t));
    if (ngx_http_llm_links == NULL) {
        return NGX_ERROR;
    }

    for (i = 0; i < ngx_http_llm_nlinks; i++) {
        link = &ngx_http_llm_links[i];

        link->lmcf = lmcf;
        link->conf = &((ngx_http_llm_engine_conf_t *) lmcf->engines.elts)[i];
        link->client.sock_fd = -1;
        link->client.shm_fd = -1;

        link->retry.handler = ngx_http_llm_link_retry;
        link->retry.data = link;
        link->retry.log = cycle->log;
        link->retry.cancelable = 1;

        if (ngx_http_llm_link_open(link) != NGX_OK) {
            ngx_add_timer(&link->retry, NGX_HTTP_LLM_BACKOFF_MIN);
        }
    }

    return NGX_OK;
}


void
ngx_http_llm_links_close(void)
{
    ngx_uint_t  i;

    for (i = 0; i < ngx_http_llm_nlinks; i++) {
        if (ngx_http_llm_links[i].attached) {
            ngx_http_llm_link_close(&ngx_http_llm_links[i], NULL);
        }
    }
}


static ngx_int_t
ngx_http_llm_link_fail(ngx_http_llm_link_t *link, ngx_int_t rc,
    const char *err)
{
    link->err_rc = rc;
    link->failed = 0;
    ngx_cpystrn(link->err, (u_char *) err, sizeof(link->err));

    return NGX_DECLINED;
}


/*
 * Attach the segment and connect the doorbell.  Never blocks: shm_open,
 * mmap and a unix-socket connect() answer at once.
 */
static ngx_int_t
ngx_http_llm_link_open(ngx_http_llm_link_t *link)
{
    int                          rc;
    char                         err[256];
    u_char                       name[LLM_IPC_NAME_MAX], dir[NGX_MAX_PATH];
    uint32_t                     st;
    ngx_socket_t                 fd;
    ngx_connection_t            *c;
    llm_ipc_client              *client;
    ngx_http_llm_engine_conf_t  *ec;

    ec = link->conf;
    client = &link->client;

    if (ec->run_dir.len >= sizeof(dir)) {
        return ngx_http_llm_link_fail(link, LLM_IPC_EINVAL,
                                      "run_dir is too long");
    }

    ngx_cpystrn(name, ec->name.data, ec->name.len + 1);
    ngx_cpystrn(dir, ec->run_dir.data, ec->run_dir.len + 1);

    rc = llm_ipc_attach(client, (char *) dir, (char *) name, 0, err,
                        sizeof(err));
    if (rc != LLM_IPC_OK) {
        client->sock_fd = -1;
        client->shm_fd = -1;
        return ngx_http_llm_link_fail(link, rc, err);
    }

    st = llm_ipc_engine_state(client);

    if (st == LLM_STATE_FAILED || st == LLM_STATE_STOPPED) {
        /* a dead engine's segment: remember why, do not hold it */
        ngx_snprintf((u_char *) err, sizeof(err), "engine %s: %s%Z",
                     st == LLM_STATE_FAILED ? "failed" : "stopped",
                     client->hdr->state_msg);
        llm_ipc_detach(client);
        ngx_http_llm_link_fail(link, LLM_IPC_EDEAD, err);
        link->failed = 1;
        return NGX_DECLINED;
    }

    link->attached = 1;
    link->nslots = client->hdr->n_slots;

    link->owners = ngx_calloc(link->nslots * sizeof(ngx_http_llm_seq_t *),
                              ngx_cycle->log);
    if (link->owners == NULL) {
        llm_ipc_detach(client);
        link->attached = 0;
        return ngx_http_llm_link_fail(link, LLM_IPC_ESYS, "out of memory");
    }

    ngx_http_llm_engine_attached(link);

    fd = llm_ipc_connect(client, err, sizeof(err));
    if (fd < 0) {
        ngx_http_llm_link_fail(link, fd, err);
        goto failed;
    }

    c = ngx_get_connection(fd, ngx_cycle->log);
    if (c == NULL) {
        ngx_http_llm_link_fail(link, LLM_IPC_ESYS, "no free connections");
        goto failed;
    }

    c->data = link;
    c->read->handler = ngx_http_llm_link_read;
    c->read->log = ngx_cycle->log;
    c->write->log = ngx_cycle->log;

    link->conn = c;

    if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
        ngx_http_llm_link_fail(link, LLM_IPC_ESYS, "cannot add the doorbell "
                               "socket to the event loop");
        goto failed;
    }

    link->backoff = 0;
    link->err_rc = LLM_IPC_OK;
    link->err[0] = '\0';

    ngx_log_error(NGX_LOG_INFO, ngx_cycle->log, 0,
                  "llm engine \"%V\": connected, epoch %016xL, %uD slots",
                  &ec->name, client->epoch, link->nslots);

    /* the engine may have rung before we listened */
    ngx_post_event(c->read, &ngx_posted_events);

    return NGX_OK;

failed:

    ngx_http_llm_link_close(link, NULL);

    return NGX_DECLINED;
}


/*
 * Tell every sequence on this link that the engine is gone (they read
 * what is left in their rings), then let go of the segment.  why == NULL:
 * a quiet close (worker exit, failed open) that does not mark the engine.
 */
static void
ngx_http_llm_link_close(ngx_http_llm_link_t *link, const char *why)
{
    uint32_t             k;
    ngx_http_llm_seq_t  *seq;

    if (why) {
        ngx_http_llm_engine_down(link->lmcf, link->conf->index, "%s", why);
    }

    for (k = 0; link->owners && k < link->nslots; k++) {
        seq = link->owners[k];

        if (seq == NULL) {
            continue;
        }

        seq->dead = 1;
        seq->handler(seq);
    }

    /* whoever did not finish in the handler loses the slot quietly */
    for (k = 0; link->owners && k < link->nslots; k++) {
        seq = link->owners[k];

        if (seq) {
            seq->active = 0;
            link->owners[k] = NULL;
        }
    }

    if (link->conn) {
        ngx_close_connection(link->conn);
        link->conn = NULL;
        link->client.sock_fd = -1;       /* closed above */
    }

    if (link->owners) {
        ngx_free(link->owners);
        link->owners = NULL;
    }

    llm_ipc_detach(&link->client);
    link->attached = 0;

    if (why == NULL || ngx_exiting || ngx_quit || ngx_terminate) {
        return;
    }

    link->backoff = NGX_HTTP_LLM_BACKOFF_MIN;

    if (!link->retry.timer_set) {
        ngx_add_timer(&link->retry, link->backoff);
    }
}


static void
ngx_http_llm_link_retry(ngx_event_t *ev)
{
    ngx_http_llm_link_t  *link = ev->data;

    if (ngx_exiting || ngx_quit || ngx_terminate || link->attached) {
        return;
    }

    if (ngx_http_llm_link_open(link) == NGX_OK) {
        return;
    }

    link->backoff = ngx_min(ngx_max(link->backoff * 2,
                                    NGX_HTTP_LLM_BACKOFF_MIN),
                            NGX_HTTP_LLM_BACKOFF_MAX);

    ngx_add_timer(&link->retry, link->backoff);
}


static void
ngx_http_llm_link_read(ngx_event_t *rev)
{
    int                   i, n;
    llm_ipc_msg           msgs[64];
    ngx_connection_t     *c;
    ngx_http_llm_seq_t   *seq;
    ngx_http_llm_link_t  *link;

    c = rev->data;
    link = c->data;

    for ( ;; ) {
        n = llm_ipc_recv(&link->client, msgs, 64);

        if (n == LLM_IPC_EDEAD) {
            ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                          "llm engine \"%V\": doorbell socket closed "
                          "(engine pid %P gone?)", &link->conf->name,
                          (ngx_pid_t) link->client.hdr->pid);
            ngx_http_llm_link_close(link, "doorbell socket closed: the "
                                    "engine process is gone");
            return;
        }

        if (n <= 0) {
            break;
        }

        for (i = 0; i < n; i++) {

            if (msgs[i].type == LLM_MSG_STATE) {
                ngx_http_llm_engine_state(link, msgs[i].slot);
                continue;
            }

            if (msgs[i].type != LLM_MSG_EVENTS
                || msgs[i].slot >= link->nslots)
            {
                continue;
            }

            seq = link->owners[msgs[i].slot];

            if (seq && seq->handle.gen == (uint32_t) msgs[i].arg) {
                seq->handler(seq);
            }

            if (!link->attached) {
                /* a handler closed the link */
                return;
            }
        }
    }

    if (ngx_handle_read_event(rev, 0) != NGX_OK) {
        ngx_http_llm_link_close(link, "doorbell socket failed");
    }
}


/*
 * Claim a slot, write the request, submit.  Returns NGX_OK, or NGX_ERROR
 * with why set; NGX_DECLINED when the engine failed in a way that counts
 * against its health (dead socket, protocol error).
 */
ngx_int_t
ngx_http_llm_seq_submit(ngx_http_llm_seq_t *seq, ngx_http_llm_link_t *link,
    enum llm_ipc_kind kind, ngx_str_t *request, ngx_str_t *why)
{
    int  rc;

    if (!link->attached && ngx_http_llm_link_open(link) != NGX_OK) {
        why->data = link->err;
        why->len = ngx_strlen(link->err);
        return NGX_DECLINED;
    }

    rc = llm_ipc_claim(&link->client, &seq->handle);
    if (rc != LLM_IPC_OK) {
        goto failed;
    }

    rc = llm_ipc_write_request(&link->client, &seq->handle, request->data,
                               request->len);
    if (rc != LLM_IPC_OK) {
        (void) llm_ipc_release(&link->client, &seq->handle);
        goto failed;
    }

    seq->link = link;
    seq->active = 1;
    seq->dead = 0;
    link->owners[seq->handle.slot] = seq;

    rc = llm_ipc_submit(&link->client, &seq->handle, kind, request->len);
    if (rc != LLM_IPC_OK) {
        ngx_http_llm_seq_release(seq);
        goto failed;
    }

    return NGX_OK;

failed:

    why->data = (u_char *) llm_ipc_strerror(rc);
    why->len = ngx_strlen(why->data);

    return (rc == LLM_IPC_EDEAD || rc == LLM_IPC_EPROTO) ? NGX_DECLINED
                                                         : NGX_ERROR;
}


/* bytes of whole event records; 0: none now (a doorbell will come) */
long
ngx_http_llm_seq_read(ngx_http_llm_seq_t *seq, void *buf, size_t cap)
{
    if (!seq->active) {
        return 0;
    }

    return llm_ipc_read_events(&seq->link->client, &seq->handle, buf, cap);
}


/* free the slot; before finish the engine cancels the sequence */
void
ngx_http_llm_seq_release(ngx_http_llm_seq_t *seq)
{
    ngx_http_llm_link_t  *link;

    if (!seq->active) {
        return;
    }

    link = seq->link;
    seq->active = 0;

    if (link->owners && link->owners[seq->handle.slot] == seq) {
        link->owners[seq->handle.slot] = NULL;
    }

    (void) llm_ipc_release(&link->client, &seq->handle);
}
