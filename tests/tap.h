/* Minimal TAP producer for C tests, run by prove.  Header-only:
 *   plan_tests(n) or done_testing(); ok(cond, fmt, ...); is_int(); is_str();
 *   diag(fmt, ...); skip(n, why); exit_status().
 * A test program returns exit_status() from main. */
#ifndef LLM_TAP_H
#define LLM_TAP_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int tap_run, tap_failed, tap_planned;

static inline void plan_tests(int n) { tap_planned = n; printf("1..%d\n", n); }

static inline void diag(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
static inline void diag(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("# ", stdout);
    vprintf(fmt, ap);
    fputs("\n", stdout);
    va_end(ap);
    fflush(stdout);
}

static inline int tap_vok(int pass, const char *fmt, va_list ap)
{
    tap_run++;
    if (!pass) tap_failed++;
    printf("%sok %d - ", pass ? "" : "not ", tap_run);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    return pass;
}

static inline int ok(int pass, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static inline int ok(int pass, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tap_vok(pass, fmt, ap);
    va_end(ap);
    return pass;
}

#define is_int(got, want, ...) do {                                        \
    long long g_ = (long long)(got), w_ = (long long)(want);              \
    if (!ok(g_ == w_, __VA_ARGS__))                                        \
        diag("  got %lld, want %lld (%s:%d)", g_, w_, __FILE__, __LINE__); \
} while (0)

#define is_str(got, want, ...) do {                                        \
    const char *g_ = (got), *w_ = (want);                                  \
    int p_ = (g_ && w_) ? strcmp(g_, w_) == 0 : g_ == w_;                  \
    if (!ok(p_, __VA_ARGS__))                                              \
        diag("  got \"%s\"\n#   want \"%s\" (%s:%d)", g_ ? g_ : "(null)", \
             w_ ? w_ : "(null)", __FILE__, __LINE__);                      \
} while (0)

static inline void skip(int n, const char *why)
{
    for (int i = 0; i < n; i++) {
        tap_run++;
        printf("ok %d # skip %s\n", tap_run, why);
    }
}

static inline void done_testing(void)
{
    if (!tap_planned) printf("1..%d\n", tap_run);
}

static inline int exit_status(void)
{
    done_testing();
    if (tap_planned && tap_planned != tap_run) return 255;
    return tap_failed > 0 ? 1 : 0;
}

#endif
