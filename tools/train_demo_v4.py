#!/usr/bin/env python3
"""Train the demo DeepSeek V4 (issue 19) with transformers'
DeepseekV4ForCausalLM on tools/demo_data.py's corpus, fine-tune it
quantization-aware, export it in the released format (FP8 blocks, MXFP4
experts) and run the held-out prompts greedily through the exported
weights.

    python3 tools/train_demo_v4.py --data train.bin --eval eval.jsonl \\
        --tokenizer tests/fixtures/tokenizer/tokenizer.json --out DIR \\
        --seed 19 --train-seconds 200 --qat-seconds 40

Run on the GPU machine (torch, transformers 5.17).  The model is
make_tiny_v4's `demo` preset (its config and its random initial weights,
so tid2eid, router biases, MTP draft tensors come from there); training
uses float32 with TF32 matmuls.  The step count comes from the time
budget after timing a few steps, and is printed with the exact
`--train-steps`/`--qat-steps` that reproduce the run.

QAT: before each forward the FP8 and MXFP4 weights (and BF16 ones) are
replaced by their quantized values, the gradient taken there is applied
to the float master weights (a straight-through estimator).  The export
then rounds the same way (make_tiny_v4.encode_like), so what serving
loads is what the last QAT steps saw.

Writes to --out: the checkpoint (config.json, safetensors, index,
tokenizer.json), train.json (command, steps, losses, timings) and
eval_hf.jsonl (greedy completion ids per held-out prompt).
"""
import argparse
import json
import math
import os
import random
import shlex
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_data                      # noqa: E402
import make_tiny_v4 as mt             # noqa: E402

PAD_ID = 2


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


# ------------------------------------------------------------ fake quant --
def quant_kinds(model, template):
    """{parameter name: 'fp8' | 'fp4' | 'bf16'} from the released dtypes
    (F32 parameters stay float)."""
    kinds = {}
    for n, _ in model.named_parameters():
        _, rel = mt.released_name(n)
        if rel in mt.FUSED_EXPERTS:
            kinds[n] = "fp4"
        elif template[rel][0] == "F8_E4M3":
            kinds[n] = "fp8"
        elif template[rel][0] == "BF16":
            kinds[n] = "bf16"
    return kinds


def fq_fp8(torch, w):
    """Per 128x128 block: scale 2^ceil(log2(amax/448)), E4M3 round to
    nearest even (make_tiny_v4.fp8_block_quant without jitter)."""
    B = mt.FP8_BLOCK
    out, inn = w.shape
    po, pi = -out % B, -inn % B
    x = torch.nn.functional.pad(w, (0, pi, 0, po))
    x = x.view((out + po) // B, B, (inn + pi) // B, B)
    amax = x.abs().amax(dim=(1, 3), keepdim=True).clamp_min(1e-30)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 448.0)))
    q = (x / scale).to(torch.float8_e4m3fn).to(w.dtype) * scale
    return q.view(out + po, inn + pi)[:out, :inn]


def fq_fp4(torch, w, grid):
    """MXFP4 along the last dim in groups of 32: scale 2^ceil(log2(amax/6)),
    nearest E2M1 magnitude."""
    shape = w.shape
    g = w.reshape(*shape[:-1], shape[-1] // mt.MXFP4_GROUP, mt.MXFP4_GROUP)
    amax = g.abs().amax(-1, keepdim=True).clamp_min(1e-30)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 6.0)))
    x = g / scale
    mids = (grid[1:] + grid[:-1]) / 2
    q = grid[torch.bucketize(x.abs(), mids)] * torch.sign(x)
    return (q * scale).reshape(shape)


class FakeQuant:
    """Swap the quantized parameters' values in (apply) and the float
    masters back (restore), around one forward + backward."""

    def __init__(self, torch, model, kinds):
        self.torch = torch
        self.params = [(p, kinds[n]) for n, p in model.named_parameters() if n in kinds]
        dev = next(model.parameters()).device
        self.grid = torch.tensor(mt.FP4_VALUES[:8], dtype=torch.float32, device=dev)
        self.saved = []

    def quantize(self, w, kind):
        torch = self.torch
        if kind == "bf16":
            return w.to(torch.bfloat16).to(w.dtype)
        if kind == "fp8":
            return fq_fp8(torch, w)
        return fq_fp4(torch, w, self.grid)

    def apply(self):
        with self.torch.no_grad():
            self.saved = [p.data.clone() for p, _ in self.params]
            for p, kind in self.params:
                p.data.copy_(self.quantize(p.data, kind))

    def restore(self):
        with self.torch.no_grad():
            for (p, _), w in zip(self.params, self.saved):
                p.data.copy_(w)
        self.saved = []


# ------------------------------------------------------------------ data --
def read_train(path):
    """demo_data.read_train with numpy ([(ids, mask)] as arrays): a corpus
    of tens of millions of tokens loads in seconds, not minutes."""
    data = np.fromfile(path, dtype=np.uint8)
    if data[:8].tobytes() != demo_data.MAGIC:
        raise SystemExit(f"{path}: not a demo_data file")
    count, off, out = int(data[8:12].view("<u4")[0]), 12, []
    for _ in range(count):
        n = int(data[off:off + 4].view("<u4")[0])
        ids = data[off + 4:off + 4 + 2 * n].view("<u2").astype(np.int64)
        out.append((ids, data[off + 4 + 2 * n:off + 4 + 3 * n].astype(bool)))
        off += 4 + 3 * n
    if off != len(data):
        raise SystemExit(f"{path}: {len(data) - off} bytes after the last example")
    return out


def batches(examples, max_tokens, rng):
    """Batches of similar length: sort by length within shuffled chunks,
    cut so batch size x longest <= max_tokens, shuffle the batches."""
    idx = list(range(len(examples)))
    rng.shuffle(idx)
    out = []
    for c in range(0, len(idx), 2048):
        chunk = sorted(idx[c:c + 2048], key=lambda i: len(examples[i][0]))
        cur = []
        for i in chunk:
            n = len(examples[i][0])
            if cur and (len(cur) + 1) * max(n, len(examples[cur[0]][0])) > max_tokens:
                out.append(cur)
                cur = []
            cur.append(i)
        if cur:
            out.append(cur)
    rng.shuffle(out)
    return out


def tensors(torch, examples, batch, dev):
    S = max(len(examples[i][0]) for i in batch)
    ids = torch.full((len(batch), S), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(batch), S), dtype=torch.bool)
    for r, i in enumerate(batch):
        x, m = examples[i]
        ids[r, :len(x)] = torch.from_numpy(x)
        mask[r, :len(m)] = torch.from_numpy(m)
    return ids.to(dev, non_blocking=True), mask.to(dev, non_blocking=True)


def masked_loss(torch, model, ids, mask):
    """Mean cross-entropy of the masked tokens given everything before."""
    logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
    tgt, m = ids[:, 1:], mask[:, 1:]
    return torch.nn.functional.cross_entropy(logits[m], tgt[m])


# ----------------------------------------------------------------- model --
def build(p, cfg, dev):
    import torch
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4ForCausalLM
    hf_cfg, notes = mt.hf_config(cfg, p)
    model = DeepseekV4ForCausalLM(hf_cfg).to(torch.float32)
    if hasattr(model, "set_experts_implementation"):
        try:
            model.set_experts_implementation("eager")
        except Exception as ex:                      # keep the default
            log(f"note: experts implementation eager: {ex}")
    return model, notes


def load_released(model, ckpt, p, dev):
    import torch
    sd = {k: torch.from_numpy(np.ascontiguousarray(v))
          for k, v in mt.hf_state_arrays(ckpt, p).items()}
    model.load_state_dict(sd, strict=True)
    return model.to(dev)


def export(model, template, p, cfg, out, tokenizer):
    sd = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    tensors_ = mt.encode_like(template, mt.released_arrays(sd, p))
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if f.endswith(".safetensors") or f.endswith(".index.json"):
            os.remove(os.path.join(out, f))
    files = mt.write_checkpoint(out, tensors_, p["shards"])
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    shutil.copyfile(tokenizer, os.path.join(out, "tokenizer.json"))
    return files


def greedy(torch, model, prompt, max_new, eos=demo_data.EOS_ID):
    """Greedy completion ids through the cache (prefill, then one token
    per call), stopping after EOS."""
    dev = next(model.parameters()).device
    ids = torch.tensor([prompt], dtype=torch.long, device=dev)
    out, pkv = [], None
    with torch.no_grad():
        o = model(input_ids=ids, use_cache=True)
        for _ in range(max_new):
            t = int(o.logits[0, -1].float().argmax())
            out.append(t)
            if t == eos:
                break
            o = model(input_ids=torch.tensor([[t]], device=dev),
                      past_key_values=o.past_key_values, use_cache=True)
    return out


# ------------------------------------------------------------------ main --
def run_phase(torch, model, opt, examples, rng, steps, lr, warmup, max_tokens, dev,
              fq=None, deadline=None, label="train", history=None):
    """`steps` AdamW steps (cosine from lr to lr/10 after warmup); returns
    the steps done (fewer only when `deadline` passes first)."""
    order, done, t0 = [], 0, time.time()
    while done < steps:
        if not order:
            order = batches(examples, max_tokens, rng)
        batch = order.pop()
        ids, mask = tensors(torch, examples, batch, dev)
        f = min(1.0, (done + 1) / warmup) if warmup else 1.0
        cos = 0.55 + 0.45 * math.cos(math.pi * done / max(steps, 1))
        for g in opt.param_groups:
            g["lr"] = lr * f * cos
        if fq:
            fq.apply()
        loss = masked_loss(torch, model, ids, mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if fq:
            fq.restore()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        done += 1
        if done % 50 == 0 or done == 1:
            lv = float(loss)
            if history is not None:
                history.append((label, done, lv))
            log(f"{label} step {done}/{steps} loss {lv:.4f} lr {lr * f * cos:.2e} "
                f"batch {tuple(ids.shape)} {time.time() - t0:.0f}s")
        if deadline and time.time() > deadline:
            log(f"{label}: deadline after {done} steps")
            break
    return done


def fitting_max_tokens(torch, model, examples, max_tokens, dev):
    """The largest of max_tokens, max_tokens/2, ... whose worst batch (the
    longest examples: attention memory grows with length) survives a
    forward and backward; no optimizer step."""
    longest = sorted(range(len(examples)), key=lambda i: -len(examples[i][0]))
    while True:
        n = max(1, max_tokens // len(examples[longest[0]][0]))
        try:
            ids, mask = tensors(torch, examples, longest[:n], dev)
            masked_loss(torch, model, ids, mask).backward()
            model.zero_grad(set_to_none=True)
            if dev.type == "cuda":
                log(f"max tokens {max_tokens}: worst batch {tuple(ids.shape)} fits, peak "
                    f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
            return max_tokens
        except torch.cuda.OutOfMemoryError:
            model.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            if max_tokens <= 8192:
                raise
            log(f"max tokens {max_tokens}: out of memory, halving")
            max_tokens //= 2


def round_robin(evals):
    """One prompt of each kind in turn, so a time budget that stops early
    still covers every kind."""
    by_kind = {}
    for e in evals:
        by_kind.setdefault(e["kind"], []).append(e)
    out, queues = [], list(by_kind.values())
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def held_loss(torch, model, examples, dev, max_tokens, fq=None):
    rng = random.Random(0)
    tot, n = 0.0, 0
    with torch.no_grad():
        for b in batches(examples, max_tokens, rng)[:8]:
            ids, mask = tensors(torch, examples, b, dev)
            if fq:
                fq.apply()
            tot += float(masked_loss(torch, model, ids, mask)) * int(mask[:, 1:].sum())
            if fq:
                fq.restore()
            n += int(mask[:, 1:].sum())
    return tot / max(n, 1)


def write_info(out, info):
    with open(os.path.join(out, "train.json"), "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--eval", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--train-seconds", type=float, default=200)
    ap.add_argument("--qat-seconds", type=float, default=40)
    ap.add_argument("--train-steps", type=int, help="instead of --train-seconds")
    ap.add_argument("--qat-steps", type=int, help="instead of --qat-seconds")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--qat-lr", type=float, default=3e-4)
    ap.add_argument("--max-tokens", type=int, default=65536,
                    help="padded tokens per batch (halved until the longest batch fits)")
    ap.add_argument("--max-new", type=int, default=256,
                    help="greedy tokens per held-out prompt (12 x 12 with its working while thinking: 200)")
    ap.add_argument("--eval-seconds", type=float, default=120,
                    help="greedy held-out prompts, taken round-robin over the kinds")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args(argv)

    import torch
    t_start = time.time()
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = torch.device(a.device)
    rng = random.Random(a.seed)

    p = dict(mt.PRESETS["demo"])
    p["vocab_size"] = mt.tokenizer_vocab_size(a.tokenizer)
    p["seed"] = a.seed
    mt.validate(p)
    cfg = mt.released_config(p)
    template = mt.gen_weights(p)
    model, notes = build(p, cfg, dev)
    model = load_released(model, template, p, dev)
    model.train()
    kinds = quant_kinds(model, template)
    log(f"model: {sum(x.numel() for x in model.parameters())} parameters, "
        f"{sum(k == 'fp8' for k in kinds.values())} fp8 / {sum(k == 'fp4' for k in kinds.values())} "
        f"fp4 / {sum(k == 'bf16' for k in kinds.values())} bf16 tensors; notes {notes}")

    data = read_train(a.data)
    rng.shuffle(data)
    held_out, train = data[:256], data[256:]
    log(f"data: {len(train)} train / {len(held_out)} held-out examples, "
        f"{sum(len(x) for x, _ in train)} tokens")

    decay = [x for n, x in model.named_parameters() if x.dim() >= 2]
    other = [x for n, x in model.named_parameters() if x.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    history = []
    a.max_tokens = fitting_max_tokens(torch, model, train, a.max_tokens, dev)
    # time a few steps to turn the budget into a step count
    run_phase(torch, model, opt, train, rng, 2, a.lr * 0.1, 2, a.max_tokens, dev,
              label="warmup", history=history)
    t0 = time.time()
    probe = run_phase(torch, model, opt, train, rng, 5, a.lr * 0.1, 0, a.max_tokens, dev,
                      label="probe", history=history)
    torch.cuda.synchronize() if dev.type == "cuda" else None
    step_s = (time.time() - t0) / probe
    train_steps = a.train_steps or max(10, int(a.train_seconds / step_s))
    log(f"{step_s:.3f} s/step -> {train_steps} train steps")
    t0 = time.time()
    done = run_phase(torch, model, opt, train, rng, train_steps, a.lr, 100, a.max_tokens, dev,
                     deadline=None if a.train_steps else t0 + a.train_seconds * 1.05,
                     history=history)
    train_s = time.time() - t0
    model.eval()
    loss_float = held_loss(torch, model, held_out, dev, a.max_tokens)
    fq = FakeQuant(torch, model, kinds)
    loss_q_before = held_loss(torch, model, held_out, dev, a.max_tokens, fq)
    log(f"held-out loss: float {loss_float:.4f}, quantized before QAT {loss_q_before:.4f}")
    model.train()
    qat_steps = a.qat_steps or max(5, int(a.qat_seconds / (step_s * 1.1)))
    t0 = time.time()
    qdone = run_phase(torch, model, opt, train, rng, qat_steps, a.qat_lr, 0, a.max_tokens, dev,
                      fq=fq, deadline=None if a.qat_steps else t0 + a.qat_seconds * 1.05,
                      label="qat", history=history)
    qat_s = time.time() - t0
    model.eval()
    loss_q_after = held_loss(torch, model, held_out, dev, a.max_tokens, fq)

    files = export(model, template, p, cfg, a.out, a.tokenizer)
    # Reload what was written: the evaluation runs the released weights.
    ref, _ = build(p, cfg, dev)
    ref = load_released(ref, mt.read_checkpoint(a.out), p, dev).eval()
    loss_export = held_loss(torch, ref, held_out, dev, a.max_tokens)
    log(f"held-out loss: quantized after QAT {loss_q_after:.4f}, exported {loss_export:.4f}")

    cmd = ["python3", "tools/train_demo_v4.py"] + [x for x in argv]
    info = {
        "command": " ".join(shlex.quote(x) for x in cmd),
        "reproduce": (f"--train-steps {done} --qat-steps {qdone} --seed {a.seed} "
                      f"--max-tokens {a.max_tokens}"),
        "versions": {"torch": torch.__version__,
                     "transformers": __import__("transformers").__version__,
                     "numpy": np.__version__},
        "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
        "train_steps": done, "qat_steps": qdone, "seconds_per_step": step_s,
        "max_tokens": a.max_tokens,
        "train_seconds": train_s, "qat_seconds": qat_s,
        "held_out_loss": {"float": loss_float, "quantized_before_qat": loss_q_before,
                          "quantized_after_qat": loss_q_after, "exported": loss_export},
        "history": history, "files": files, "eval_prompts": 0,
        "total_seconds": time.time() - t_start, "notes": notes,
    }
    write_info(a.out, info)       # before the eval: a run cut short keeps it
    t0, n_eval = time.time(), 0
    with open(a.eval) as f:
        prompts = round_robin([json.loads(line) for line in f])
    with open(os.path.join(a.out, "eval_hf.jsonl"), "w") as g:
        for e in prompts:
            if time.time() - t0 > a.eval_seconds:
                log("eval: time budget spent")
                break
            ids = greedy(torch, ref, e["prompt_ids"], a.max_new)
            g.write(json.dumps({"id": e["id"], "completion_ids": ids}) + "\n")
            g.flush()
            n_eval += 1
    log(f"eval: {n_eval} prompts in {time.time() - t0:.0f}s")

    info["eval_prompts"], info["total_seconds"] = n_eval, time.time() - t_start
    write_info(a.out, info)
    log("done", json.dumps({k: info[k] for k in ("train_steps", "qat_steps", "held_out_loss")}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
