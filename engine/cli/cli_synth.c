/* llm-engine synth --out DIR [--preset tiny|mid] [--seed N] [--shards N]
 * Writes a synthetic DeepSeek V4 checkpoint in the released format. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "synth_model.h"

int cmd_synth(int argc, char **argv)
{
    const char *out = NULL, *preset = "tiny";
    unsigned long long seed = 1;
    int shards = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--out")) out = argv[i + 1];
        else if (!strcmp(argv[i], "--preset")) preset = argv[i + 1];
        else if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--shards")) shards = atoi(argv[i + 1]);
        else out = NULL, i = argc;
    }
    if (!out || argc % 2 == 0) {
        fprintf(stderr, "usage: llm-engine synth --out DIR [--preset tiny|mid] [--seed N] "
                "[--shards N]\n");
        return 2;
    }
    synth_spec s;
    if (synth_preset(&s, preset)) {
        fprintf(stderr, "llm-engine synth: unknown preset %s (tiny, mid)\n", preset);
        return 2;
    }
    strbuf err;
    sb_init(&err);
    int rc = synth_write_dir(&s, seed, out, shards, &err);
    if (rc) fprintf(stderr, "llm-engine synth: %s", err.data);
    sb_free(&err);
    return rc ? 1 : 0;
}
