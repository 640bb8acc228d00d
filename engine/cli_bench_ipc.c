#include <stdio.h>
#include "cli.h"
int cmd_bench_ipc(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "bench-ipc: not yet\n"); return 1; }
