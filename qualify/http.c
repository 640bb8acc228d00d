#include "http.h"

#include <curl/curl.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

volatile int http_interrupted;

struct http_client {
    CURL *curl;
    char *base;
    char *auth_header;   /* "Authorization: Bearer ..." or NULL */
};

typedef struct {
    http_resp   *r;
    http_data_fn fn;
    void        *user;
    int          stopped;
} transfer;

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

http_client *http_new(const char *base_url, const char *bearer_token)
{
    static int global_done;
    if (!global_done) {
        curl_global_init(CURL_GLOBAL_DEFAULT);
        global_done = 1;
    }
    http_client *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->curl = curl_easy_init();
    size_t n = strlen(base_url);
    while (n && base_url[n - 1] == '/') n--;
    c->base = strndup(base_url, n);
    if (bearer_token && *bearer_token) {
        strbuf h;
        sb_init(&h);
        sb_printf(&h, "Authorization: Bearer %s", bearer_token);
        c->auth_header = sb_steal(&h);
    }
    if (!c->curl || !c->base) {
        http_free(c);
        return NULL;
    }
    return c;
}

void http_free(http_client *c)
{
    if (!c) return;
    if (c->curl) curl_easy_cleanup(c->curl);
    free(c->base);
    free(c->auth_header);
    free(c);
}

void http_resp_init(http_resp *r)
{
    memset(r, 0, sizeof *r);
    sb_init(&r->headers);
    sb_init(&r->body);
}

void http_resp_free(http_resp *r)
{
    sb_free(&r->headers);
    sb_free(&r->body);
}

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
    transfer *t = arg;
    size_t len = size * n;
    sb_append(&t->r->body, p, len);
    if (t->fn && !t->stopped && t->fn(t->user, p, len)) t->stopped = 1;
    return len;
}

static size_t on_header(char *p, size_t size, size_t n, void *arg)
{
    transfer *t = arg;
    size_t len = size * n;
    /* A new status line (after 100 Continue or a redirect) starts over. */
    if (len >= 5 && !memcmp(p, "HTTP/", 5)) sb_reset(&t->r->headers);
    sb_append(&t->r->headers, p, len);
    return len;
}

static int on_progress(void *arg, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
    (void)arg, (void)a, (void)b, (void)c, (void)d;
    return http_interrupted;
}

int http_request(http_client *c, const char *method, const char *path, const char *body,
                 size_t body_len, bool auth, double timeout_s, http_data_fn on_data, void *user,
                 http_resp *r)
{
    CURL *h = c->curl;
    transfer t = { r, on_data, user, 0 };
    strbuf url;
    sb_init(&url);
    sb_printf(&url, "%s%s", c->base, path);
    sb_reset(&r->headers);
    sb_reset(&r->body);
    r->status = 0;
    r->error[0] = 0;

    struct curl_slist *hdrs = NULL;
    hdrs = curl_slist_append(hdrs, "Accept: application/json, text/event-stream");
    if (body) hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
    if (auth && c->auth_header) hdrs = curl_slist_append(hdrs, c->auth_header);
    hdrs = curl_slist_append(hdrs, "Expect:");   /* no 100-continue round trip */

    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url.data);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    long ms = timeout_s > 0.001 ? (long)(timeout_s * 1000) : 1;
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, ms);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, ms < 10000 ? ms : 10000L);
    if (!strcmp(method, "POST")) {
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body ? body : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(body ? body_len : 0));
    } else {
        curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
    }

    double t0 = now_s();
    CURLcode rc = curl_easy_perform(h);
    r->seconds = now_s() - t0;
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    /* A stream the callback asked to stop ends as a write error; that
     * response still arrived. */
    if (rc != CURLE_OK && !(rc == CURLE_WRITE_ERROR && t.stopped)) {
        if (rc == CURLE_ABORTED_BY_CALLBACK)
            snprintf(r->error, sizeof r->error, "interrupted");
        else if (rc == CURLE_OPERATION_TIMEDOUT)
            snprintf(r->error, sizeof r->error, "no complete response within %.1f s (%s)",
                     timeout_s, curl_easy_strerror(rc));
        else
            snprintf(r->error, sizeof r->error, "%s", curl_easy_strerror(rc));
    }
    r->status = status;
    curl_slist_free_all(hdrs);
    sb_free(&url);
    return r->error[0] && !status ? -1 : 0;
}

int http_header(const http_resp *r, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    const char *p = r->headers.data;
    while (p && *p) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        if (len > nl && p[nl] == ':' && !strncasecmp(p, name, nl)) {
            const char *v = p + nl + 1;
            while (*v == ' ' || *v == '\t') v++;
            size_t vl = (size_t)(p + len - v);
            while (vl && (v[vl - 1] == '\r' || v[vl - 1] == ' ')) vl--;
            snprintf(out, cap, "%.*s", (int)vl, v);
            return 0;
        }
        p += len + (eol ? 1 : 0);
    }
    return -1;
}
