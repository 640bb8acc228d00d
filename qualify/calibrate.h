/* Prompts of an exact token count.  The r33 harness labeled prompts with
 * "target" sizes it never measured (117,500 became 87,207 tokens).  Here
 * every candidate is measured the way the server counts it (/tokenize
 * with the very request fields sent later) and adjusted until the count
 * equals the target:
 *
 *   1. the request without filler gives the base count;
 *   2. copies of a coarse filler unit, whose cost per copy is learned
 *      from one probe, are searched (secant steps, then bisection) for
 *      the most copies that stay at or below the target;
 *   3. the small remaining gap is closed with a single-token unit, whose
 *      count is corrected from each measurement, trying the next
 *      candidate unit (or one coarse copy fewer) when one cannot land.
 *
 * Nothing assumes the tokenizer is additive: only measured counts decide.
 * The measure callback builds the whole request around the filler. */
#ifndef QUALIFY_CALIBRATE_H
#define QUALIFY_CALIBRATE_H

#include "strbuf.h"

typedef struct {
    long        n_units;   /* copies of the coarse unit */
    const char *fine;      /* single-token unit, NULL for none */
    long        n_fine;
} calib_fill;

/* Count the tokens of the request built around filler f. */
typedef int (*calib_measure_fn)(void *user, const calib_fill *f, long *tokens, strbuf *err);

typedef struct {
    const char        *unit;          /* coarse unit, e.g. a sentence */
    const char *const *fine_units;    /* NULL-terminated candidates */
    calib_measure_fn   measure;
    void              *user;
    int                max_probes;    /* per target */
    double             unit_cost;     /* tokens per unit; learned once (0 = not yet) */
} calibrator;

typedef struct {
    long       target, actual, base;
    calib_fill fill;
    int        probes;
} calib_result;

/* Default units: a plain English sentence, and short single tokens. */
extern const char calib_default_unit[];
extern const char *const calib_default_fine[];

void calib_init(calibrator *c, calib_measure_fn measure, void *user);

/* Find a filler whose request measures exactly target tokens.  0 with
 * res->actual == target, or -1 with the reason (target below the base,
 * a unit that adds no tokens, no exact landing within max_probes). */
int calibrate(calibrator *c, long target, calib_result *res, strbuf *err);

/* The filler text of f; middle (may be NULL) is inserted after half of
 * the coarse copies (where a needle goes). */
void calib_text(const calibrator *c, const calib_fill *f, const char *middle, strbuf *out);

#endif
