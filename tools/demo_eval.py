#!/usr/bin/env python3
"""Score the trained demo model on tools/demo_data.py's held-out prompts
(issue 19), through the real serving path and/or from transformers'
greedy completions, and print the table docs/MODEL.md holds.

    python3 tools/demo_eval.py --eval eval.jsonl --base-url http://127.0.0.1:8080
    python3 tools/demo_eval.py --eval eval.jsonl --hf eval_hf.jsonl
    python3 tools/demo_eval.py --eval eval.jsonl --base-url URL --hf eval_hf.jsonl

Server answers come from POST /v1/chat/completions (temperature 0,
max_tokens --max-new).  transformers' completion ids are detokenized and
parsed by the engine (`llm-engine detokenize`, `llm-engine parse`), the
same parser serving uses.  Both are scored the same way:

- arith: the last integer of the content is the answer (for a comparison,
  the first integer is the larger one);
- json: the content parses as a JSON object (valid rate) and holds the
  expected value under the expected key (correct rate);
- tool_call: a tool call was made (rate), the name and arguments equal the
  expected ones (argument accuracy);
- tool_result: the content mentions the tool result's value.

With both sources, "agree" counts prompts whose content and tool calls are
identical.  --json FILE writes every answer.  Standard library only.
"""
import argparse
import json
import re
import subprocess
import sys
import urllib.request

import demo_data

KINDS = ["arith", "json", "tool_call", "tool_result"]


def ask_server(base, req, max_new, api_key=None):
    body = dict(req, temperature=0, max_tokens=max_new)
    r = urllib.request.Request(base.rstrip("/") + "/v1/chat/completions",
                               data=json.dumps(body).encode(),
                               headers={"Content-Type": "application/json"})
    if api_key:
        r.add_header("Authorization", "Bearer " + api_key)
    with urllib.request.urlopen(r, timeout=300) as f:
        msg = json.load(f)["choices"][0]["message"]
    calls = [{"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
             for c in msg.get("tool_calls") or []]
    return {"content": msg.get("content") or "", "tool_calls": calls}


def parse_ids(ids, thinking, engine, tokenizer):
    text = subprocess.run([engine, "detokenize", "--tokenizer", tokenizer],
                          input=" ".join(map(str, ids)).encode(), capture_output=True,
                          check=True).stdout
    msg = json.loads(subprocess.run([engine, "parse", "--mode", "thinking" if thinking else "chat"],
                                    input=text, capture_output=True, check=True).stdout)
    calls = [{"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
             for c in msg.get("tool_calls") or []]
    return {"content": msg.get("content") or "", "tool_calls": calls}


def ints(s):
    return [int(x) for x in re.findall(r"-?\d+", s)]


def score(e, ans):
    """{metric: 0/1} for one answer."""
    k, x, c = e["kind"], e["expect"], ans["content"]
    if k == "arith":
        n = ints(c)
        got = (n[0] if x["op"] == "cmp" else n[-1]) if n else None
        return {"exact": int(got == x["value"])}
    if k == "json":
        try:
            v = json.loads(c)
        except ValueError:
            v = None
        ok = isinstance(v, dict)
        return {"valid": int(ok), "correct": int(ok and v.get(x["json_key"]) == x["value"])}
    if k == "tool_call":
        calls = ans["tool_calls"]
        right = bool(calls) and calls[0]["name"] == x["tool"] and calls[0]["arguments"] == x["args"]
        return {"called": int(bool(calls)), "args": int(right)}
    return {"mentions": int(x["mention"] in c)}


def table(rows, sources):
    """One column per source; with both, also the engine on the prompts
    transformers answered (its time budget may stop it early)."""
    cols = [(s, s, lambda r: True) for s in sources]
    if len(sources) == 2:
        cols.insert(1, ("engine, same prompts", "engine", lambda r: "transformers" in r["scores"]))
    print("| kind | metric | " + " | ".join(c[0] for c in cols) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in cols) + " |")
    for k in KINDS:
        mine = [r for r in rows if r["kind"] == k]
        if not mine:
            continue
        for m in mine[0]["scores"][sources[0]]:
            cells = []
            for _, s, keep in cols:
                got = [r["scores"][s][m] for r in mine if s in r["scores"] and keep(r)]
                cells.append(f"{sum(got)}/{len(got)}")
            print(f"| {k} | {m} | " + " | ".join(cells) + " |")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--eval", required=True)
    ap.add_argument("--base-url")
    ap.add_argument("--api-key")
    ap.add_argument("--hf")
    ap.add_argument("--max-new", type=int, default=256)  # room for the working
    ap.add_argument("--engine", default=demo_data.ENGINE)
    ap.add_argument("--tokenizer", default=demo_data.TOKENIZER)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if not a.base_url and not a.hf:
        ap.error("give --base-url, --hf or both")
    evals = [json.loads(line) for line in open(a.eval)]
    hf = {}
    if a.hf:
        for line in open(a.hf):
            h = json.loads(line)
            hf[h["id"]] = h["completion_ids"]
    sources = (["engine"] if a.base_url else []) + (["transformers"] if a.hf else [])
    rows, agree, both = [], 0, 0
    for e in evals:
        answers = {}
        if a.base_url:
            answers["engine"] = ask_server(a.base_url, e["request"], a.max_new, a.api_key)
        if a.hf and e["id"] in hf:
            thinking = e["request"].get("chat_template_kwargs", {}).get("thinking", False)
            answers["transformers"] = parse_ids(hf[e["id"]], thinking, a.engine, a.tokenizer)
        if len(answers) == 2:
            both += 1
            agree += answers["engine"] == answers["transformers"]
        rows.append({"id": e["id"], "kind": e["kind"], "answers": answers,
                     "scores": {s: score(e, v) for s, v in answers.items()}})
    table(rows, sources)
    if both:
        print(f"\nengine and transformers answers identical on {agree}/{both} prompts")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
