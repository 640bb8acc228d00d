#!/usr/bin/env python3
"""A synthetic 129K-token tokenizer.json for bench-mask (docs/PERFORMANCE.md).

DeepSeek V4's real tokenizer is not in this repository; mask costs grow with
the vocabulary, so the constrained-decoding benchmark needs one of the real
size.  This takes the fixture tokenizer (its specials, byte alphabet and
merges) and adds ordinary tokens until the vocab has 129,280 ids: English-
like words with and without a leading space, CJK runs, digit groups,
punctuation and code fragments (JSON punctuation included: '",', '":', '{"'),
in roughly a BPE vocabulary's proportions.  Deterministic (seeded).

    python3 tools/make_bench_vocab.py tests/fixtures/tokenizer/tokenizer.json build/bench-vocab.json
"""
import json
import random
import sys


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def main():
    src, dst = sys.argv[1], sys.argv[2]
    tok = json.load(open(src, encoding="utf-8"))
    vocab = tok["model"]["vocab"]
    b2u = bytes_to_unicode()
    rnd = random.Random(7)
    target = 129280 - len(tok["added_tokens"])
    cons = "bcdfghjklmnprstvwyz"
    vow = "aeiou"
    punct = ['",', '":', '{"', '"}', '"]', '["', '("', '")', '",\n', '":"', '"},', '\\n', '</', '/>',
             '();', '){', '=>', '->', '::', '==', '!=', '&&', '||', '...', '--', '**', '##', '//',
             '/*', '*/', '<', '>', '[]', '{}', '":[', '":{', '"},{"', ' "', ' {"', ' ["', '\n\n', '\n', '  ',
             '    ', '\t', '.\n', ',\n', ';\n', ' =', ' +', ' -', ' *', ' /', ' <', ' >', '%', '$', '#', '@']

    def word():
        w = "".join(rnd.choice(cons) + rnd.choice(vow) for _ in range(rnd.randint(1, 4)))
        if rnd.random() < 0.3:
            w = w[: rnd.randint(1, len(w))]
        if rnd.random() < 0.15:
            w = w.capitalize()
        return w

    def cjk():
        return "".join(chr(rnd.randint(0x4E00, 0x9FFF)) for _ in range(rnd.randint(1, 3)))

    def piece():
        r = rnd.random()
        if r < 0.55:
            return (" " if rnd.random() < 0.5 else "") + word()
        if r < 0.80:
            return cjk()
        if r < 0.88:
            return "".join(rnd.choice(punct) for _ in range(rnd.randint(1, 2)))
        if r < 0.93:
            return str(rnd.randint(0, 999))
        if r < 0.97:
            return rnd.choice(['"', ' "', "'", "_", ".", "("]) + word()
        return word() + rnd.choice(['"', '",', '":', "_", ".", "(", ")"])

    while len(vocab) < target:
        s = piece()
        t = "".join(b2u[b] for b in s.encode("utf-8"))
        if t not in vocab:
            vocab[t] = len(vocab)
    n = len(vocab)
    for i, a in enumerate(tok["added_tokens"]):
        a["id"] = n + i
    json.dump(tok, open(dst, "w", encoding="utf-8"), ensure_ascii=False)
    print(f"{dst}: {len(vocab)} + {len(tok['added_tokens'])} ids")


if __name__ == "__main__":
    main()
