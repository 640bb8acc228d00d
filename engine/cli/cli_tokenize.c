/* llm-engine tokenize / detokenize / bench-tokenizer (ARCHITECTURE.md §6).
 *
 * tokenize: UTF-8 text on stdin -> ids on stdout, separated by single
 * spaces, one newline at the end.  Without --special every added token's
 * spelling is ordinary text.  Input that is not valid UTF-8 is an error
 * naming the byte offset (HF's Python API cannot even receive such input).
 *
 * detokenize: whitespace-separated ids on stdin -> text on stdout (no
 * newline added), special tokens included unless --skip-special; the text
 * is written as it completes, never splitting a UTF-8 character.  A word
 * that is not a number, or an id no token has, is an error (exit 1) after
 * the text of the ids before it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "tokenizer.h"

typedef struct {
    const char *tokenizer, *text;
    bool special, skip_special;
    int repeat;
} tok_args;

/* Whether flag is one of the space-separated words of allowed. */
static bool allowed_flag(const char *allowed, const char *flag)
{
    size_t n = strlen(flag);
    for (const char *p = allowed; (p = strstr(p, flag)); p += n)
        if ((p == allowed || p[-1] == ' ') && (p[n] == ' ' || p[n] == 0)) return true;
    return false;
}

/* Parse the flags a command allows (listed in `allowed`). */
static int parse_args(const char *cmd, const char *usage, const char *allowed, int argc,
                      char **argv, tok_args *a)
{
    *a = (tok_args){ .repeat = 5 };
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        bool takes_value = !strcmp(f, "--tokenizer") || !strcmp(f, "--text") || !strcmp(f, "--repeat");
        if (!allowed_flag(allowed, f) || (takes_value && i + 1 >= argc)) {
            fprintf(stderr, "%s: unexpected argument '%s'\nusage: %s\n", cmd, f, usage);
            return 2;
        }
        if (!strcmp(f, "--tokenizer")) a->tokenizer = argv[++i];
        else if (!strcmp(f, "--text")) a->text = argv[++i];
        else if (!strcmp(f, "--repeat")) a->repeat = atoi(argv[++i]);
        else if (!strcmp(f, "--special")) a->special = true;
        else if (!strcmp(f, "--skip-special")) a->skip_special = true;
    }
    if (!a->tokenizer || (allowed_flag(allowed, "--text") && !a->text) || a->repeat < 1) {
        fprintf(stderr, "usage: %s\n", usage);
        return 2;
    }
    return 0;
}

static tokenizer *load(const char *cmd, const char *path)
{
    char err[1024];
    tokenizer *t = tok_load(path, err, sizeof err);
    if (!t) fprintf(stderr, "%s: %s\n", cmd, err);
    return t;
}

/* Parse the flags, then read the input (the --text file, or stdin) into
 * in.  0, or the exit status: 2 for a usage error, 1 for unreadable input. */
static int start(const char *cmd, const char *usage, const char *allowed, int argc, char **argv,
                 tok_args *a, strbuf *in)
{
    sb_init(in);
    int rc = parse_args(cmd, usage, allowed, argc, argv, a);
    if (rc) return rc;
    const char *path = a->text ? a->text : "-";
    if (sb_read_file(in, path) == 0) return 0;
    fprintf(stderr, "%s: %s: %s\n", cmd, strcmp(path, "-") ? path : "stdin", strerror(errno));
    return 1;
}

int cmd_tokenize(int argc, char **argv)
{
    static const char usage[] = "llm-engine tokenize --tokenizer FILE [--special] < text";
    tok_args a;
    strbuf text;
    int rc = start("tokenize", usage, "--tokenizer --special", argc, argv, &a, &text);
    if (rc) return rc;
    size_t bad = utf8_valid_prefix(text.data, text.len);
    if (bad != text.len) {
        fprintf(stderr, "tokenize: stdin: invalid UTF-8 at byte offset %zu (byte 0x%02X)\n", bad,
                (unsigned char)text.data[bad]);
        sb_free(&text);
        return 1;
    }
    tokenizer *t = load("tokenize", a.tokenizer);
    if (!t) { sb_free(&text); return 1; }
    tok_ids ids = { 0 };
    rc = tok_encode(t, text.data, text.len, a.special, &ids);
    if (rc) {
        fprintf(stderr, "tokenize: %s\n", tok_strerror(rc));
    } else {
        strbuf out;
        sb_init(&out);
        for (size_t i = 0; i < ids.len; i++) sb_printf(&out, i ? " %d" : "%d", ids.data[i]);
        sb_putc(&out, '\n');
        sb_fwrite(&out, stdout);
        sb_free(&out);
    }
    tok_ids_free(&ids);
    tok_free(t);
    sb_free(&text);
    return rc ? 1 : 0;
}

int cmd_detokenize(int argc, char **argv)
{
    static const char usage[] = "llm-engine detokenize --tokenizer FILE [--skip-special] < ids";
    tok_args a;
    strbuf in;
    int rc = start("detokenize", usage, "--tokenizer --skip-special", argc, argv, &a, &in);
    if (rc) return rc;
    tokenizer *t = load("detokenize", a.tokenizer);
    if (!t) { sb_free(&in); return 1; }
    tok_stream s;
    tok_stream_init(&s, t, a.skip_special);
    strbuf out;
    sb_init(&out);
    size_t i = 0, count = 0;
    rc = 0;
    while (!rc) {
        while (i < in.len && strchr(" \t\r\n\f\v", in.data[i])) i++;
        if (i == in.len) break;
        size_t start = i;
        while (i < in.len && !strchr(" \t\r\n\f\v", in.data[i])) i++;
        char *end;
        errno = 0;
        long id = strtol(in.data + start, &end, 10);
        count++;
        if (end != in.data + i || errno || in.data[start] == '+') {
            fprintf(stderr, "detokenize: stdin: \"%.*s\" at byte offset %zu is not a token id\n",
                    (int)(i - start), in.data + start, start);
            rc = 1;
        } else if (id < 0 || id >= tok_vocab_size(t) || tok_stream_push(&s, (int32_t)id, &out)) {
            fprintf(stderr, "detokenize: id %ld (number %zu on stdin) is not in %s (ids 0..%d)\n",
                    id, count, a.tokenizer, tok_vocab_size(t) - 1);
            rc = 1;
        }
        /* Stream complete text out as it forms. */
        sb_fwrite(&out, stdout);
        sb_reset(&out);
    }
    if (!rc) {
        tok_stream_finish(&s, &out);
        sb_fwrite(&out, stdout);
    }
    sb_free(&out);
    sb_free(&in);
    tok_free(t);
    return rc;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int cmd_bench_tokenizer(int argc, char **argv)
{
    static const char usage[] =
        "llm-engine bench-tokenizer --tokenizer FILE --text FILE [--repeat N] [--special]";
    tok_args a;
    strbuf text;
    int rc = start("bench-tokenizer", usage, "--tokenizer --text --repeat --special", argc, argv,
                   &a, &text);
    if (rc) return rc;
    double t0 = now_ms();
    tokenizer *t = load("bench-tokenizer", a.tokenizer);
    if (!t) { sb_free(&text); return 1; }
    double load_ms = now_ms() - t0;
    double *enc = calloc((size_t)a.repeat, sizeof *enc), *dec = calloc((size_t)a.repeat, sizeof *dec);
    tok_ids ids = { 0 };
    strbuf out;
    sb_init(&out);
    for (int r = 0; r < a.repeat && !rc; r++) {
        ids.len = 0;
        t0 = now_ms();
        rc = tok_encode(t, text.data, text.len, a.special, &ids);
        enc[r] = now_ms() - t0;
        sb_reset(&out);
        size_t bad;
        t0 = now_ms();
        tok_decode(t, ids.data, ids.len, false, &out, &bad);
        dec[r] = now_ms() - t0;
    }
    if (rc) {
        fprintf(stderr, "bench-tokenizer: %s: %s\n", a.text, tok_strerror(rc));
    } else {
        qsort(enc, (size_t)a.repeat, sizeof *enc, cmp_double);
        qsort(dec, (size_t)a.repeat, sizeof *dec, cmp_double);
        double mb = (double)text.len / 1e6, med = enc[a.repeat / 2];
        printf("tokenizer   %s (%d ids), loaded in %.0f ms\n", a.tokenizer, tok_vocab_size(t), load_ms);
        printf("text        %s: %zu bytes -> %zu tokens (%.2f bytes/token)%s\n", a.text, text.len,
               ids.len, (double)text.len / (double)(ids.len ? ids.len : 1),
               a.special ? ", special tokens on" : "");
        printf("encode      median %.2f ms, best %.2f ms over %d runs (1 thread)\n", med, enc[0], a.repeat);
        printf("            %.1f MB/s, %.0f tokens/s\n", mb / (med / 1e3), (double)ids.len / (med / 1e3));
        printf("decode      median %.2f ms (%.1f MB/s)\n", dec[a.repeat / 2],
               (double)out.len / 1e6 / (dec[a.repeat / 2] / 1e3));
        printf("round trip  %s\n", out.len == text.len && !memcmp(out.data, text.data, text.len)
                                       ? "decode(encode(text)) == text" : "DIFFERS");
    }
    free(enc);
    free(dec);
    sb_free(&out);
    tok_ids_free(&ids);
    tok_free(t);
    sb_free(&text);
    return rc ? 1 : 0;
}
