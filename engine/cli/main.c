/* build/bin/llm-engine: one binary, many subcommands (cli_main.c).  No
 * test runner is registered here: `serve --test-runner` and `bench-ipc`
 * exist only in build/tests/llm-engine-test (tests/engine_test/). */
#include "cli.h"

int main(int argc, char **argv)
{
    return cli_main(argc, argv, NULL, 0);
}
