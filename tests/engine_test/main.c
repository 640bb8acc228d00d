/* build/tests/llm-engine-test: build/bin/llm-engine plus its test hooks,
 * for the test suites only.  It registers the scripted runner (`serve
 * --test-runner scripted`) and adds `bench-ipc`; everything else is the
 * production code, linked from the same engine library. */
#include "engine_test.h"

static const cli_command test_commands[] = {
    { "bench-ipc", cmd_bench_ipc,
      "bench-ipc [--iters N]        protocol round trip and scheduler overhead" },
};

int main(int argc, char **argv)
{
    runner_register_test(&runner_scripted);
    return cli_main(argc, argv, test_commands,
                    sizeof test_commands / sizeof test_commands[0]);
}
