/* The engine daemon (`llm-engine serve`): segment, doorbell socket,
 * heartbeat, signals, and the loop that feeds the scheduler.  Lifecycle:
 * STARTING → LOADING → READY → (SIGTERM) DRAINING → STOPPED, or FAILED
 * with the reason in the segment when loading or a step fails. */
#ifndef LLM_SERVER_H
#define LLM_SERVER_H

typedef struct {
    const char *recipe_path;
    const char *run_dir;      /* overrides the recipe's run_dir when set */
    const char *name;         /* overrides the recipe's name when set */
    const char *runner;       /* runner_lookup() name: "model" (the test binary: "scripted") */
} server_opts;

/* Runs until drained or failed.  Returns the process exit code:
 * 0 after a clean drain, 1 on load or runtime failure, 2 on bad setup. */
int server_run(const server_opts *o);

#endif
