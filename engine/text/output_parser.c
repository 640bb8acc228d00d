/* The completion parser.  Two stages:
 *   input: cut the stream at the first EOS and repair UTF-8, holding back
 *          a possible EOS prefix and an unfinished character;
 *   core:  split clean text into reasoning, content and DSML tool calls.
 * The DSML grammar is the reference parser's (DeepSeek's
 * parse_message_from_completion_text), including its regular expressions'
 * corner cases; where the reference raises, we degrade instead. */
#include "output_parser.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "utf8.h"

#define EOS "<｜end▁of▁sentence｜>"
#define THINK_END "</think>"
#define DSML "｜DSML｜"
#define OPENER "\n\n<" DSML "tool_calls"
#define INVOKE "<" DSML "invoke"
#define INVOKE_END "</" DSML "invoke"
#define PARAM "<" DSML "parameter"
#define PARAM_END "/" DSML "parameter"
#define BLOCK_END "</" DSML "tool_calls>"

enum state { S_REASONING, S_CONTENT, S_TOOLS, S_RAW };

/* Where we are inside a DSML block: what the text must continue with. */
enum block_state {
    B_START,        /* ">\n" after the opener */
    B_NEXT,         /* an invoke, or the end of the block */
    B_HEADER,       /* ' name="NAME">\n' up to the first parameter or invoke end */
    B_PARAM,        /* ' name="K" string="true|false">VALUE<' up to PARAM_END */
    B_PARAM_SEP,    /* ">\n" and another parameter or the invoke end */
    B_INVOKE_END,   /* ">\n" closing the invoke */
};

typedef struct {
    char *name, *value;
    bool  is_string;
} param;

struct output_parser {
    enum state st;
    parse_event_fn on_event;
    void *ctx;
    parse_rand_fn rand;
    void *rand_ctx;

    strbuf in;          /* raw bytes not yet past the input stage */
    bool eos;           /* EOS seen: ignore the rest */
    bool finished;
    strbuf pend;        /* clean text the core has not resolved */

    /* DSML block: pend holds its text from the first byte not yet part of
     * an emitted call; parsing is at bpos, marker searches resume at scan. */
    enum block_state bs;
    size_t bpos, scan;
    char  *name;        /* current invoke */
    param *params;
    size_t n_params, cap_params;

    int    n_calls;
    char (*ids)[32];    /* ids given so far, to keep them unique */
};

/* ---- small helpers ---- */

static void emit_text(output_parser *p, enum parse_event_kind k, const char *s, size_t n)
{
    if (!n) return;
    parse_event ev = { .kind = k, .text = s, .len = n };
    p->on_event(p->ctx, &ev);
}

static void consume(strbuf *sb, size_t n)
{
    memmove(sb->data, sb->data + n, sb->len - n);
    sb->len -= n;
    sb->data[sb->len] = 0;
}

/* Offset of needle in s[from .. n), or n. */
static size_t find(const char *s, size_t from, size_t n, const char *needle)
{
    size_t l = strlen(needle);
    if (n < l) return n;
    const char *hit = memmem(s + from, n - from, needle, l);
    return hit ? (size_t)(hit - s) : n;
}

/* Length of the longest proper prefix of marker that ends s[0..n). */
static size_t partial_suffix(const char *s, size_t n, const char *marker)
{
    size_t l = strlen(marker);
    for (size_t k = l - 1 < n ? l - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, marker, k)) return k;
    return 0;
}

static bool ends_with(const char *s, size_t n, const char *suffix)
{
    size_t l = strlen(suffix);
    return n >= l && !memcmp(s + n - l, suffix, l);
}

/* Python's \s for str patterns: bytes of one whitespace character at s, or 0. */
static size_t py_space(const char *s, size_t n)
{
    static const char *const wide[] = {
        "\xc2\x85", "\xc2\xa0", "\xe1\x9a\x80", "\xe2\x80\xa8", "\xe2\x80\xa9",
        "\xe2\x80\xaf", "\xe2\x81\x9f", "\xe3\x80\x80",
    };
    unsigned char c = (unsigned char)s[0];
    if (c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f)) return 1;
    if (c < 0x80) return 0;
    if (n >= 3 && c == 0xe2 && (unsigned char)s[1] == 0x80
        && (unsigned char)s[2] >= 0x80 && (unsigned char)s[2] <= 0x8a)
        return 3;   /* U+2000 .. U+200A */
    for (size_t i = 0; i < sizeof wide / sizeof wide[0]; i++) {
        size_t l = strlen(wide[i]);
        if (n >= l && !memcmp(s, wide[i], l)) return l;
    }
    return 0;
}

static char *dup_range(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (!d) abort();
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

/* ---- tool calls ---- */

static void reset_invoke(output_parser *p)
{
    free(p->name);
    p->name = NULL;
    for (size_t i = 0; i < p->n_params; i++) {
        free(p->params[i].name);
        free(p->params[i].value);
    }
    p->n_params = 0;
}

static void new_call_id(output_parser *p, char id[32])
{
    static const char alnum[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    for (int attempt = 0;; attempt++) {
        memcpy(id, "call_", 5);
        for (int i = 0; i < 24; i++) id[5 + i] = alnum[p->rand(p->rand_ctx) % 62];
        id[29] = 0;
        int k = 0;
        while (k < p->n_calls && strcmp(p->ids[k], id)) k++;
        if (k == p->n_calls) return;
        if (attempt == 8) {   /* a degenerate source: make it unique anyway */
            snprintf(id + 24, 8, "%d", p->n_calls % 100000);
            return;
        }
    }
}

/* A string="false" value goes in raw when it is JSON (as the reference
 * does); anything else is passed on as a JSON string. */
static void put_raw_value(strbuf *sb, const char *v)
{
    char err[64];
    yajl_val t = json_parse(v, strlen(v), err, sizeof err);
    if (t) sb_puts(sb, v);
    else json_put_cstr(sb, v);
    yajl_tree_free(t);
}

static void commit_invoke(output_parser *p)
{
    strbuf args;
    sb_init(&args);
    sb_putc(&args, '{');
    for (size_t i = 0; i < p->n_params; i++) {
        if (i) sb_puts(&args, ", ");
        json_put_cstr(&args, p->params[i].name);
        sb_puts(&args, ": ");
        if (p->params[i].is_string) json_put_cstr(&args, p->params[i].value);
        else put_raw_value(&args, p->params[i].value);
    }
    sb_putc(&args, '}');

    p->ids = realloc(p->ids, (size_t)(p->n_calls + 1) * sizeof *p->ids);
    if (!p->ids) abort();
    new_call_id(p, p->ids[p->n_calls]);
    int index = p->n_calls++;
    parse_event ev = { .kind = PARSE_TOOL_BEGIN, .index = index,
                       .id = p->ids[index], .name = p->name };
    p->on_event(p->ctx, &ev);
    ev = (parse_event){ .kind = PARSE_TOOL_ARGS, .index = index,
                        .text = args.data, .len = args.len };
    p->on_event(p->ctx, &ev);
    ev = (parse_event){ .kind = PARSE_TOOL_END, .index = index };
    p->on_event(p->ctx, &ev);
    sb_free(&args);
    reset_invoke(p);
}

/* ^\s*name="(.*?)">\n$ (Python: $ also matches before a final newline,
 * which is how a call without parameters, rendered ">\n\n</invoke", parses). */
static bool parse_header(output_parser *p, const char *h, size_t n)
{
    size_t i = 0, w;
    while (i < n && (w = py_space(h + i, n - i))) i += w;
    if (n - i < 6 || memcmp(h + i, "name=\"", 6)) return false;
    i += 6;
    size_t end;
    if (n - i >= 3 && ends_with(h, n, "\">\n")) end = n - 3;
    else if (n - i >= 4 && ends_with(h, n, "\">\n\n")) end = n - 4;
    else return false;
    p->name = dup_range(h + i, end - i);
    return true;
}

/* ^ name="(.*?)" string="(true|false)">(.*?)<$ over the text between the
 * parameter tag and PARAM_END; duplicate names are malformed. */
static bool parse_param(output_parser *p, const char *s, size_t n)
{
    if (n < 7 || memcmp(s, " name=\"", 7)) return false;
    size_t t = find(s, 7, n, "\" string=\"true\">");
    size_t f = find(s, 7, n, "\" string=\"false\">");
    bool is_string = t <= f;
    size_t name_end = is_string ? t : f;
    if (name_end == n) return false;
    size_t v = name_end + (is_string ? 16 : 17);
    size_t vend;
    if (n - v >= 1 && s[n - 1] == '<') vend = n - 1;
    else if (n - v >= 2 && ends_with(s, n, "<\n")) vend = n - 2;
    else return false;
    for (size_t i = 0; i < p->n_params; i++)
        if (strlen(p->params[i].name) == name_end - 7
            && !memcmp(p->params[i].name, s + 7, name_end - 7))
            return false;
    if (p->n_params == p->cap_params) {
        p->cap_params = p->cap_params ? 2 * p->cap_params : 8;
        p->params = realloc(p->params, p->cap_params * sizeof *p->params);
        if (!p->params) abort();
    }
    p->params[p->n_params++] = (param){ dup_range(s + 7, name_end - 7),
                                        dup_range(s + v, vend - v), is_string };
    return true;
}

/* Text at pos must continue with one of two literals: returns 0 or 1 for
 * the one it starts with, -1 when more text is needed, -2 when neither
 * can match. */
static int expect(const strbuf *sb, size_t pos, const char *a, const char *b, bool final)
{
    const char *lit[2] = { a, b };
    size_t avail = sb->len - pos;
    bool could = false;
    for (int i = 0; i < 2 && lit[i]; i++) {
        size_t l = strlen(lit[i]);
        size_t k = avail < l ? avail : l;
        if (memcmp(sb->data + pos, lit[i], k)) continue;
        if (k == l) return i;
        could = true;
    }
    return could && !final ? -1 : -2;
}

/* Could text s[0..n) still be the start of what the pattern expects?
 * (lead: optional Python whitespace before it) */
static bool may_start(const char *s, size_t n, const char *lit, bool lead_space)
{
    size_t i = 0, w;
    if (lead_space)
        while (i < n && (w = py_space(s + i, n - i))) i += w;
    size_t l = strlen(lit), k = n - i < l ? n - i : l;
    return !memcmp(s + i, lit, k);
}

/* Advance through the DSML block.  Returns true when the state changed
 * (block done or malformed) so the caller continues with the new state. */
static bool block_step(output_parser *p, bool final)
{
    strbuf *b = &p->pend;
    for (;;) {
        int r;
        size_t m1, m2, m;
        switch (p->bs) {
        case B_START:
        case B_INVOKE_END:
            r = expect(b, p->bpos, ">\n", NULL, final);
            if (r == -1) return false;
            if (r == -2) goto malformed;
            p->bpos += 2;
            if (p->bs == B_INVOKE_END) {
                commit_invoke(p);
                consume(b, p->bpos);
                p->bpos = 0;
            }
            p->bs = B_NEXT;
            break;
        case B_NEXT:
            r = expect(b, p->bpos, INVOKE, BLOCK_END, final);
            if (r == -1) return false;
            if (r == -2) goto malformed;
            if (r == 1) {   /* block complete: back to content */
                consume(b, p->bpos + strlen(BLOCK_END));
                p->bpos = 0;
                p->st = S_CONTENT;
                return true;
            }
            p->bpos += strlen(INVOKE);
            p->scan = p->bpos;
            p->bs = B_HEADER;
            break;
        case B_HEADER:
            m1 = find(b->data, p->scan, b->len, PARAM);
            m2 = find(b->data, p->scan, b->len, INVOKE_END);
            m = m1 < m2 ? m1 : m2;
            if (m == b->len) {
                if (final || !may_start(b->data + p->bpos, b->len - p->bpos, "name=\"", true))
                    goto malformed;
                p->scan = b->len > strlen(PARAM) ? b->len - strlen(PARAM) : p->bpos;
                if (p->scan < p->bpos) p->scan = p->bpos;
                return false;
            }
            if (!parse_header(p, b->data + p->bpos, m - p->bpos)) goto malformed;
            p->bpos = m + (m == m1 ? strlen(PARAM) : strlen(INVOKE_END));
            p->scan = p->bpos;
            p->bs = m == m1 ? B_PARAM : B_INVOKE_END;
            break;
        case B_PARAM:
            m = find(b->data, p->scan, b->len, PARAM_END);
            if (m == b->len) {
                if (final || !may_start(b->data + p->bpos, b->len - p->bpos, " name=\"", false))
                    goto malformed;
                p->scan = b->len > strlen(PARAM_END) ? b->len - strlen(PARAM_END) : p->bpos;
                if (p->scan < p->bpos) p->scan = p->bpos;
                return false;
            }
            if (!parse_param(p, b->data + p->bpos, m - p->bpos)) goto malformed;
            p->bpos = m + strlen(PARAM_END);
            p->bs = B_PARAM_SEP;
            break;
        case B_PARAM_SEP:
            r = expect(b, p->bpos, ">\n" PARAM, ">\n" INVOKE_END, final);
            if (r == -1) return false;
            if (r == -2) goto malformed;
            p->bpos += strlen(r == 0 ? ">\n" PARAM : ">\n" INVOKE_END);
            p->scan = p->bpos;
            p->bs = r == 0 ? B_PARAM : B_INVOKE_END;
            break;
        }
    }
malformed:
    /* Everything not yet committed, and all that follows, is content. */
    reset_invoke(p);
    emit_text(p, PARSE_CONTENT, b->data, b->len);
    sb_reset(b);
    p->bpos = 0;
    p->st = S_RAW;
    return true;
}

/* ---- core: reasoning, content, tool blocks ---- */

static void core_step(output_parser *p, bool final)
{
    strbuf *b = &p->pend;
    for (;;) {
        if (p->st == S_TOOLS) {
            if (!block_step(p, final)) return;
            continue;
        }
        if (p->st == S_RAW) {
            emit_text(p, PARSE_CONTENT, b->data, b->len);
            sb_reset(b);
            return;
        }
        bool reasoning = p->st == S_REASONING;
        enum parse_event_kind kind = reasoning ? PARSE_REASONING : PARSE_CONTENT;
        size_t opener = find(b->data, 0, b->len, OPENER);
        size_t think = reasoning ? find(b->data, 0, b->len, THINK_END) : b->len;
        if (think < opener) {
            emit_text(p, kind, b->data, think);
            consume(b, think + strlen(THINK_END));
            p->st = S_CONTENT;
            continue;
        }
        if (opener < b->len) {
            /* A tool block; before </think> it also ends the reasoning. */
            emit_text(p, kind, b->data, opener);
            consume(b, opener);
            p->st = S_TOOLS;
            p->bs = B_START;
            p->bpos = strlen(OPENER);
            continue;
        }
        size_t hold = 0;
        if (!final) {
            hold = partial_suffix(b->data, b->len, OPENER);
            size_t h2 = reasoning ? partial_suffix(b->data, b->len, THINK_END) : 0;
            if (h2 > hold) hold = h2;
        }
        emit_text(p, kind, b->data, b->len - hold);
        consume(b, b->len - hold);
        return;
    }
}

/* ---- input stage ---- */

/* Move in[0..n) to the core as well-formed UTF-8.  NUL bytes become
 * U+FFFD too: they are never text, and names and values travel as C
 * strings. */
static void pass_clean(output_parser *p, size_t n, bool final)
{
    const char *nul;
    while ((nul = memchr(p->in.data, 0, n))) {
        size_t k = (size_t)(nul - p->in.data);
        utf8_repair(&p->pend, p->in.data, k, true);
        sb_puts(&p->pend, "\xEF\xBF\xBD");
        consume(&p->in, k + 1);
        n -= k + 1;
    }
    size_t used = utf8_repair(&p->pend, p->in.data, n, final);
    consume(&p->in, used);
    core_step(p, false);
}

output_parser *output_parser_new(bool thinking, parse_event_fn on_event, void *ctx,
                                 parse_rand_fn rand, void *rand_ctx)
{
    output_parser *p = calloc(1, sizeof *p);
    if (!p) abort();
    p->st = thinking ? S_REASONING : S_CONTENT;
    p->on_event = on_event;
    p->ctx = ctx;
    p->rand = rand;
    p->rand_ctx = rand_ctx;
    sb_init(&p->in);
    sb_init(&p->pend);
    sb_reserve(&p->in, 64);
    sb_reserve(&p->pend, 64);
    return p;
}

void output_parser_feed(output_parser *p, const char *text, size_t len)
{
    if (p->eos || p->finished || !len) return;
    sb_append(&p->in, text, len);
    size_t e = find(p->in.data, 0, p->in.len, EOS);
    if (e < p->in.len) {
        p->eos = true;
        p->in.len = e;
        pass_clean(p, e, true);
        sb_reset(&p->in);
        return;
    }
    pass_clean(p, p->in.len - partial_suffix(p->in.data, p->in.len, EOS), false);
}

void output_parser_finish(output_parser *p, enum gen_stop why)
{
    if (p->finished) return;
    p->finished = true;
    if (p->in.len) pass_clean(p, p->in.len, true);
    core_step(p, true);
    parse_event ev = { .kind = PARSE_FINISH };
    if (why == GEN_LENGTH && !p->eos) ev.finish = FINISH_LENGTH;
    else ev.finish = p->n_calls ? FINISH_TOOL_CALLS : FINISH_STOP;
    p->on_event(p->ctx, &ev);
}

void output_parser_free(output_parser *p)
{
    if (!p) return;
    reset_invoke(p);
    free(p->params);
    free(p->ids);
    sb_free(&p->in);
    sb_free(&p->pend);
    free(p);
}

/* ---- the final message ---- */

void parsed_message_init(parsed_message *m)
{
    memset(m, 0, sizeof *m);
    sb_init(&m->content);
    sb_init(&m->reasoning);
}

void parsed_message_free(parsed_message *m)
{
    sb_free(&m->content);
    sb_free(&m->reasoning);
    for (size_t i = 0; i < m->n_calls; i++) {
        free(m->calls[i].id);
        free(m->calls[i].name);
        sb_free(&m->calls[i].args);
    }
    free(m->calls);
    parsed_message_init(m);
}

void parsed_message_on_event(void *ctx, const parse_event *ev)
{
    parsed_message *m = ctx;
    switch (ev->kind) {
    case PARSE_REASONING: sb_append(&m->reasoning, ev->text, ev->len); break;
    case PARSE_CONTENT: sb_append(&m->content, ev->text, ev->len); break;
    case PARSE_TOOL_BEGIN:
        if (m->n_calls == m->cap_calls) {
            m->cap_calls = m->cap_calls ? 2 * m->cap_calls : 4;
            m->calls = realloc(m->calls, m->cap_calls * sizeof *m->calls);
            if (!m->calls) abort();
        }
        m->calls[m->n_calls].id = dup_range(ev->id, strlen(ev->id));
        m->calls[m->n_calls].name = dup_range(ev->name, strlen(ev->name));
        sb_init(&m->calls[m->n_calls].args);
        m->n_calls++;
        break;
    case PARSE_TOOL_ARGS: sb_append(&m->calls[ev->index].args, ev->text, ev->len); break;
    case PARSE_TOOL_END: break;
    case PARSE_FINISH: m->finish = ev->finish; m->finished = true; break;
    }
}

/* The reference parser's shape: empty text is "", not null (the HTTP
 * layer applies OpenAI's null-content rule itself). */
void parsed_message_json(const parsed_message *m, strbuf *out)
{
    sb_puts(out, "{\"role\":\"assistant\",\"content\":");
    json_put_string(out, m->content.data ? m->content.data : "", m->content.len);
    sb_puts(out, ",\"reasoning_content\":");
    json_put_string(out, m->reasoning.data ? m->reasoning.data : "", m->reasoning.len);
    sb_puts(out, ",\"tool_calls\":[");
    for (size_t i = 0; i < m->n_calls; i++) {
        const parsed_call *c = &m->calls[i];
        if (i) sb_putc(out, ',');
        sb_puts(out, "{\"id\":");
        json_put_cstr(out, c->id);
        sb_puts(out, ",\"type\":\"function\",\"function\":{\"name\":");
        json_put_cstr(out, c->name);
        sb_puts(out, ",\"arguments\":");
        json_put_string(out, c->args.data ? c->args.data : "", c->args.len);
        sb_puts(out, "}}");
    }
    sb_puts(out, "]}");
}

const char *finish_reason_name(enum finish_reason r)
{
    switch (r) {
    case FINISH_STOP: return "stop";
    case FINISH_LENGTH: return "length";
    case FINISH_TOOL_CALLS: return "tool_calls";
    }
    return "stop";
}
