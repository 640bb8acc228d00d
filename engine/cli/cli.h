/* Subcommands of build/bin/llm-engine (ARCHITECTURE.md §6).  Each takes
 * argc/argv with argv[0] = the subcommand name and returns the exit code. */
#ifndef LLM_CLI_H
#define LLM_CLI_H

int cmd_check(int argc, char **argv);
int cmd_version(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_client(int argc, char **argv);
int cmd_janitor(int argc, char **argv);
int cmd_bench_ipc(int argc, char **argv);
int cmd_render(int argc, char **argv);
int cmd_parse(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_bench_tokenizer(int argc, char **argv);
int cmd_bench_mask(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_bench(int argc, char **argv);

#endif
