#include "jsonw.h"

#include <math.h>
#include <string.h>

#include "json.h"
#include "utf8.h"

void jw_init(jw *w, strbuf *sb)
{
    memset(w, 0, sizeof *w);
    w->sb = sb;
    w->first[0] = true;
}

/* Separator and key before a new value. */
static void jw_key(jw *w, const char *key)
{
    if (!w->first[w->depth]) sb_putc(w->sb, ',');
    w->first[w->depth] = false;
    if (key) {
        json_put_cstr(w->sb, key);
        sb_putc(w->sb, ':');
    }
}

static void jw_open(jw *w, const char *key, char open, char close)
{
    jw_key(w, key);
    sb_putc(w->sb, open);
    if (w->depth + 1 >= JW_DEPTH) return;   /* deeper than any caller nests */
    w->depth++;
    w->first[w->depth] = true;
    w->close[w->depth] = close;
}

void jw_obj(jw *w, const char *key) { jw_open(w, key, '{', '}'); }
void jw_arr(jw *w, const char *key) { jw_open(w, key, '[', ']'); }

void jw_end(jw *w)
{
    if (w->depth == 0) return;
    sb_putc(w->sb, w->close[w->depth]);
    w->depth--;
}

/* Strings here often quote a cut of model output ("%.80s" of a reply)
 * that may end inside a UTF-8 character: repair it, so the status
 * document is always valid JSON. */
void jw_strn(jw *w, const char *key, const char *s, size_t n)
{
    jw_key(w, key);
    if (utf8_valid(s, n, NULL)) {
        json_put_string(w->sb, s, n);
        return;
    }
    strbuf fixed;
    sb_init(&fixed);
    utf8_repair(&fixed, s, n, true);
    json_put_string(w->sb, fixed.data, fixed.len);
    sb_free(&fixed);
}

void jw_str(jw *w, const char *key, const char *s)
{
    if (!s) {
        jw_null(w, key);
        return;
    }
    jw_strn(w, key, s, strlen(s));
}

void jw_int(jw *w, const char *key, long long v)
{
    jw_key(w, key);
    sb_printf(w->sb, "%lld", v);
}

void jw_num(jw *w, const char *key, double v, int decimals)
{
    jw_key(w, key);
    if (!isfinite(v)) sb_puts(w->sb, "null");
    else sb_printf(w->sb, "%.*f", decimals, v);
}

void jw_bool(jw *w, const char *key, bool v)
{
    jw_key(w, key);
    sb_puts(w->sb, v ? "true" : "false");
}

void jw_null(jw *w, const char *key)
{
    jw_key(w, key);
    sb_puts(w->sb, "null");
}

void jw_raw(jw *w, const char *key, const char *json, size_t n)
{
    jw_key(w, key);
    sb_append(w->sb, json, n);
}

void jw_json(jw *w, const char *key, const char *json) { jw_raw(w, key, json, strlen(json)); }
