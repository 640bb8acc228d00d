/* The capacity calibrator lands exactly on every requested token count.
 * Against the fake tokenizer (irregular, non-additive costs: qualify_fake_tok.h)
 * every result is re-tokenized independently, not taken from the
 * calibrator's own report; the r33 targets that went wrong (117,500 ->
 * 87,207 actual) must come out exact and monotonic.  Bad requests fail with
 * a reason.  With LLM_QUALIFY_URL (and LLM_QUALIFY_MODEL) set, the same is
 * checked against a real server's /tokenize (e.g. `make run`). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calibrate.h"
#include "json.h"
#include "qualify_fake_tok.h"
#include "tap.h"
#include "tokenize.h"

/* A request: fixed head and tail around the filler, plus chat overhead. */
typedef struct {
    const char *head, *tail;
    long        overhead;
    calibrator *cal;
    int         calls;
    int         wobble;   /* adds 1 token whenever the text length is odd */
} fake_req;

static long count_text(fake_req *r, const calib_fill *f, strbuf *text)
{
    sb_reset(text);
    sb_puts(text, r->head);
    calib_text(r->cal, f, NULL, text);
    sb_puts(text, r->tail);
    long n = ft_tokenize(text->data, text->len, NULL, 0) + r->overhead;
    if (r->wobble && text->len % 2) n++;
    return n;
}

static int measure(void *user, const calib_fill *f, long *tokens, strbuf *err)
{
    (void)err;
    fake_req *r = user;
    strbuf text;
    sb_init(&text);
    *tokens = count_text(r, f, &text);
    r->calls++;
    sb_free(&text);
    return 0;
}

static int refuse(void *user, const calib_fill *f, long *tokens, strbuf *err)
{
    (void)user, (void)f, (void)tokens;
    sb_puts(err, "/tokenize: HTTP 503");
    return -1;
}

/* Calibrate each target in order; every landing is re-measured from the
 * text itself.  Returns how many were exact. */
static int run_targets(fake_req *r, const long *targets, int n, int *monotonic, int *max_calls)
{
    int exact = 0;
    long prev = -1;
    *monotonic = 1;
    *max_calls = 0;
    strbuf text, err;
    sb_init(&text);
    sb_init(&err);
    for (int i = 0; i < n; i++) {
        calib_result res;
        sb_reset(&err);
        r->calls = 0;
        if (calibrate(r->cal, targets[i], &res, &err) < 0) {
            diag("target %ld: %s", targets[i], err.data);
            continue;
        }
        long again = count_text(r, &res.fill, &text);
        if (again == targets[i] && res.actual == targets[i]) exact++;
        else diag("target %ld: calibrator says %ld, text measures %ld", targets[i], res.actual, again);
        if (again <= prev) *monotonic = 0;
        prev = again;
        if (r->calls > *max_calls) *max_calls = r->calls;
    }
    sb_free(&text);
    sb_free(&err);
    return exact;
}

/* ---- against a real server's /tokenize -------------------------------- */

typedef struct {
    qctx       *q;
    calibrator *cal;
} real_req;

static int http_measure(void *user, const calib_fill *f, long *tokens, strbuf *err)
{
    real_req *r = user;
    strbuf text, body;
    sb_init(&text);
    sb_init(&body);
    sb_puts(&text, "Calibration check. Read the text below.\n\n");
    calib_text(r->cal, f, NULL, &text);
    sb_puts(&text, "\n\nWhich animal jumps in the text above?");
    jw w;
    jw_init(&w, &body);
    jw_obj(&w, NULL);
    jw_str(&w, "model", r->q->model);
    jw_arr(&w, "messages");
    jw_obj(&w, NULL);
    jw_str(&w, "role", "user");
    jw_strn(&w, "content", text.data, text.len);
    jw_end(&w);
    jw_end(&w);
    jw_end(&w);
    tok_result t;
    int rc = tokenize_chat(r->q, "calibrate", body.data, body.len, 0, &t, err);
    *tokens = t.count;
    tok_result_free(&t);
    sb_free(&text);
    sb_free(&body);
    return rc;
}

static void real_server(void)
{
    const char *url = getenv("LLM_QUALIFY_URL"), *model = getenv("LLM_QUALIFY_MODEL");
    if (!url || !model) {
        skip(2, "LLM_QUALIFY_URL and LLM_QUALIFY_MODEL not set (no demo stack to measure)");
        return;
    }
    qctx q;
    memset(&q, 0, sizeof q);
    q.model = model;
    q.base_url = url;
    q.http = http_new(url, NULL);
    q.request_timeout_s = 60;
    q.deadline = now_s() + 600;
    char dir[] = "/tmp/llm-qualify-calib-XXXXXX";
    strbuf err;
    sb_init(&err);
    if (!mkdtemp(dir) || art_init(&q.art, dir, &err) < 0) {
        ok(0, "scratch dir for artifacts: %s", err.data ? err.data : "mkdtemp failed");
        skip(1, "no scratch dir");
        return;
    }
    yajl_val models = get_json(&q, "models", "/v1/models", false, &err);
    long long mml = 0;
    yajl_val data = json_get(models, "data");
    for (size_t i = 0; i < json_len(data); i++) {
        const char *id = json_string(json_get(data->u.array.values[i], "id"));
        if (id && !strcmp(id, model)) json_int(json_get(data->u.array.values[i], "max_model_len"), &mml);
    }
    yajl_tree_free(models);
    if (!ok(mml > 64, "%s serves %s with max_model_len %lld %s", url, model, mml, err.data ? err.data : "")) {
        skip(1, "no max_model_len");
        return;
    }
    calibrator cal;
    real_req rr = { &q, &cal };
    calib_init(&cal, http_measure, &rr);
    long targets[] = { mml / 8, mml / 4 + 1, mml / 2 - 1, mml - 257, mml - 256, mml - 1 };
    int n = 6, exact = 0;
    long prev = 0;
    for (int i = 0; i < n; i++) {
        calib_result res;
        long again = -1;
        sb_reset(&err);
        if (calibrate(&cal, targets[i], &res, &err) == 0 && http_measure(&rr, &res.fill, &again, &err) == 0
            && again == targets[i] && again > prev)
            exact++;
        else
            diag("target %ld: %s (re-measured %ld)", targets[i], err.data ? err.data : "", again);
        prev = again;
    }
    is_int(exact, n, "the real /tokenize: %d targets up to max_model_len - 1 land exactly, rising", n);
    http_free(q.http);
    art_free(&q.art);
    sb_free(&err);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) diag("could not remove %s", dir);
}

int main(void)
{
    /* Every count in a band above the base, a coarse sweep, and the r33
     * labels at full scale. */
    calibrator cal;
    fake_req req = { "Capacity probe 1234abcd-0. Read the text below.\n\n",
                     "\n\nWhich animal jumps in the text above?", 7, &cal, 0, 0 };
    calib_init(&cal, measure, &req);
    calib_result res;
    strbuf err;
    sb_init(&err);
    int rc = calibrate(&cal, 10, &res, &err);
    ok(rc < 0 && strstr(err.data, "below the"), "a target below the fixed part fails with the reason: %s",
       err.data);

    long band[300];
    long base = 0;
    {
        calib_fill none = { 0, NULL, 0 };
        strbuf t;
        sb_init(&t);
        base = count_text(&req, &none, &t);
        sb_free(&t);
    }
    for (int i = 0; i < 300; i++) band[i] = base + i;
    int mono, calls;
    is_int(run_targets(&req, band, 300, &mono, &calls), 300,
           "all 300 consecutive targets from the base (%ld) up land exactly", base);
    ok(mono, "and rise strictly");
    ok(calls <= 20, "each within 20 /tokenize calls (most: %d)", calls);

    long sweep[] = { 1000, 4095, 8191, 16384, 32768, 65536, 87207, 117500, 118500, 118830,
                     119503, 120000, 130816, 131072 };
    int n_sweep = (int)(sizeof sweep / sizeof *sweep);
    is_int(run_targets(&req, sweep, n_sweep, &mono, &calls), n_sweep,
           "targets up to 131,072 (incl. the r33 117,500 / 118,500 / 120,000) land exactly");
    ok(mono, "the actual counts rise strictly with the targets");
    ok(calls <= 24, "each within 24 /tokenize calls (most: %d)", calls);

    /* A tokenizer whose cost wobbles with the text length, and a filler
     * unit with an odd cost: still exact, from measurements alone. */
    calibrator cal2;
    fake_req wob = { "Head: ", " :tail", 3, &cal2, 0, 1 };
    calib_init(&cal2, measure, &wob);
    cal2.unit = " Seventeen zebras quietly grazed 00 meters apart,\n\n";
    long wt[] = { 60, 61, 62, 63, 64, 65, 500, 501, 502, 503, 9999, 10000, 10001 };
    int n_wt = (int)(sizeof wt / sizeof *wt);
    is_int(run_targets(&wob, wt, n_wt, &mono, &calls), n_wt,
           "a length-dependent tokenizer with another unit: every target exact");

    /* Landing needs the fine units: with only " a" (which merges in pairs)
     * the gaps still close. */
    static const char *const only_a[] = { " a", NULL };
    calibrator cal3;
    fake_req pairs = { "H", "T", 0, &cal3, 0, 0 };
    calib_init(&cal3, measure, &pairs);
    cal3.fine_units = only_a;
    long pt[40];
    for (int i = 0; i < 40; i++) pt[i] = 200 + i;
    is_int(run_targets(&pairs, pt, 40, &mono, &calls), 40,
           "with only a pair-merging fine unit, 40 consecutive targets land exactly");

    /* Failures say why. */
    calibrator bad;
    fake_req flat = { "H", "T", 0, &bad, 0, 0 };
    calib_init(&bad, measure, &flat);
    bad.unit = "";
    sb_reset(&err);
    rc = calibrate(&bad, 100, &res, &err);
    ok(rc < 0 && strstr(err.data, "adds no tokens"),
       "a filler unit that adds no tokens fails: %s", err.data);
    calibrator down;
    calib_init(&down, refuse, NULL);
    sb_reset(&err);
    rc = calibrate(&down, 100, &res, &err);
    ok(rc < 0 && strstr(err.data, "HTTP 503"),
       "a failing /tokenize is reported: %s", err.data);
    calibrator tight;
    fake_req tr = { "H", "T", 0, &tight, 0, 0 };
    calib_init(&tight, measure, &tr);
    tight.max_probes = 2;
    sb_reset(&err);
    rc = calibrate(&tight, 5000, &res, &err);
    ok(rc < 0 && strstr(err.data, "within 2 measurements"),
       "running out of measurements is reported: %s", err.data);

    /* The needle goes after half of the coarse copies. */
    strbuf t;
    sb_init(&t);
    calibrator c4;
    calib_init(&c4, measure, NULL);
    c4.unit = "u";
    calib_fill f = { 4, " x", 2 };
    calib_text(&c4, &f, "N", &t);
    is_str(t.data, "uuNuu x x", "calib_text puts the middle after half the units, fine units last");
    sb_free(&t);

    real_server();
    sb_free(&err);
    return exit_status();
}
