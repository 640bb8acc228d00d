/* llm-engine check --recipe FILE: validate without loading weights. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "recipe.h"

int cmd_check(int argc, char **argv)
{
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--recipe") && i + 1 < argc) path = argv[++i];
        else {
            fprintf(stderr, "check: unexpected argument '%s'\n"
                            "usage: llm-engine check --recipe FILE\n", argv[i]);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "usage: llm-engine check --recipe FILE\n");
        return 2;
    }
    recipe r;
    strbuf errors;
    sb_init(&errors);
    int n = recipe_load(&r, path, &errors);
    if (n) {
        fputs(errors.data, stderr);
        fprintf(stderr, "%s: %d problem%s\n", path, n, n == 1 ? "" : "s");
    } else {
        printf("%s: ok (name %s, backend %s, tp %d, max_model_len %d, "
               "max_num_seqs %d, kv_cache_dtype %s)\n", path, r.name,
               backend_name(r.backend), r.tensor_parallel_size, r.max_model_len,
               r.max_num_seqs, kv_cache_dtype_name(r.kv_cache_dtype));
    }
    recipe_free(&r);
    sb_free(&errors);
    return n ? 1 : 0;
}
