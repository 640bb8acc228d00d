/* Randomized tests, bounded to a few seconds (seed: $FUZZ_SEED, default
 * fixed):
 *  - completions assembled from marker pieces, partial markers, stray
 *    bytes and UTF-8: any split parses to the same message, events are well
 *    ordered, deltas are whole UTF-8, arguments are JSON objects, and when
 *    no call was made no text is lost;
 *  - requests mutated byte-wise from valid ones: each either renders
 *    (valid UTF-8, spans covering the prompt, the same prompt twice) or
 *    fails with an error naming a field; never a crash. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat_render.h"
#include "json.h"
#include "output_parser.h"
#include "tap.h"
#include "utf8.h"

#define EOS "<｜end▁of▁sentence｜>"
#define DS "｜DSML｜"

static uint64_t rng_state;

static uint64_t rnd(void *ctx)
{
    uint64_t *s = ctx ? ctx : &rng_state;
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static size_t below(size_t n) { return (size_t)(rnd(NULL) % n); }

static double seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* ---- completions ---- */

static const char *const pieces[] = {
    "</think>", "\n\n<" DS "tool_calls", ">\n", "\n\n<" DS "tool_calls>\n",
    "<" DS "invoke name=\"f\">\n", "<" DS "invoke name=\"get\">\n\n", "</" DS "invoke>\n",
    "</" DS "invoke", "<" DS "parameter name=\"a\" string=\"true\">",
    "<" DS "parameter name=\"b\" string=\"false\">", "</" DS "parameter>\n", "/" DS "parameter",
    "</" DS "tool_calls>", EOS, "<｜end▁of", "<think>", "\n", "\n\n", "<", "｜", "\"", ">",
    " name=\"", "\" string=\"true\">", "{\"x\": [1, 2]}", "42", "true", "hello", "日本",
    "é", "🚀", "\xff", "\xe4\xbd", "\xf0\x9f", "\x80", "\t", "\\", "\x01", " ", "\0",
};

static void random_completion(strbuf *sb)
{
    sb_reset(sb);
    size_t n = 1 + below(40);
    for (size_t i = 0; i < n; i++) {
        const char *p = pieces[below(sizeof pieces / sizeof pieces[0])];
        size_t l = *p ? strlen(p) : 1;   /* "" stands for a NUL byte */
        if (below(6) == 0 && l > 1) l = 1 + below(l - 1);   /* a cut-off piece */
        sb_append(sb, p, l);
    }
}

/* A well-formed answer with tool calls, its expected calls recorded as
 * "name(args)" lines in want (args built the way the reference decodes
 * them: string values as JSON strings, others raw). */
static const char *const names[] = { "f", "get_weather", "a\"b", "日本", "" };
static const char *const texts[] = { "Paris", "", "a \"q\" <b>", "line\nline", "🚀\t\\", "x<y" };
static const char *const raws[] = { "3", "-1.5e3", "true", "null", "[1, {\"k\": \"v\"}]", "{}" };

static void structured_completion(strbuf *sb, strbuf *want, bool thinking)
{
    sb_reset(sb);
    sb_reset(want);
    if (thinking) sb_puts(sb, below(2) ? "Let me see.</think>" : "</think>");
    if (below(2)) sb_puts(sb, "Sure.");
    sb_puts(sb, "\n\n<" DS "tool_calls>\n");
    size_t calls = 1 + below(3);
    for (size_t c = 0; c < calls; c++) {
        const char *name = names[below(sizeof names / sizeof names[0])];
        sb_printf(sb, "<" DS "invoke name=\"%s\">\n", name);
        sb_printf(want, "%s(", name);
        size_t params = below(4);
        sb_putc(want, '{');
        for (size_t k = 0; k < params; k++) {
            char key[32];
            snprintf(key, sizeof key, "p%zu", k);
            bool str = below(2);
            const char *v = str ? texts[below(sizeof texts / sizeof texts[0])]
                                : raws[below(sizeof raws / sizeof raws[0])];
            sb_printf(sb, "<" DS "parameter name=\"%s\" string=\"%s\">%s</" DS "parameter>\n",
                      key, str ? "true" : "false", v);
            if (k) sb_puts(want, ", ");
            json_put_cstr(want, key);
            sb_puts(want, ": ");
            if (str) json_put_cstr(want, v);
            else sb_puts(want, v);
        }
        if (!params) sb_putc(sb, '\n');
        sb_puts(sb, "</" DS "invoke>\n");
        sb_puts(want, "})\n");
    }
    sb_puts(sb, "</" DS "tool_calls>" EOS);
}

typedef struct {
    parsed_message m;
    int open;
    bool ok;
} rec;

static void on_ev(void *ctx, const parse_event *ev)
{
    rec *r = ctx;
    if (r->m.finished) r->ok = false;
    if ((ev->kind == PARSE_REASONING || ev->kind == PARSE_CONTENT || ev->kind == PARSE_TOOL_ARGS)
        && !utf8_valid(ev->text, ev->len, NULL))
        r->ok = false;
    if (ev->kind == PARSE_TOOL_BEGIN) r->open = ev->index;
    if ((ev->kind == PARSE_REASONING || ev->kind == PARSE_CONTENT) && r->open >= 0) r->ok = false;
    if (ev->kind == PARSE_TOOL_END) r->open = -1;
    parsed_message_on_event(&r->m, ev);
}

static void parse_pieces(rec *r, bool thinking, const strbuf *t, enum gen_stop why, int split)
{
    uint64_t ids = 99;
    parsed_message_init(&r->m);
    r->open = -1;
    r->ok = true;
    output_parser *p = output_parser_new(thinking, on_ev, r, rnd, &ids);
    for (size_t i = 0; i < t->len;) {
        size_t n = split == 0 ? t->len : split == 1 ? 1 : 1 + below(12);
        if (n > t->len - i) n = t->len - i;
        output_parser_feed(p, t->data + i, n);
        i += n;
    }
    output_parser_finish(p, why);
    output_parser_free(p);
}

static bool same(const parsed_message *a, const parsed_message *b)
{
    if (a->content.len != b->content.len || a->reasoning.len != b->reasoning.len
        || a->n_calls != b->n_calls || a->finish != b->finish)
        return false;
    if (a->content.len && memcmp(a->content.data, b->content.data, a->content.len)) return false;
    if (a->reasoning.len && memcmp(a->reasoning.data, b->reasoning.data, a->reasoning.len))
        return false;
    for (size_t i = 0; i < a->n_calls; i++)
        if (strcmp(a->calls[i].name, b->calls[i].name) || strcmp(a->calls[i].args.data, b->calls[i].args.data))
            return false;
    return true;
}

/* No call made and no block closed (an empty block vanishes, as in the
 * reference): reasoning and content are the repaired text up to EOS, split
 * at most by one </think>. */
static bool conserved(const parsed_message *m, const strbuf *t)
{
    const char *eos = memmem(t->data, t->len, EOS, strlen(EOS));
    strbuf want, got;
    sb_init(&want);
    sb_init(&got);
    size_t n = eos ? (size_t)(eos - t->data) : t->len;
    for (size_t i = 0, j; i <= n; i = j + 1) {   /* NUL becomes U+FFFD too */
        const char *z = memchr(t->data + i, 0, n - i);
        j = z ? (size_t)(z - t->data) : n;
        utf8_repair(&want, t->data + i, j - i, true);
        if (z) sb_puts(&want, "\xEF\xBF\xBD");
    }
    sb_append(&got, m->reasoning.data, m->reasoning.len);
    sb_append(&got, m->content.data, m->content.len);
    bool good = got.len == want.len && !memcmp(got.data, want.data, got.len);
    if (!good) {
        sb_reset(&got);
        sb_append(&got, m->reasoning.data, m->reasoning.len);
        sb_puts(&got, "</think>");
        sb_append(&got, m->content.data, m->content.len);
        good = got.len == want.len && !memcmp(got.data, want.data, got.len);
    }
    sb_free(&want);
    sb_free(&got);
    return good;
}

static void fuzz_parser(double budget, int *cases, int *with_calls, int *failures)
{
    strbuf t, want;
    sb_init(&t);
    sb_init(&want);
    double end = seconds() + budget;
    while (seconds() < end) {
        bool thinking = below(2);
        bool structured = below(2);
        if (structured) {
            structured_completion(&t, &want, thinking);
            /* Sometimes cut it short or damage a byte: then anything goes
             * but the invariants. */
            if (below(3) == 0) t.len = below(t.len), structured = false;
            else if (below(6) == 0) t.data[below(t.len)] = (char)below(128), structured = false;
        } else {
            random_completion(&t);
        }
        enum gen_stop why = below(2) ? GEN_STOP : GEN_LENGTH;
        rec whole, part;
        parse_pieces(&whole, thinking, &t, why, 0);
        bool good = whole.ok;
        const char *what = "event order or UTF-8";
        for (int split = 1; split < 4 && good; split++) {
            parse_pieces(&part, thinking, &t, why, split);
            good = part.ok && same(&whole.m, &part.m);
            what = "split invariance";
            parsed_message_free(&part.m);
        }
        if (good) what = "arguments JSON";
        for (size_t i = 0; good && i < whole.m.n_calls; i++) {
            char err[128];
            yajl_val v = json_parse(whole.m.calls[i].args.data, whole.m.calls[i].args.len,
                                    err, sizeof err);
            good = v && YAJL_IS_OBJECT(v);
            yajl_tree_free(v);
        }
        if (good) what = "conservation";
        if (good && !whole.m.n_calls && !memmem(t.data, t.len, "</" DS "tool_calls>", strlen("</" DS "tool_calls>")))
            good = conserved(&whole.m, &t);
        if (good) what = "calls of a well-formed answer";
        if (good && structured) {
            strbuf got;
            sb_init(&got);
            for (size_t i = 0; i < whole.m.n_calls; i++)
                sb_printf(&got, "%s(%s)\n", whole.m.calls[i].name, whole.m.calls[i].args.data);
            good = !strcmp(got.data ? got.data : "", want.data) && whole.m.finish == FINISH_TOOL_CALLS
                && !strcmp(whole.m.content.data ? whole.m.content.data : "",
                           strstr(t.data, "Sure.") ? "Sure." : "");
            sb_free(&got);
        }
        if (good) what = "message JSON";
        if (whole.m.n_calls) (*with_calls)++;
        strbuf js;
        sb_init(&js);
        parsed_message_json(&whole.m, &js);
        char err[128];
        yajl_val v = json_parse(js.data, js.len, err, sizeof err);
        good = good && v;
        yajl_tree_free(v);
        sb_free(&js);
        if (!good && (*failures)++ < 3) {
            strbuf q;
            sb_init(&q);
            json_put_string(&q, t.data, t.len);
            diag("parser case failed (%s; thinking %d, %s): %s", what, thinking,
                 why == GEN_STOP ? "stop" : "length", q.data);
            sb_free(&q);
        }
        parsed_message_free(&whole.m);
        (*cases)++;
    }
    sb_free(&t);
    sb_free(&want);
}

/* ---- requests ---- */

static const char *const seeds[] = {
    "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"Hi\"}],"
    "\"chat_template_kwargs\":{\"thinking\":true},\"reasoning_effort\":\"high\"}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"\","
    "\"reasoning_content\":\"r\",\"tool_calls\":[{\"id\":\"a\",\"type\":\"function\",\"function\":"
    "{\"name\":\"f\",\"arguments\":\"{\\\"x\\\": [1, 2.5, \\\"s\\\"]}\"}},{\"id\":\"b\",\"function\":"
    "{\"name\":\"g\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"b\",\"content\":"
    "\"rb\"},{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":[{\"type\":\"text\",\"text\":\"ra\"}]},"
    "{\"role\":\"user\",\"content\":\"next\"}],\"tools\":[{\"type\":\"function\",\"function\":"
    "{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}],\"chat_template_kwargs\":"
    "{\"enable_thinking\":true,\"drop_thinking\":false}}",
    "{\"messages\":[{\"role\":\"developer\",\"content\":\"d\"},{\"role\":\"latest_reminder\","
    "\"content\":\"r\"},{\"role\":\"user\",\"content\":\"u\",\"task\":\"action\"},{\"role\":"
    "\"assistant\",\"content\":\"Search\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\","
    "\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}],\"response_format\":{\"type\":"
    "\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":{}}}}",
};

static const char *const splices[] = {
    "null", "[]", "{}", "\"wizard\"", "\"tool\"", "\"assistant\"", "\"developer\"", "1e999",
    "-0", "true", "\"\"", "\"<｜User｜>\"", "[{\"type\":\"text\",\"text\":\"t\"}]",
    "{\"role\":\"tool\",\"content\":\"x\"}", "\"none\"", "\"max\"", ",", ":", "\"",
};

static void mutate(strbuf *sb)
{
    int n = 1 + (int)below(4);
    for (int k = 0; k < n && sb->len; k++) {
        size_t at = below(sb->len);
        switch (below(4)) {
        case 0: {   /* delete a run */
            size_t del = 1 + below(8);
            if (del > sb->len - at) del = sb->len - at;
            memmove(sb->data + at, sb->data + at + del, sb->len - at - del);
            sb->len -= del;
            break;
        }
        case 1:   /* overwrite a byte with printable ASCII */
            sb->data[at] = (char)(32 + below(95));
            break;
        default: {   /* splice a JSON fragment in */
            const char *s = splices[below(sizeof splices / sizeof splices[0])];
            size_t l = strlen(s);
            sb_reserve(sb, l);
            memmove(sb->data + at + l, sb->data + at, sb->len - at);
            memcpy(sb->data + at, s, l);
            sb->len += l;
        }
        }
        sb->data[sb->len] = 0;
    }
}

static bool spans_ok(const chat_prompt *p, const chat_span *s, size_t n)
{
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i].off != at || !s[i].len) return false;
        at += s[i].len;
    }
    return at == p->text.len;
}

static void fuzz_render(double budget, int *cases, int *rendered, int *failures)
{
    strbuf sb;
    sb_init(&sb);
    const chat_options d = { below(2), CHAT_EFFORT_LOW, true };
    double end = seconds() + budget;
    while (seconds() < end) {
        sb_reset(&sb);
        sb_puts(&sb, seeds[below(sizeof seeds / sizeof seeds[0])]);
        mutate(&sb);
        char perr[256];
        yajl_val req = json_parse(sb.data, sb.len, perr, sizeof perr);
        (*cases)++;
        if (!req) continue;
        chat_prompt p, again;
        chat_error err;
        chat_prompt_init(&p);
        chat_prompt_init(&again);
        memset(&err, 0, sizeof err);
        bool good;
        if (chat_render_request(req, &d, &p, &err) == 0) {
            (*rendered)++;
            good = utf8_valid(p.text.data, p.text.len, NULL)
                && spans_ok(&p, p.origin, p.n_origin) && spans_ok(&p, p.spans, p.n_spans)
                && !strncmp(p.text.data, "<｜begin▁of▁sentence｜>", strlen("<｜begin▁of▁sentence｜>"))
                && chat_render_request(req, &d, &again, &err) == 0
                && again.text.len == p.text.len && !memcmp(again.text.data, p.text.data, p.text.len);
        } else {
            good = err.param[0] && !strncmp(err.message, err.param, strlen(err.param));
        }
        if (!good && (*failures)++ < 3) diag("render case failed: %s (%s)", sb.data, err.message);
        chat_prompt_free(&p);
        chat_prompt_free(&again);
        yajl_tree_free(req);
    }
    sb_free(&sb);
}

int main(void)
{
    const char *seed = getenv("FUZZ_SEED");
    rng_state = seed ? strtoull(seed, NULL, 0) : 0x9e3779b97f4a7c15ull;
    if (!rng_state) rng_state = 1;
    diag("seed %llu", (unsigned long long)rng_state);
    int cases = 0, with_calls = 0, failures = 0;
    fuzz_parser(1.5, &cases, &with_calls, &failures);
    ok(failures == 0 && cases > 100 && with_calls > 10, "%d random completions (%d with calls): "
       "split-invariant, well formed, nothing lost (%d failed)", cases, with_calls, failures);
    int rcases = 0, rendered = 0;
    failures = 0;
    fuzz_render(1.5, &rcases, &rendered, &failures);
    ok(failures == 0 && rendered > 10, "%d mutated requests (%d rendered): valid prompt or "
       "a named error (%d failed)", rcases, rendered, failures);
    return exit_status();
}
