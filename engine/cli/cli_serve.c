/* llm-engine serve --recipe FILE [--run-dir DIR] [--name NAME]
 *
 * --test-runner NAME (not in the usage text) swaps the model runner for a
 * test runner such as "scripted"; it is accepted only by the test binary
 * (build/tests/llm-engine-test), which registers test runners. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "runner.h"
#include "server.h"
#include "ipc/llm_ipc.h"

static const char usage_text[] = "usage: llm-engine serve --recipe FILE [--run-dir DIR] [--name NAME]\n";

int cmd_serve(int argc, char **argv)
{
    server_opts o = { .runner = "model" };
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--recipe") && i + 1 < argc) o.recipe_path = argv[++i];
        else if (!strcmp(argv[i], "--run-dir") && i + 1 < argc) o.run_dir = argv[++i];
        else if (!strcmp(argv[i], "--name") && i + 1 < argc) o.name = argv[++i];
        else if (!strcmp(argv[i], "--test-runner") && i + 1 < argc
                 && runner_have_test_runners())
            o.runner = argv[++i];
        else {
            fprintf(stderr, "serve: unexpected argument '%s'\n%s", argv[i], usage_text);
            return 2;
        }
    }
    if (!o.recipe_path) {
        fputs(usage_text, stderr);
        return 2;
    }
    if (o.name && !llm_ipc_valid_name(o.name, strlen(o.name))) {
        fprintf(stderr, "serve: --name '%s' must be " LLM_IPC_NAME_RULE "\n", o.name);
        return 2;
    }
    return server_run(&o);
}
