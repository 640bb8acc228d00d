/* What a test takes from its environment: where the programs under test
 * are, and how much slower than usual they may run. */
#ifndef LLM_TESTS_TEST_ENV_H
#define LLM_TESTS_TEST_ENV_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "<build dir>/<rel>", e.g. build_path("bin/llm-engine"): the build dir
 * is $LLM_BUILD_DIR (the Makefile sets it to its BUILD: build, or
 * build-asan for make test-asan), else build; relative to the repository
 * root, where tests run.  The string
 * lives as long as the program (one per distinct rel, at most 8). */
static inline const char *build_path(const char *rel)
{
    static char paths[8][512];
    static const char *rels[8];
    static int n;
    for (int i = 0; i < n; i++)
        if (!strcmp(rels[i], rel)) return paths[i];
    if (n == 8) abort();
    const char *dir = getenv("LLM_BUILD_DIR");
    snprintf(paths[n], sizeof paths[n], "%s/%s", dir && *dir ? dir : "build", rel);
    rels[n] = rel;
    return paths[n++];
}

/* Hang bounds (never timings) are multiplied by $LLM_TEST_TIME_SCALE, a
 * whole number (default 1): sanitizer builds run several times slower. */
static inline unsigned test_time_bound(unsigned seconds)
{
    const char *s = getenv("LLM_TEST_TIME_SCALE");
    int k = s ? atoi(s) : 1;
    return seconds * (unsigned)(k > 1 ? k : 1);
}

#endif
