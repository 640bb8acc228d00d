#include "calibrate.h"

#include <math.h>
#include <string.h>

const char calib_default_unit[] = " The quick brown fox jumps over the lazy dog near the river bank.";
const char *const calib_default_fine[] = { " a", " x", " the", " ok", "\n", NULL };

void calib_init(calibrator *c, calib_measure_fn measure, void *user)
{
    memset(c, 0, sizeof *c);
    c->unit = calib_default_unit;
    c->fine_units = calib_default_fine;
    c->measure = measure;
    c->user = user;
    c->max_probes = 48;
}

void calib_text(const calibrator *c, const calib_fill *f, const char *middle, strbuf *out)
{
    size_t ul = strlen(c->unit);
    sb_reserve(out, ul * (size_t)f->n_units + (middle ? strlen(middle) : 0)
                    + (f->fine ? strlen(f->fine) * (size_t)f->n_fine : 0));
    long half = f->n_units / 2;
    for (long i = 0; i < f->n_units; i++) {
        if (middle && i == half) sb_puts(out, middle);
        sb_append(out, c->unit, ul);
    }
    if (middle && f->n_units == 0) sb_puts(out, middle);
    for (long i = 0; f->fine && i < f->n_fine; i++) sb_puts(out, f->fine);
}

typedef struct {
    calibrator   *c;
    calib_result *res;
    strbuf       *err;
} search;

static int probe(search *s, long n_units, const char *fine, long n_fine, long *tokens)
{
    if (s->res->probes >= s->c->max_probes) {
        sb_printf(s->err, "no exact landing on %ld tokens within %d measurements", s->res->target,
                  s->c->max_probes);
        return -1;
    }
    s->res->probes++;
    calib_fill f = { n_units, fine, n_fine };
    if (s->c->measure(s->c->user, &f, tokens, s->err) < 0) return -1;
    return 0;
}

static int landed(search *s, long n_units, const char *fine, long n_fine, long tokens)
{
    s->res->fill = (calib_fill){ n_units, fine, n_fine };
    s->res->actual = tokens;
    return 0;
}

/* Step 3: close the gap above `lo` coarse copies (measured at klo). */
static int fine_tune(search *s, long lo, long klo, long target, int *done)
{
    *done = 0;
    for (int u = 0; s->c->fine_units[u]; u++) {
        const char *fine = s->c->fine_units[u];
        long m = target - klo;
        for (int iter = 0; iter < 6 && m > 0; iter++) {
            long k;
            if (probe(s, lo, fine, m, &k) < 0) return -1;
            if (k == target) {
                *done = 1;
                return landed(s, lo, fine, m, k);
            }
            long next = m + (target - k);
            if (next == m) break;
            m = next;
        }
    }
    return 0;
}

int calibrate(calibrator *c, long target, calib_result *res, strbuf *err)
{
    memset(res, 0, sizeof *res);
    res->target = target;
    search s = { c, res, err };
    long base;
    if (probe(&s, 0, NULL, 0, &base) < 0) return -1;
    res->base = base;
    if (target < base) {
        sb_printf(err, "target %ld is below the %ld tokens the request has without filler", target,
                  base);
        return -1;
    }
    if (target == base) return landed(&s, 0, NULL, 0, base);
    if (c->unit_cost <= 0) {
        long k;
        if (probe(&s, 64, NULL, 0, &k) < 0) return -1;
        c->unit_cost = (double)(k - base) / 64.0;
        if (c->unit_cost <= 0) {
            sb_printf(err, "the filler unit adds no tokens (%ld with 64 copies, %ld without)", k,
                      base);
            return -1;
        }
    }
    double cost = c->unit_cost;

    /* Step 2: the most coarse copies that stay at or below the target. */
    long lo = 0, klo = base, hi = -1;
    long n = (long)floor((double)(target - base) / cost);
    for (;;) {
        if (n <= lo) n = lo + 1;
        if (hi >= 0 && n >= hi) n = lo + (hi - lo) / 2;
        if (n <= lo || (double)(target - klo) < cost) break;
        long k;
        if (probe(&s, n, NULL, 0, &k) < 0) return -1;
        if (k == target) return landed(&s, n, NULL, 0, k);
        if (k < target) {
            lo = n;
            klo = k;
            long step = (long)floor((double)(target - k) / cost);
            n = n + (step > 0 ? step : 1);
        } else {
            hi = n;
            long step = (long)ceil((double)(k - target) / cost);
            n = n - (step > 0 ? step : 1);
        }
    }

    /* Step 3, backing off one coarse copy at a time when no fine unit
     * lands (a unit may merge with the end of the filler). */
    for (int back = 0; back < 3; back++) {
        int done;
        if (fine_tune(&s, lo, klo, target, &done) < 0) return -1;
        if (done) return 0;
        if (lo == 0) break;
        lo--;
        if (probe(&s, lo, NULL, 0, &klo) < 0) return -1;
    }
    sb_printf(err, "no filler lands exactly on %ld tokens (closest below: %ld with %ld copies)",
              target, klo, lo);
    return -1;
}
