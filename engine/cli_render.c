/* llm-engine render --request FILE [--recipe FILE]: an OpenAI chat request
 * in, the exact prompt string out (no added newline).  FILE "-" is stdin.
 * Without a recipe the defaults are chat mode, low effort, drop_thinking. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "chat_render.h"
#include "cli.h"
#include "json.h"
#include "recipe.h"

static const char usage_text[] = "usage: llm-engine render --request FILE [--recipe FILE]\n";

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
        chat_options_from_recipe(d, &r);
    }
    recipe_free(&r);
    sb_free(&errors);
    return n ? -1 : 0;
}

int cmd_render(int argc, char **argv)
{
    const char *request = NULL, *recipe_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--request") && i + 1 < argc) request = argv[++i];
        else if (!strcmp(argv[i], "--recipe") && i + 1 < argc) recipe_path = argv[++i];
        else {
            fprintf(stderr, "render: unexpected argument '%s'\n%s", argv[i], usage_text);
            return 2;
        }
    }
    if (!request) {
        fputs(usage_text, stderr);
        return 2;
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
    else fwrite(p.text.data, 1, p.text.len, stdout);
    chat_prompt_free(&p);
    if (fflush(stdout)) {
        perror("render: stdout");
        return 1;
    }
    return rc ? 1 : 0;
}
