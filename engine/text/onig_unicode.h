/* Code points whose general category in HF tokenizers' Oniguruma (Unicode
 * 16.0) differs from PCRE2's (Unicode 14.0); generated into
 * engine/text/onig_unicode.c by tools/gen_onig_unicode.py. */
#ifndef LLM_ONIG_UNICODE_H
#define LLM_ONIG_UNICODE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t lo, hi;        /* inclusive */
    char gc[3];             /* category in Oniguruma, e.g. "Lo" */
} onig_gc_range;

extern const onig_gc_range onig_unicode_gap[];
extern const size_t onig_unicode_gap_len;

#endif
