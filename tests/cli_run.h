/* Run an llm-engine subcommand of the build under test and capture what
 * it prints (stdout and stderr together): the CLI tests' one helper. */
#ifndef LLM_TESTS_CLI_RUN_H
#define LLM_TESTS_CLI_RUN_H

#include <stdio.h>
#include <sys/wait.h>

#include "strbuf.h"
#include "test_env.h"

/* The exit status of `llm-engine ARGS`, or -1 if it did not exit. */
static inline int engine_cli(const char *args, strbuf *out)
{
    strbuf cmd;
    sb_init(&cmd);
    sb_printf(&cmd, "%s %s 2>&1", build_path("bin/llm-engine"), args);
    FILE *p = popen(cmd.data, "r");
    sb_free(&cmd);
    sb_reset(out);
    if (!p) return -1;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) sb_append(out, buf, n);
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#endif
