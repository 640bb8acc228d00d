#!/usr/bin/env python3
"""Time HF tokenizers on the benchmark prompt, single-threaded, for the
ratio against `llm-engine bench-tokenizer` (docs/PERFORMANCE.md).

  python3 tools/bench_hf_tokenizer.py --tokenizer FILE [--text FILE]
        [--repeat N] [--engine build/bin/llm-engine]

Without --text the prompt is tools/bench_text.py's (same bytes as the C
benchmark uses).  With --engine the engine's `tokenize` CLI encodes the
same text and its ids are compared with HF's.
"""
import argparse
import os
import subprocess
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import tokenizers  # noqa: E402  (after the thread settings)
from tokenizers import Tokenizer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_text import bench_text  # noqa: E402


def timed(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return result, times[len(times) // 2], times[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--text")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--engine", help="llm-engine binary to compare ids with")
    args = ap.parse_args()
    if args.text:
        with open(args.text, encoding="utf-8", newline="") as f:
            text = f.read()
    else:
        text = bench_text(500000)
    data = text.encode("utf-8")
    t0 = time.perf_counter()
    tok = Tokenizer.from_file(args.tokenizer)
    load_ms = (time.perf_counter() - t0) * 1e3
    enc, med, best = timed(lambda: tok.encode(text, add_special_tokens=False), args.repeat)
    ids = enc.ids
    _, dmed, _ = timed(lambda: tok.decode(ids, skip_special_tokens=False), args.repeat)
    print("HF tokenizers %s (python), RAYON_NUM_THREADS=%s" % (tokenizers.__version__, os.environ["RAYON_NUM_THREADS"]))
    print("tokenizer   %s, loaded in %.0f ms" % (args.tokenizer, load_ms))
    print("text        %d bytes -> %d tokens" % (len(data), len(ids)))
    print("encode      median %.2f ms, best %.2f ms over %d runs" % (med, best, args.repeat))
    print("            %.1f MB/s, %.0f tokens/s" % (len(data) / 1e6 / (med / 1e3), len(ids) / (med / 1e3)))
    print("decode      median %.2f ms" % dmed)
    if args.engine:
        # HF's encode recognizes added tokens: compare with --special.
        out = subprocess.run([args.engine, "tokenize", "--special", "--tokenizer", args.tokenizer],
                             input=data, capture_output=True, check=True).stdout
        mine = [int(x) for x in out.split()]
        if mine == ids:
            print("engine      same %d ids as HF" % len(ids))
        else:
            i = next((k for k in range(min(len(mine), len(ids))) if mine[k] != ids[k]), min(len(mine), len(ids)))
            print("engine      DIFFERS: %d ids vs HF %d, first difference at index %d" % (len(mine), len(ids), i))
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
