/* Growable byte buffer: the one way engine code builds strings and reads
 * whole files.  Always NUL-terminated after every operation. */
#ifndef LLM_STRBUF_H
#define LLM_STRBUF_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

typedef struct {
    char  *data;
    size_t len;
    size_t cap;
} strbuf;

void sb_init(strbuf *sb);
void sb_free(strbuf *sb);
void sb_reset(strbuf *sb);                   /* len = 0, keep memory */
void sb_reserve(strbuf *sb, size_t extra);   /* aborts on OOM */
void sb_append(strbuf *sb, const void *p, size_t n);
void sb_puts(strbuf *sb, const char *s);
void sb_putc(strbuf *sb, char c);
void sb_printf(strbuf *sb, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void sb_vprintf(strbuf *sb, const char *fmt, va_list ap);
char *sb_steal(strbuf *sb);                  /* caller frees; sb emptied */

/* Write sb's bytes to f (nothing for an empty sb, whose data may be
 * NULL).  Returns 0, or -1 when f took fewer bytes. */
int sb_fwrite(const strbuf *sb, FILE *f);

/* Read a whole file (or stdin when path is "-") into sb.  Returns 0, or -1
 * with errno set. */
int sb_read_file(strbuf *sb, const char *path);

#endif
