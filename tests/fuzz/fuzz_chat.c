/* libFuzzer harness for the chat renderer and the completion parser (not
 * part of make test):
 *   make fuzz && build/fuzz/fuzz_chat -max_total_time=300
 * First byte: bit 0 picks render (the rest is a request body) or parse (the
 * rest is a completion); the other bits pick modes and the chunking.  Any
 * crash, sanitizer report or abort() below is a bug. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat_render.h"
#include "json.h"
#include "output_parser.h"
#include "utf8.h"

static uint64_t fixed(void *ctx) { (void)ctx; return 12345; }

static void render(const uint8_t *d, size_t n, uint8_t flags)
{
    char err[256];
    yajl_val req = json_parse((const char *)d, n, err, sizeof err);
    if (!req) return;
    chat_options o = { flags & 2, (enum chat_effort)((flags >> 2) % 3), flags & 16 };
    chat_prompt p;
    chat_error e;
    chat_prompt_init(&p);
    if (chat_render_request(req, &o, &p, &e) == 0) {
        size_t at = 0;
        for (size_t i = 0; i < p.n_spans; i++) {
            if (p.spans[i].off != at) abort();
            at += p.spans[i].len;
        }
        if (at != p.text.len || !utf8_valid(p.text.data, p.text.len, NULL)) abort();
    } else if (!e.param[0]) {
        abort();
    }
    chat_prompt_free(&p);
    yajl_tree_free(req);
}

static void parse(const uint8_t *d, size_t n, uint8_t flags, size_t step, parsed_message *m)
{
    parsed_message_init(m);
    output_parser *p = output_parser_new(flags & 2, parsed_message_on_event, m, fixed, NULL);
    for (size_t i = 0; i < n; i += step)
        output_parser_feed(p, (const char *)d + i, i + step <= n ? step : n - i);
    output_parser_finish(p, flags & 4 ? GEN_LENGTH : GEN_STOP);
    output_parser_free(p);
}

static int cmp(const strbuf *a, const strbuf *b)
{
    return a->len != b->len || (a->len && memcmp(a->data, b->data, a->len));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    uint8_t flags = data[0];
    if (!(flags & 1)) {
        render(data + 1, size - 1, flags);
        return 0;
    }
    parsed_message whole, split;
    parse(data + 1, size - 1, flags, size, &whole);
    parse(data + 1, size - 1, flags, 1 + (flags >> 3) % 7, &split);
    if (cmp(&whole.content, &split.content) || cmp(&whole.reasoning, &split.reasoning)
        || whole.n_calls != split.n_calls || whole.finish != split.finish)
        abort();
    for (size_t i = 0; i < whole.n_calls; i++)
        if (cmp(&whole.calls[i].args, &split.calls[i].args)) abort();
    parsed_message_free(&whole);
    parsed_message_free(&split);
    return 0;
}
