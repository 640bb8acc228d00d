/* The runner registry.  "model" is the serving runner (chat renderer,
 * tokenizer, model, sampler, output parser: runner_model.c) and the only
 * one in build/bin/llm-engine.  The test binary (tests/engine_test/)
 * registers its model-free "scripted" runner with runner_register_test;
 * `serve --test-runner NAME` exists only where one was registered. */
#include <string.h>

#include "runner.h"

extern const runner_ops runner_model;

#define MAX_TEST_RUNNERS 4

static const runner_ops *test_runners[MAX_TEST_RUNNERS];
static int n_test_runners;

void runner_register_test(const runner_ops *ops)
{
    if (n_test_runners < MAX_TEST_RUNNERS) test_runners[n_test_runners++] = ops;
}

int runner_have_test_runners(void)
{
    return n_test_runners > 0;
}

const runner_ops *runner_lookup(const char *name)
{
    if (!strcmp(runner_model.name, name)) return &runner_model;
    for (int i = 0; i < n_test_runners; i++)
        if (!strcmp(test_runners[i]->name, name)) return test_runners[i];
    return NULL;
}
