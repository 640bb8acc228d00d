#include "chat_encode.h"

#include <stdlib.h>
#include <string.h>

int chat_prompt_encode(const tokenizer *t, const chat_prompt *p, tok_ids *out)
{
    size_t n_added = tok_n_added(t);
    unsigned char first[256] = { 0 };   /* first bytes of added tokens */
    for (size_t a = 0; a < n_added; a++) {
        size_t len;
        int32_t id;
        const char *c = tok_added_content(t, a, &len, &id);
        if (c && len) first[(unsigned char)c[0]] = 1;
    }
    tok_mark *marks = NULL;
    size_t n_marks = 0, cap_marks = 0;
    const char *text = p->text.data ? p->text.data : "";
    for (size_t k = 0; k < p->n_origin; k++) {
        const chat_span *sp = &p->origin[k];
        if (!sp->special_ok) continue;
        size_t end = sp->off + sp->len;
        for (size_t i = sp->off; i < end;) {
            if (!first[(unsigned char)text[i]]) { i++; continue; }
            /* leftmost-longest added token starting here */
            size_t best = 0;
            int32_t best_id = -1;
            for (size_t a = 0; a < n_added; a++) {
                size_t len;
                int32_t id;
                const char *c = tok_added_content(t, a, &len, &id);
                if (c && len > best && i + len <= end && !memcmp(text + i, c, len)) {
                    best = len;
                    best_id = id;
                }
            }
            if (!best) { i++; continue; }
            if (n_marks == cap_marks) {
                cap_marks = cap_marks ? cap_marks * 2 : 64;
                tok_mark *nm = realloc(marks, cap_marks * sizeof *marks);
                if (!nm) { free(marks); abort(); }
                marks = nm;
            }
            marks[n_marks].offset = i;
            marks[n_marks++].id = best_id;
            i += best;
        }
    }
    int rc = tok_encode_marked(t, text, p->text.len, marks, n_marks, out);
    free(marks);
    return rc;
}
