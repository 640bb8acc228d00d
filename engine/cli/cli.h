/* Subcommands of build/bin/llm-engine (ARCHITECTURE.md §6).  Each takes
 * argc/argv with argv[0] = the subcommand name and returns the exit code. */
#ifndef LLM_CLI_H
#define LLM_CLI_H

#include <stddef.h>

int cmd_check(int argc, char **argv);
int cmd_version(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_client(int argc, char **argv);
int cmd_janitor(int argc, char **argv);
int cmd_render(int argc, char **argv);
int cmd_parse(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_bench_tokenizer(int argc, char **argv);
int cmd_bench_mask(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_bench(int argc, char **argv);

/* bench --prefix-repeat NEW (cli_bench_prefix.c): TTFT of a prompt of n
 * tokens cold, then of it plus `fresh` new tokens from the prefix cache's
 * GPU tier and from its host tier, `rounds` times; prints a table. */
struct v4_model;
int bench_prefix(struct v4_model *m, int n, int fresh, int rounds, int chunk);

/* One subcommand: its name, entry point and usage line. */
typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *usage;
} cli_command;

/* The llm-engine dispatcher (cli_main.c): the built-in commands, then the
 * n_extra commands of extra (the test binary adds its own). */
int cli_main(int argc, char **argv, const cli_command *extra, size_t n_extra);

#endif
