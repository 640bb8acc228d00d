#!/usr/bin/env python3
"""Drift of each GEMM mode (recipe key gemm_mode) from a reference mode on a
trained model: teacher-forced logits over the held-out completions that
tests/fixtures/demo-trained/eval_hf.jsonl holds (transformers' answers to
the 20 evaluation prompts, concatenated: 1,076 tokens), one
`llm-engine logits` pass per mode, then relative L2 and greedy (arg-max)
agreement against the reference.  docs/MODEL.md quotes its table.

  python3 tools/mode_drift.py [--engine build/bin/llm-engine]
      [--model tests/fixtures/demo-trained] [--backend cuda]
      [--modes f32,bf16x2,bf16,fp8] [--ref f32]
"""
import argparse, array, json, math, os, subprocess, sys, tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--engine", default="build/bin/llm-engine")
ap.add_argument("--model", default="tests/fixtures/demo-trained")
ap.add_argument("--backend", default="cuda")
ap.add_argument("--modes", default="f32,bf16x2,bf16,fp8")
ap.add_argument("--ref", default="f32")
a = ap.parse_args()

ids = []
with open(os.path.join(a.model, "eval_hf.jsonl")) as f:
    for line in f:
        ids += json.loads(line)["completion_ids"]
vocab = json.load(open(os.path.join(a.model, "config.json")))["vocab_size"]
modes = a.modes.split(",")
if a.ref not in modes:
    modes.insert(0, a.ref)

rows = {}
with tempfile.TemporaryDirectory() as tmp:
    for m in modes:
        out = os.path.join(tmp, m + ".bin")
        cmd = [a.engine, "logits", "--model", a.model, "--backend", a.backend,
               "--gemm-mode", m, "--ids", ",".join(map(str, ids)), "--out", out]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            sys.exit("mode_drift: %s: exit %d: %s" % (m, r.returncode, r.stderr.strip()))
        v = array.array("f")
        with open(out, "rb") as f:
            v.frombytes(f.read())
        if len(v) != len(ids) * vocab:
            sys.exit("mode_drift: %s: %d floats, expected %d" % (m, len(v), len(ids) * vocab))
        rows[m] = v


def argmax(v, t):
    row = v[t * vocab:(t + 1) * vocab]
    return max(range(vocab), key=row.__getitem__)


ref = rows[a.ref]
ref_top = [argmax(ref, t) for t in range(len(ids))]
ref_ss = math.fsum(x * x for x in ref)
print("%d tokens of %s, backend %s, against gemm_mode %s" % (len(ids), a.model, a.backend, a.ref))
print("| gemm_mode | rel L2 | greedy agreement |")
print("| --- | ---: | ---: |")
for m in modes:
    if m == a.ref:
        continue
    v = rows[m]
    d = math.sqrt(math.fsum((x - y) * (x - y) for x, y in zip(v, ref)) / ref_ss)
    same = sum(argmax(v, t) == ref_top[t] for t in range(len(ids)))
    print("| %s | %.3g | %d of %d (%.1f%%) |" % (m, d, same, len(ids), 100.0 * same / len(ids)))
