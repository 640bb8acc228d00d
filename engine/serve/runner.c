/* The runners built into this binary.  "model" is the real one (chat
 * renderer, tokenizer, model, sampler, output parser: runner_model.c);
 * "scripted" is test-only (runner_scripted.c) and is
 * reachable only through `serve --test-runner scripted`, never a recipe. */
#include <string.h>

#include "runner.h"

extern const runner_ops runner_model;
extern const runner_ops runner_scripted;

static const runner_ops *const runners[] = {
    &runner_model,
    &runner_scripted,
};

const runner_ops *runner_lookup(const char *name)
{
    for (size_t i = 0; i < sizeof runners / sizeof runners[0]; i++)
        if (!strcmp(runners[i]->name, name)) return runners[i];
    return NULL;
}
