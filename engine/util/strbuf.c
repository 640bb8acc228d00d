#include "strbuf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sb_init(strbuf *sb) { sb->data = NULL; sb->len = 0; sb->cap = 0; }

void sb_free(strbuf *sb) { free(sb->data); sb_init(sb); }

void sb_reset(strbuf *sb)
{
    sb->len = 0;
    if (sb->data) sb->data[0] = 0;
}

void sb_reserve(strbuf *sb, size_t extra)
{
    size_t need = sb->len + extra + 1;
    if (need <= sb->cap) return;
    size_t cap = sb->cap ? sb->cap : 64;
    while (cap < need) cap *= 2;
    char *p = realloc(sb->data, cap);
    if (!p) { fprintf(stderr, "out of memory (%zu bytes)\n", cap); abort(); }
    p[sb->len] = 0;   /* a fresh buffer is a valid empty string at once */
    sb->data = p;
    sb->cap = cap;
}

void sb_append(strbuf *sb, const void *p, size_t n)
{
    sb_reserve(sb, n);
    if (n) memcpy(sb->data + sb->len, p, n);
    sb->len += n;
    sb->data[sb->len] = 0;
}

void sb_puts(strbuf *sb, const char *s) { sb_append(sb, s, strlen(s)); }

void sb_putc(strbuf *sb, char c) { sb_append(sb, &c, 1); }

void sb_vprintf(strbuf *sb, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) return;
    sb_reserve(sb, (size_t)n);
    vsnprintf(sb->data + sb->len, (size_t)n + 1, fmt, ap);
    sb->len += (size_t)n;
}

void sb_printf(strbuf *sb, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sb_vprintf(sb, fmt, ap);
    va_end(ap);
}

char *sb_steal(strbuf *sb)
{
    if (!sb->data) sb_reserve(sb, 0), sb->data[0] = 0;
    char *p = sb->data;
    sb_init(sb);
    return p;
}

int sb_read_file(strbuf *sb, const char *path)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) return -1;
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) sb_append(sb, buf, n);
    int err = ferror(f) ? errno : 0;
    if (f != stdin) fclose(f);
    sb_reserve(sb, 0);
    if (err) { errno = err; return -1; }
    return 0;
}

int sb_fwrite(const strbuf *sb, FILE *f)
{
    return sb->len && fwrite(sb->data, 1, sb->len, f) != sb->len ? -1 : 0;
}
