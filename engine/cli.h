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

#endif
