/* llm-engine janitor --run-dir DIR: one reclamation scan (janitor.h);
 * run it from a timer.  Prints one JSON line per segment it looked at. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "janitor.h"

static const char usage_text[] = "usage: llm-engine janitor --run-dir DIR\n";

int cmd_janitor(int argc, char **argv)
{
    const char *run_dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--run-dir") && i + 1 < argc) run_dir = argv[++i];
        else {
            fprintf(stderr, "janitor: unexpected argument '%s'\n%s", argv[i], usage_text);
            return 2;
        }
    }
    if (!run_dir) {
        fputs(usage_text, stderr);
        return 2;
    }
    strbuf out, err;
    sb_init(&out);
    sb_init(&err);
    int rc = janitor_scan(run_dir, &out, &err);
    if (out.len) fputs(out.data, stdout);
    if (rc < 0) fprintf(stderr, "janitor: %s\n", err.data);
    sb_free(&out);
    sb_free(&err);
    return rc < 0 ? 1 : 0;
}
