/* Golden files live in shared/ beside the checkout (CI: ../shared).  The
 * directory is $LLM_SHARED_DIR, else ../shared, else /work/shared; a test
 * that needs them fails (never skips) when none exists. */
#ifndef LLM_TESTS_GOLDEN_H
#define LLM_TESTS_GOLDEN_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "json.h"
#include "strbuf.h"

static inline const char *shared_dir(void)
{
    const char *env = getenv("LLM_SHARED_DIR");
    const char *cand[] = { env, "../shared", "/work/shared" };
    for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++) {
        struct stat st;
        char probe[1024];
        if (!cand[i] || !*cand[i]) continue;
        snprintf(probe, sizeof probe, "%s/golden/chat", cand[i]);
        if (stat(probe, &st) == 0 && S_ISDIR(st.st_mode)) return cand[i];
    }
    return NULL;
}

/* Read shared/<rel> into sb; returns 0, or -1 with a diagnostic printed. */
static inline int read_shared(const char *rel, strbuf *sb)
{
    const char *dir = shared_dir();
    char path[1024];
    if (!dir) {
        printf("# no shared/ directory: set LLM_SHARED_DIR, or put shared/ at ../shared\n");
        return -1;
    }
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    sb_reset(sb);
    if (sb_read_file(sb, path)) {
        printf("# cannot read %s\n", path);
        return -1;
    }
    return 0;
}

/* Parse shared/<rel> as JSON, or NULL with a diagnostic printed. */
static inline yajl_val load_shared_json(const char *rel)
{
    strbuf sb;
    sb_init(&sb);
    char err[256];
    yajl_val v = NULL;
    if (read_shared(rel, &sb) == 0) {
        v = json_parse(sb.data, sb.len, err, sizeof err);
        if (!v) printf("# %s: %s\n", rel, err);
    }
    sb_free(&sb);
    return v;
}

#endif
