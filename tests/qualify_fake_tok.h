/* A deterministic stand-in tokenizer for the llm-qualify tests, with
 * deliberately irregular costs so the calibrator cannot rely on simple
 * arithmetic: a leading space joins up to four letters, longer words
 * split every four letters, " a a" is one token (so " a" is not additive),
 * "00" and "\n\n" are one token, everything else one token per byte.
 * Header-only: the fake server and the calibrator test share it. */
#ifndef QUALIFY_FAKE_TOK_H
#define QUALIFY_FAKE_TOK_H

#include <stddef.h>
#include <stdint.h>

static inline int ft_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/* Length of the token starting at s[i]. */
static inline size_t ft_next(const char *s, size_t n, size_t i)
{
    if (i + 4 <= n && s[i] == ' ' && s[i + 1] == 'a' && s[i + 2] == ' ' && s[i + 3] == 'a'
        && (i + 4 == n || !ft_letter(s[i + 4])))
        return 4;
    size_t j = i;
    if (s[j] == ' ' && j + 1 < n && ft_letter(s[j + 1])) j++;
    if (ft_letter(s[j])) {
        size_t k = 0;
        while (j < n && k < 4 && ft_letter(s[j])) j++, k++;
        return j - i;
    }
    if ((s[i] == '0' || s[i] == '\n') && i + 1 < n && s[i + 1] == s[i]) return 2;
    return 1;
}

static inline uint32_t ft_id(const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return 100 + h % 100000;
}

/* Tokenize s[0..n): returns the count; ids (may be NULL) gets at most
 * cap of them. */
static inline long ft_tokenize(const char *s, size_t n, uint32_t *ids, long cap)
{
    long count = 0;
    for (size_t i = 0; i < n;) {
        size_t len = ft_next(s, n, i);
        if (ids && count < cap) ids[count] = ft_id(s + i, len);
        count++;
        i += len;
    }
    return count;
}

#endif
