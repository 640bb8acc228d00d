/* The chat-format golden files, committed in tests/fixtures/chat/
 * (README there says where each came from).  Tests run from the
 * repository root; a missing or unreadable file fails the test that
 * needs it (never a skip). */
#ifndef LLM_TESTS_GOLDEN_H
#define LLM_TESTS_GOLDEN_H

#include <stdio.h>

#include "json.h"
#include "strbuf.h"
#include "tap.h"

#define GOLDEN_DIR "tests/fixtures/chat"

/* Read tests/fixtures/chat/<rel> into sb; 0, or -1 with a diagnostic. */
static inline int read_golden(const char *rel, strbuf *sb)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", GOLDEN_DIR, rel);
    sb_reset(sb);
    if (sb_read_file(sb, path)) {
        printf("# cannot read %s (run from the repository root)\n", path);
        return -1;
    }
    return 0;
}

/* Parse tests/fixtures/chat/<rel> as JSON, or NULL with a diagnostic. */
static inline yajl_val load_golden_json(const char *rel)
{
    strbuf sb;
    sb_init(&sb);
    char err[256];
    yajl_val v = NULL;
    if (read_golden(rel, &sb) == 0) {
        v = json_parse(sb.data, sb.len, err, sizeof err);
        if (!v) printf("# %s: %s\n", rel, err);
    }
    sb_free(&sb);
    return v;
}

/* The "render" or "parse" cases of v4-0731-openai.json, at least min of
 * them (one test says so), with *root the tree to free; or NULL after a
 * failed test, with nothing to free. */
static inline yajl_val openai_golden_cases(const char *key, size_t min, yajl_val *root)
{
    *root = load_golden_json("v4-0731-openai.json");
    yajl_val cases = json_get(*root, key);
    if (!ok(cases && YAJL_IS_ARRAY(cases) && cases->u.array.len >= min,
            "v4-0731-openai.json has %zu+ %s cases", min, key)) {
        yajl_tree_free(*root);
        *root = NULL;
        return NULL;
    }
    return cases;
}

#endif
