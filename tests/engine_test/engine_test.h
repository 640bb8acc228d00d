/* What tests/engine_test/ adds to llm-engine for the test binary. */
#ifndef LLM_ENGINE_TEST_H
#define LLM_ENGINE_TEST_H

#include "cli.h"
#include "runner.h"

extern const runner_ops runner_scripted;     /* runner_scripted.c */
int cmd_bench_ipc(int argc, char **argv);    /* bench_ipc.c */

#endif
