/* Regexes with the semantics of HF tokenizers' SysRegex (Oniguruma, Ruby
 * syntax, Unicode 16.0) on PCRE2 with UTF and UCP.  Patterns are rewritten
 * where the two engines differ:
 *   \s \S        White_Space exactly (PCRE2 also counts U+180E)
 *   \w \W        Alphabetic, marks, all numbers, Pc, Join_Control
 *   \d \D        Nd;  \h \H  hex digits (PCRE2: horizontal space)
 *   \p{X} \P{X}  general categories gain the code points Unicode 15-16
 *                assigned (engine/text/onig_unicode.c), \p{^X} = \P{X};
 *                \p{C} and \p{Cn} keep PCRE2's Unicode 14 meaning
 *   \uHHHH       \x{HHHH};  ^ $  line anchors (PCRE2_MULTILINE)
 * Known remaining gaps, none used by byte-level BPE tokenizers: negated
 * shorthands (\S \W \D \P{X}) inside [...] keep PCRE2's meaning, scripts
 * and other non-category properties keep PCRE2's Unicode 14 data, and
 * Oniguruma's nested classes and && intersections are not supported. */
#ifndef LLM_ONIG_REGEX_H
#define LLM_ONIG_REGEX_H

#include <stdbool.h>
#include <stddef.h>

#include "strbuf.h"

typedef struct onig_regex onig_regex;

/* Compile pattern[0..len).  literal: match it as plain text (a Split
 * pattern given as {"String": ...}).  NULL with a reason in err on
 * failure. */
onig_regex *onig_regex_compile(const char *pattern, size_t len, bool literal,
                               char *err, size_t errlen);
void onig_regex_free(onig_regex *re);

/* The PCRE2 pattern a given Oniguruma pattern becomes (for tests and error
 * messages).  Returns 0, or -1 with a reason in err. */
int onig_regex_translate(const char *pattern, size_t len, strbuf *out,
                         char *err, size_t errlen);

/* Matching state: one per thread (match data and JIT stack). */
typedef struct onig_scratch onig_scratch;
onig_scratch *onig_scratch_new(void);
void onig_scratch_free(onig_scratch *sc);

typedef struct {
    size_t start, end;
} onig_span;

typedef struct {
    onig_span *v;
    size_t n, cap;
} onig_spans;

void onig_spans_free(onig_spans *s);

/* Append every match in s[0..n) (valid UTF-8) to out, in the order the
 * onig crate's find_iter yields them: leftmost-first, empty matches
 * allowed except right where the previous match ended.  Returns 0, or a
 * negative PCRE2 error code (e.g. a match limit hit). */
int onig_regex_find_all(const onig_regex *re, onig_scratch *sc,
                        const char *s, size_t n, onig_spans *out);

/* Whether the regex matches at the very start of s[0..n). */
bool onig_regex_match_here(const onig_regex *re, onig_scratch *sc,
                           const char *s, size_t n);

#endif
