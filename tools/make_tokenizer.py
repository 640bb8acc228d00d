#!/usr/bin/env python3
"""Fixture tokenizer and golden ids for the C tokenizer (engine/text/tokenizer.c).

Needs HF `tokenizers` (0.23.2 on the GPU machine).  Two modes:

  python3 tools/make_tokenizer.py
      Train a small byte-level BPE with DeepSeek V3/V4's exact pre-tokenizer
      on tools/tokenizer_corpus/{train.txt,spec.json}, add V4's special
      tokens, and write into tests/fixtures/tokenizer/:
        tokenizer.json        BOS id 0, EOS id 1 (V4's config), chat markers
        tokenizer-flags.json  same model plus added tokens exercising
                              lstrip/rstrip/single_word/normalized
        golden.json, golden-flags.json   golden ids and decodes
        golden-variants.json  ids with other pre-tokenizers (GPT-2, Llama 3,
                              every Split behavior, ...) on the same model

  python3 tools/make_tokenizer.py --golden-only --tokenizer X.json --out G.json
      Golden ids for any tokenizer.json (e.g. DeepSeek's own), in the same
      format; check with: build/tests/test_tokenizer_golden X.json G.json
      Add --fuzz N [--seed S] to use N random texts instead of the cases.

Golden format: {"generator", "tokenizer", "encode": [{"name", "text",
"bytes", "ids_special", "ids_plain"}], "decode": [{"ids", "text", "bytes",
"text_skip_special", "bytes_skip_special"}]} (bytes: UTF-8 length).  ids_special = encode(text,
add_special_tokens=False); ids_plain = the same with every added token
treated as ordinary text (the tokenizer reloaded with "added_tokens": []),
which is what the engine uses for user text.  tools/make_tokenizer_dev.mjs
is the same generator for tokenizers' npm build (same Rust core), used for
development where Python tokenizers is not installed.
"""
import argparse
import copy
import json
import os
import random
import sys

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "tools", "tokenizer_corpus")
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "tokenizer")
VOCAB_SIZE = 4096

# DeepSeek V3/V4 tokenizer.json pre_tokenizer: three Split regexes, then
# ByteLevel without its own regex.
DIGITS = r"\p{N}{1,3}"
CJK = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
MAIN = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
        "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
        "| ?[\\p{P}\\p{S}]+[\r\n]*"
        "|\\s*[\r\n]+"
        "|\\s+(?!\\S)"
        "|\\s+")


def added_token(t):
    return AddedToken(t["content"], single_word=t["single_word"], lstrip=t["lstrip"],
                      rstrip=t["rstrip"], normalized=t["normalized"], special=t["special"])


def add_tokens(tok, specs):
    # One call per token so ids follow the spec's order.
    for t in specs:
        if t["special"]:
            tok.add_special_tokens([added_token(t)])
        else:
            tok.add_tokens([added_token(t)])


def train(spec):
    with open(os.path.join(CORPUS, "train.txt"), encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    lines += spec["extra_train"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(DIGITS), behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex(CJK), behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex(MAIN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, show_progress=False,
                                  special_tokens=spec["trainer_special_tokens"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer=trainer)
    add_tokens(tok, spec["added_tokens"])
    return tok


def decode_inputs(tok, encoded, seed):
    """Id sequences for decode goldens: every encode case, plus random ones
    that cut UTF-8 sequences apart and mix in special tokens."""
    seqs = [e["ids_special"] for e in encoded]
    vocab = tok.get_vocab(with_added_tokens=True)
    all_ids = sorted(set(vocab.values()))
    byte_ids = sorted(vocab[c] for c in pre_tokenizers.ByteLevel.alphabet() if c in vocab)
    rng = random.Random(seed)
    for _ in range(8):
        seqs.append([rng.choice(all_ids) for _ in range(rng.randrange(1, 60))])
    for _ in range(8):
        seqs.append([rng.choice(byte_ids) for _ in range(rng.randrange(1, 12))])
    return seqs


def fuzz_cases(spec, tokenizer_path, n, seed):
    """n random texts: words, spaces, digits, the tokenizer's added tokens
    and random code points (any plane, no surrogates)."""
    with open(tokenizer_path, encoding="utf-8") as f:
        added = [a["content"] for a in json.load(f).get("added_tokens") or []]
    added = added[:50] + added[-30:]
    rng = random.Random(seed)

    def code_point():
        k = rng.random()
        lo, size = ((0x20, 0x60) if k < 0.3 else (0xA0, 0x2000) if k < 0.5 else
                    (0x3000, 0x7000) if k < 0.7 else (0x1F000, 0x1000) if k < 0.8 else (0, 0x110000))
        c = lo + rng.randrange(size)
        return chr(0x41 if 0xD800 <= c <= 0xDFFF else c)

    cases = []
    for i in range(n):
        parts = []
        for _ in range(rng.randrange(1, 41)):
            k = rng.random()
            parts.append(rng.choice(spec["fuzz_words"]) if k < 0.3 else
                         rng.choice(spec["fuzz_spaces"]) if k < 0.5 else
                         rng.choice(added) if k < 0.6 and added else
                         str(rng.randrange(10 ** 7)) if k < 0.7 else code_point())
        cases.append({"name": "fuzz%d" % i, "text": "".join(parts)})
    return cases


def utf8_len(s):
    # Byte lengths let C readers keep strings with U+0000 whole.
    return len(s.encode("utf-8"))


def goldens(path, cases, seed):
    with open(path, encoding="utf-8") as f:
        raw = json.load(f)
    full = Tokenizer.from_file(path)
    raw["added_tokens"] = []
    plain = Tokenizer.from_str(json.dumps(raw))
    encoded = []
    for c in cases:
        encoded.append({
            "name": c["name"], "text": c["text"], "bytes": utf8_len(c["text"]),
            "ids_special": full.encode(c["text"], add_special_tokens=False).ids,
            "ids_plain": plain.encode(c["text"], add_special_tokens=False).ids,
        })
    decoded = []
    for ids in decode_inputs(full, encoded, seed):
        text = full.decode(ids, skip_special_tokens=False)
        skip = full.decode(ids, skip_special_tokens=True)
        decoded.append({"ids": ids, "text": text, "bytes": utf8_len(text),
                        "text_skip_special": skip, "bytes_skip_special": utf8_len(skip)})
    return {"generator": "tokenizers %s (python)" % tokenizers.__version__,
            "tokenizer": os.path.basename(path), "encode": encoded, "decode": decoded}


def variant_goldens(path, spec):
    """golden-variants.json: the fixture with other pre-tokenizers and model
    options (spec["variants"]), ids for spec["variant_cases"]."""
    with open(path, encoding="utf-8") as f:
        base = json.load(f)
    cases = [c for c in spec["cases"] if c["name"] in spec["variant_cases"]]
    variants = []
    for v in spec["variants"]:
        raw = copy.deepcopy(base)
        if "pre_tokenizer" in v:
            raw["pre_tokenizer"] = v["pre_tokenizer"]
        raw["model"].update(v.get("model", {}))
        tok = Tokenizer.from_str(json.dumps(raw))
        out = {k: v[k] for k in ("name", "pre_tokenizer", "model") if k in v}
        out["encode"] = [{"name": c["name"], "text": c["text"], "bytes": utf8_len(c["text"]),
                          "ids_special": tok.encode(c["text"], add_special_tokens=False).ids}
                         for c in cases]
        variants.append(out)
    return {"generator": "tokenizers %s (python)" % tokenizers.__version__,
            "tokenizer": os.path.basename(path), "variants": variants}


def write_json(g, path):
    """One encode/decode entry per line: small files, readable diffs."""
    def dumps(x):
        return json.dumps(x, ensure_ascii=False)
    def entries(xs):
        return "[\n" + ",\n".join(dumps(x) for x in xs) + "\n]"
    with open(path, "w", encoding="utf-8") as f:
        if "variants" in g:
            f.write('{"generator": %s, "tokenizer": %s,\n"variants": %s}\n' % (
                dumps(g["generator"]), dumps(g["tokenizer"]), entries(g["variants"])))
        else:
            f.write('{"generator": %s, "tokenizer": %s,\n"encode": %s,\n"decode": %s}\n' % (
                dumps(g["generator"]), dumps(g["tokenizer"]), entries(g["encode"]),
                entries(g["decode"])))
    print("wrote", path, os.path.getsize(path), "bytes")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--golden-only", action="store_true")
    ap.add_argument("--tokenizer", help="tokenizer.json for --golden-only")
    ap.add_argument("--out", help="golden output for --golden-only")
    ap.add_argument("--fuzz", type=int, metavar="N", help="--golden-only on N random texts instead")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    with open(os.path.join(CORPUS, "spec.json"), encoding="utf-8") as f:
        spec = json.load(f)
    if args.golden_only:
        if not args.tokenizer or not args.out:
            ap.error("--golden-only needs --tokenizer and --out")
        cases = (fuzz_cases(spec, args.tokenizer, args.fuzz, args.seed) if args.fuzz
                 else spec["cases"] + spec["flags_cases"])
        write_json(goldens(args.tokenizer, cases, args.seed), args.out)
        return
    os.makedirs(FIXTURES, exist_ok=True)
    main_path = os.path.join(FIXTURES, "tokenizer.json")
    flags_path = os.path.join(FIXTURES, "tokenizer-flags.json")
    tok = train(spec)
    tok.save(main_path)
    add_tokens(tok, spec["flags_added_tokens"])
    tok.save(flags_path)
    print("vocab", tok.get_vocab_size(with_added_tokens=False), "with added",
          tok.get_vocab_size(with_added_tokens=True))
    write_json(goldens(main_path, spec["cases"], 1), os.path.join(FIXTURES, "golden.json"))
    write_json(goldens(flags_path, spec["flags_cases"], 2),
               os.path.join(FIXTURES, "golden-flags.json"))
    write_json(variant_goldens(main_path, spec), os.path.join(FIXTURES, "golden-variants.json"))


if __name__ == "__main__":
    sys.exit(main())
