/* llm-engine render --request FILE [--recipe FILE] [--model DIR --ids]:
 * an OpenAI chat request in, the exact prompt string out (no added
 * newline).  FILE "-" is stdin.  Without a recipe the defaults are chat
 * mode, low effort, drop_thinking.  With --ids (and --model DIR, whose
 * tokenizer.json is used, or --tokenizer FILE) it prints instead, as one
 * JSON line, the prompt's token ids as the engine encodes them (special
 * tokens only where the template wrote them), their count and the prompt
 * fingerprint (SHA-256 of the ids, engine/text/fingerprint.h). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "chat_encode.h"
#include "chat_render.h"
#include "cli.h"
#include "fingerprint.h"
#include "json.h"
#include "recipe.h"

static const char usage_text[] =
    "usage: llm-engine render --request FILE [--recipe FILE] "
    "[--model DIR | --tokenizer FILE] [--ids]\n";

/* {"prompt_tokens": N, "fingerprint": "hex", "ids": [...]} */
static int print_ids(const char *tok_path, const chat_prompt *p)
{
    char err[1024];
    tokenizer *t = tok_load(tok_path, err, sizeof err);
    if (!t) {
        fprintf(stderr, "render: %s\n", err);
        return 1;
    }
    tok_ids ids = { 0 };
    int rc = chat_prompt_encode(t, p, &ids);
    if (rc != TOK_OK) {
        fprintf(stderr, "render: cannot tokenize the prompt: %s\n", tok_strerror(rc));
    } else {
        prompt_fingerprint fp;
        prompt_fingerprint_ids(ids.data, ids.len, &fp);
        strbuf out;
        sb_init(&out);
        sb_printf(&out, "{\"prompt_tokens\":%zu,\"fingerprint\":\"%s\",\"ids\":[", ids.len, fp.hex);
        for (size_t i = 0; i < ids.len; i++) sb_printf(&out, "%s%d", i ? "," : "", ids.data[i]);
        sb_puts(&out, "]}\n");
        sb_fwrite(&out, stdout);
        sb_free(&out);
    }
    tok_ids_free(&ids);
    tok_free(t);
    return rc == TOK_OK ? 0 : 1;
}

/* The recipe's default_chat_template_kwargs become the request defaults. */
static int defaults_from_recipe(const char *path, chat_options *d)
{
    recipe r;
    strbuf errors;
    sb_init(&errors);
    int n = recipe_load(&r, path, &errors);
    if (n) {
        fputs(errors.data, stderr);
    } else {
        recipe_chat_options(&r, d);
    }
    recipe_free(&r);
    sb_free(&errors);
    return n ? -1 : 0;
}

int cmd_render(int argc, char **argv)
{
    const char *request = NULL, *recipe_path = NULL, *model = NULL, *tok_path = NULL;
    bool want_ids = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--request") && i + 1 < argc) request = argv[++i];
        else if (!strcmp(argv[i], "--recipe") && i + 1 < argc) recipe_path = argv[++i];
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) tok_path = argv[++i];
        else if (!strcmp(argv[i], "--ids")) want_ids = true;
        else {
            fprintf(stderr, "render: unexpected argument '%s'\n%s", argv[i], usage_text);
            return 2;
        }
    }
    if (!request || want_ids != (model || tok_path)) {
        if (request) fputs("render: --ids needs --model DIR or --tokenizer FILE, and they need --ids\n", stderr);
        fputs(usage_text, stderr);
        return 2;
    }
    char tok_buf[4096];
    if (model) {
        snprintf(tok_buf, sizeof tok_buf, "%s/tokenizer.json", model);
        tok_path = tok_buf;
    }
    chat_options defaults = { .thinking = false, .effort = CHAT_EFFORT_LOW,
                              .drop_thinking = true };
    if (recipe_path && defaults_from_recipe(recipe_path, &defaults)) return 1;

    strbuf body;
    sb_init(&body);
    if (sb_read_file(&body, request)) {
        fprintf(stderr, "render: %s: %s\n", request, strerror(errno));
        sb_free(&body);
        return 1;
    }
    char perr[256];
    yajl_val req = json_parse(body.data, body.len, perr, sizeof perr);
    sb_free(&body);
    if (!req) {
        fprintf(stderr, "render: %s: invalid JSON: %s\n", request, perr);
        return 1;
    }
    chat_prompt p;
    chat_error err;
    chat_prompt_init(&p);
    int rc = chat_render_request(req, &defaults, &p, &err);
    yajl_tree_free(req);
    if (rc) fprintf(stderr, "render: %s: %s\n", request, err.message);
    else if (want_ids) rc = print_ids(tok_path, &p);
    else sb_fwrite(&p.text, stdout);
    chat_prompt_free(&p);
    if (fflush(stdout)) {
        perror("render: stdout");
        return 1;
    }
    return rc ? 1 : 0;
}
