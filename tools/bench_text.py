#!/usr/bin/env python3
"""Write a deterministic ~500 KB prompt for tokenizer benchmarks.

Lines of tools/tokenizer_corpus (English, code, CJK, emoji, whitespace...)
are shuffled and mutated with a fixed seed so that, like a real long
prompt, most words repeat but many are new.  Same bytes on any machine
(Python's random.Random is stable across versions), so the C tokenizer
and HF tokenizers (tools/bench_hf_tokenizer.py) time the same text.

  python3 tools/bench_text.py /tmp/bench.txt [--bytes 500000]
"""
import argparse
import json
import os
import random

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "tools", "tokenizer_corpus")
CJK = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经"


def mutate(rng, word):
    r = rng.random()
    if r < 0.05:
        return word + str(rng.randrange(10 ** rng.randrange(1, 7)))
    if r < 0.10 and len(word) > 3:
        i = rng.randrange(len(word) - 1)
        return word[:i] + word[i + 1] + word[i] + word[i + 2:]
    if r < 0.13:
        return "".join(rng.choice(CJK) for _ in range(rng.randrange(2, 12)))
    if r < 0.15:
        return word.upper()
    return word


def bench_text(size, seed=42):
    with open(os.path.join(CORPUS, "train.txt"), encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    with open(os.path.join(CORPUS, "spec.json"), encoding="utf-8") as f:
        lines += [c["text"] + "\n" for c in json.load(f)["cases"]]
    rng = random.Random(seed)
    out, n = [], 0
    while n < size:
        line = rng.choice(lines)
        words = line.split(" ")
        line = " ".join(mutate(rng, w) for w in words)
        out.append(line)
        n += len(line.encode("utf-8"))
    return "".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--bytes", type=int, default=500000)
    args = ap.parse_args()
    text = bench_text(args.bytes)
    with open(args.out, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    print("wrote", args.out, len(text.encode("utf-8")), "bytes")


if __name__ == "__main__":
    main()
