#!/usr/bin/env python3
"""Tiny random DeepSeek V4 checkpoints in the released format, plus golden
logits from transformers' DeepseekV4ForCausalLM.

    python3 tools/make_tiny_v4.py --preset tiny-a --out DIR            # + golden
    python3 tools/make_tiny_v4.py --preset tiny-a --out DIR --no-golden  # numpy only

The checkpoint part (config.json, safetensors, FP8/MXFP4 encoding) needs only
numpy.  The golden part re-reads the written files, dequantizes them exactly,
loads them into DeepseekV4ForCausalLM (float32, eager) with strict key
checking and writes logits.f32, ids.txt and golden.json.  See
tests/fixtures/README.md for the presets and what each file holds.
"""
import argparse
import hashlib
import json
import math
import os
import re
import shlex
import shutil
import struct
import sys
import time

import numpy as np

# ---------------------------------------------------------------- presets --
# Every field can be overridden on the command line (--hidden-size 256 ...).
# compress_ratios lists the main layers only (its length is the layer count);
# config.json gets one trailing 0 per draft (mtp) layer, as the release does.
PRESETS = {
    "tiny-a": dict(
        vocab_size=512, hidden_size=128, compress_ratios=[0, 4, 8],
        num_attention_heads=4, head_dim=64, qk_rope_head_dim=16,
        q_lora_rank=96, o_groups=2, o_lora_rank=64,
        n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
        n_shared_experts=1, num_hash_layers=1, sliding_window=32,
        index_n_heads=8, index_head_dim=32, index_topk=8,
        hc_mult=2, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
        rope_theta=10000.0, compress_rope_theta=160000.0,
        yarn_factor=16.0, yarn_original_max_position_embeddings=65536,
        yarn_beta_fast=32.0, yarn_beta_slow=1.0,
        num_nextn_predict_layers=2, swiglu_limit=2.5,
        routed_scaling_factor=1.5,
        seed=1, n_ids=320, tid2eid_dtype="i64", shards=1),
    "tiny-b": dict(
        vocab_size=384, hidden_size=160, compress_ratios=[4, 128, 0, 4],
        num_attention_heads=6, head_dim=32, qk_rope_head_dim=16,
        q_lora_rank=144, o_groups=3, o_lora_rank=48,
        n_routed_experts=12, num_experts_per_tok=3, moe_intermediate_size=32,
        n_shared_experts=1, num_hash_layers=2, sliding_window=64,
        index_n_heads=8, index_head_dim=32, index_topk=12,
        hc_mult=4, hc_sinkhorn_iters=7, hc_eps=1e-6, rms_norm_eps=1e-6,
        rope_theta=5000.0, compress_rope_theta=40000.0,
        yarn_factor=8.0, yarn_original_max_position_embeddings=2048,
        yarn_beta_fast=16.0, yarn_beta_slow=2.0,
        num_nextn_predict_layers=1, swiglu_limit=3.0,
        routed_scaling_factor=2.5,
        seed=2, n_ids=400, tid2eid_dtype="i32", shards=3),
    # The `make run` model: vocab_size comes from --tokenizer.
    "demo": dict(
        vocab_size=None, hidden_size=256, compress_ratios=[0, 4, 128, 4],
        num_attention_heads=8, head_dim=64, qk_rope_head_dim=16,
        q_lora_rank=192, o_groups=4, o_lora_rank=128,
        n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
        n_shared_experts=1, num_hash_layers=1, sliding_window=128,
        index_n_heads=8, index_head_dim=32, index_topk=16,
        hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
        rope_theta=10000.0, compress_rope_theta=160000.0,
        yarn_factor=16.0, yarn_original_max_position_embeddings=65536,
        yarn_beta_fast=32.0, yarn_beta_slow=1.0,
        num_nextn_predict_layers=1, swiglu_limit=10.0,
        routed_scaling_factor=1.5,
        seed=3, n_ids=300, tid2eid_dtype="i64", shards=2),
}

INT_FIELDS = ["vocab_size", "hidden_size", "num_attention_heads", "head_dim",
              "qk_rope_head_dim", "q_lora_rank", "o_groups", "o_lora_rank",
              "n_routed_experts", "num_experts_per_tok",
              "moe_intermediate_size", "n_shared_experts", "num_hash_layers",
              "sliding_window", "index_n_heads", "index_head_dim",
              "index_topk", "hc_mult", "hc_sinkhorn_iters",
              "yarn_original_max_position_embeddings",
              "num_nextn_predict_layers", "seed", "n_ids", "shards"]
FLOAT_FIELDS = ["hc_eps", "rms_norm_eps", "rope_theta", "compress_rope_theta",
                "yarn_factor", "yarn_beta_fast", "yarn_beta_slow",
                "swiglu_limit", "routed_scaling_factor"]

CSA_RATIO = 4          # DeepSeek's code: overlap/indexer iff compress_ratio == 4
FP8_BLOCK = 128        # quantization_config.weight_block_size
MXFP4_GROUP = 32


class Fail(Exception):
    """A check failed; the message says which."""


def check(cond, msg):
    if not cond:
        raise Fail(msg)


# --------------------------------------------------------- number formats --
def fp8_e4m3_values():
    """All 256 E4M3 (fn) codes as float64; 0x7f/0xff are NaN."""
    b = np.arange(256)
    exp = (b >> 3) & 0xF
    man = (b & 7).astype(np.float64)
    mag = np.where(exp == 0, man / 8.0 * 2.0 ** -6,
                   (1.0 + man / 8.0) * 2.0 ** (exp.astype(np.float64) - 7))
    val = np.where(b & 0x80, -mag, mag)
    val[(b & 0x7F) == 0x7F] = np.nan
    return val


FP4_VALUES = np.array([0, .5, 1, 1.5, 2, 3, 4, 6,
                       -0.0, -.5, -1, -1.5, -2, -3, -4, -6], np.float64)


def _encode_nearest(x, mags, sign_bit, name):
    """Codes of the nearest magnitude in `mags` (ascending, code = index;
    ties go to the even code), plus `sign_bit` for negative x (-0 too)."""
    x = np.asarray(x, np.float64)
    a = np.abs(x)
    check(np.all(np.isfinite(a)) and a.max(initial=0) <= mags[-1],
          f"{name}: value out of range")
    hi = np.clip(np.searchsorted(mags, a), 1, len(mags) - 1)
    lo = hi - 1
    dlo, dhi = a - mags[lo], mags[hi] - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi,
                                            np.where(lo % 2 == 0, lo, hi)))
    return (pick + np.where(np.signbit(x), sign_bit, 0)).astype(np.uint8)


FP8_VALUES = fp8_e4m3_values()


def fp8_e4m3_encode(x):
    return _encode_nearest(x, FP8_VALUES[:0x7F], 0x80, "fp8_e4m3")


def fp4_e2m1_encode(x):
    return _encode_nearest(x, FP4_VALUES[:8], 8, "fp4_e2m1")


def e8m0_value(e):
    e = np.asarray(e)
    check(not np.any(e == 255), "E8M0 scale 0xff is NaN")
    return 2.0 ** (e.astype(np.float64) - 127)


def bf16_bits(x):
    """float32 -> bfloat16 bit patterns, round to nearest even."""
    u = np.asarray(x, np.float32).astype("<f4").view("<u4").astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")


def bf16_value(bits):
    return (np.asarray(bits, "<u2").astype("<u4") << 16).view("<f4")


def fp8_block_quant(w, rng=None):
    """Weight [out, in] -> (E4M3 codes [out, in], E8M0 scales
    [ceil(out/128), ceil(in/128)]).  Each block's exponent is the smallest
    that fits its amax, plus (with rng, for test fixtures) a random 0..3 so
    blocks differ and small codes (subnormals) occur."""
    out, inn = w.shape
    nbo, nbi = -(-out // FP8_BLOCK), -(-inn // FP8_BLOCK)
    codes = np.empty((out, inn), np.uint8)
    scale = np.empty((nbo, nbi), np.uint8)
    for i in range(nbo):
        for j in range(nbi):
            rs = slice(i * FP8_BLOCK, (i + 1) * FP8_BLOCK)
            cs = slice(j * FP8_BLOCK, (j + 1) * FP8_BLOCK)
            blk = w[rs, cs]
            amax = max(float(np.abs(blk).max()), 1e-30)
            e = math.ceil(math.log2(amax / 448.0))
            e += int(rng.integers(0, 4)) if rng is not None else 0
            scale[i, j] = e + 127
            codes[rs, cs] = fp8_e4m3_encode(blk / 2.0 ** e)
    return codes, scale


def fp8_block_dequant(codes, scale):
    out, inn = codes.shape
    check(scale.shape == (-(-out // FP8_BLOCK), -(-inn // FP8_BLOCK)),
          f"fp8 scale shape {scale.shape} does not fit weight {codes.shape}")
    s = np.repeat(np.repeat(e8m0_value(scale), FP8_BLOCK, 0), FP8_BLOCK, 1)
    v = FP8_VALUES[codes] * s[:out, :inn]
    check(not np.any(np.isnan(v)), "fp8 NaN code in weight")
    return v.astype(np.float32)


def mxfp4_quant(w, rng=None):
    """Weight [out, in] -> (packed int8 [out, in/2], low nibble = even
    column; E8M0 scales [out, in/32]).  Exponent per 32-group: smallest that
    fits the amax, plus (with rng) a random 0..1."""
    out, inn = w.shape
    check(inn % MXFP4_GROUP == 0, f"MXFP4 needs in % 32 == 0, got {inn}")
    g = w.reshape(out, inn // MXFP4_GROUP, MXFP4_GROUP)
    amax = np.maximum(np.abs(g).max(-1), 1e-30)
    e = np.ceil(np.log2(amax / 6.0)).astype(np.int64)
    if rng is not None:
        e += rng.integers(0, 2, size=e.shape)
    codes = fp4_e2m1_encode(g / 2.0 ** e[..., None]).reshape(out, inn)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed.view(np.int8), (e + 127).astype(np.uint8)


def mxfp4_dequant(packed, scale):
    out, half = packed.shape
    check(scale.shape == (out, 2 * half // MXFP4_GROUP),
          f"mxfp4 scale shape {scale.shape} does not fit weight {packed.shape}")
    b = packed.view(np.uint8)
    codes = np.empty((out, 2 * half), np.uint8)
    codes[:, 0::2] = b & 0xF
    codes[:, 1::2] = b >> 4
    s = np.repeat(e8m0_value(scale), MXFP4_GROUP, 1)
    return (FP4_VALUES[codes] * s).astype(np.float32)


# ------------------------------------------------------------ safetensors --
ST_DTYPES = {"F32": "<f4", "BF16": "<u2", "F8_E4M3": "u1", "F8_E8M0": "u1",
             "I8": "i1", "I32": "<i4", "I64": "<i8"}


def natural_key(name):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def write_safetensors(path, tensors):
    """tensors: {name: (dtype string, numpy array in storage form)}.
    Wider dtypes first so every tensor stays aligned; no holes."""
    order = sorted(tensors, key=lambda n: (-np.dtype(ST_DTYPES[tensors[n][0]])
                                           .itemsize, natural_key(n)))
    header, blobs, off = {}, [], 0
    for n in order:
        dt, arr = tensors[n]
        raw = np.ascontiguousarray(arr, ST_DTYPES[dt]).tobytes()
        header[n] = {"dtype": dt, "shape": list(arr.shape),
                     "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for raw in blobs:
            f.write(raw)
    return off


def write_checkpoint(outdir, tensors, n_shards):
    """model.safetensors, or n_shards files + model.safetensors.index.json.
    Shards are cut by bytes in natural name order, so a weight and its
    .scale may land in different shards (as in real checkpoints)."""
    names = sorted(tensors, key=natural_key)
    if n_shards <= 1:
        write_safetensors(os.path.join(outdir, "model.safetensors"), tensors)
        return ["model.safetensors"]
    sizes = [tensors[n][1].nbytes for n in names]
    total, acc, shard_of = sum(sizes), 0, []
    for s in sizes:
        shard_of.append(min(n_shards - 1, acc * n_shards // total))
        acc += s
    files, weight_map = [], {}
    for k in range(n_shards):
        fname = f"model-{k + 1:05d}-of-{n_shards:05d}.safetensors"
        part = {n: tensors[n] for n, s in zip(names, shard_of) if s == k}
        check(part, f"shard {fname} would be empty; use fewer shards")
        write_safetensors(os.path.join(outdir, fname), part)
        files.append(fname)
        weight_map.update({n: fname for n in part})
    index = {"metadata": {"total_size": total},
             "weight_map": dict(sorted(weight_map.items(),
                                       key=lambda kv: natural_key(kv[0])))}
    with open(os.path.join(outdir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")
    return files + ["model.safetensors.index.json"]


def read_safetensors(path):
    """{name: (dtype string, numpy array)} from one file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    base, out = 8 + n, {}
    for name, h in header.items():
        b, e = h["data_offsets"]
        arr = np.frombuffer(data, ST_DTYPES[h["dtype"]], (e - b) //
                            np.dtype(ST_DTYPES[h["dtype"]]).itemsize, base + b)
        out[name] = (h["dtype"], arr.reshape(h["shape"]))
    return out


def read_checkpoint(model_dir):
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if not os.path.exists(idx):
        return read_safetensors(os.path.join(model_dir, "model.safetensors"))
    with open(idx) as f:
        weight_map = json.load(f)["weight_map"]
    out = {}
    for fname in sorted(set(weight_map.values())):
        part = read_safetensors(os.path.join(model_dir, fname))
        for n in part:
            check(weight_map.get(n) == fname, f"{fname}: {n} not indexed there")
        out.update(part)
    check(set(out) == set(weight_map), "index weight_map != shard contents")
    return out


# ----------------------------------------------------------------- config --
def layer_kind(ratio):
    return "sliding" if ratio == 0 else "csa" if ratio == CSA_RATIO else "hca"


def validate(p):
    H, nh, hd, rope = (p["hidden_size"], p["num_attention_heads"],
                       p["head_dim"], p["qk_rope_head_dim"])
    L = len(p["compress_ratios"])
    check(L >= 1, "compress_ratios: need at least one layer")
    check(all(r >= 0 for r in p["compress_ratios"]), "compress_ratios: < 0")
    hca = {r for r in p["compress_ratios"] if layer_kind(r) == "hca"}
    check(len(hca) <= 1, f"compress_ratios: one HCA ratio per model "
          f"(transformers has a single compress_rates entry), got {hca}")
    check(rope % 2 == 0 and rope <= hd and rope <= p["index_head_dim"],
          "qk_rope_head_dim must be even and <= head_dim, index_head_dim")
    check(int(hd * (rope / hd)) == rope,
          "head_dim * (qk_rope_head_dim/head_dim) must round back exactly "
          "(transformers derives the rope dim that way)")
    check(nh % p["o_groups"] == 0, "num_attention_heads % o_groups != 0")
    check(H % MXFP4_GROUP == 0 and p["moe_intermediate_size"] % MXFP4_GROUP
          == 0, "hidden_size and moe_intermediate_size must be multiples of 32")
    check(p["num_experts_per_tok"] <= p["n_routed_experts"], "top-k > experts")
    check(0 <= p["num_hash_layers"] <= L, "num_hash_layers > layers")
    check(p["n_shared_experts"] == 1,
          "n_shared_experts must be 1 (transformers builds one shared MLP)")
    check(p["vocab_size"] and p["vocab_size"] >= 2, "vocab_size missing")
    check(p["shards"] >= 1 and p["n_ids"] >= 1, "shards, n_ids must be >= 1")


def released_config(p):
    """config.json with the released field names and layout."""
    L = len(p["compress_ratios"])
    nextn = p["num_nextn_predict_layers"]
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": p["vocab_size"],
        "hidden_size": p["hidden_size"],
        "num_hidden_layers": L,
        "num_attention_heads": p["num_attention_heads"],
        "num_key_value_heads": 1,
        "head_dim": p["head_dim"],
        "qk_rope_head_dim": p["qk_rope_head_dim"],
        "q_lora_rank": p["q_lora_rank"],
        "o_groups": p["o_groups"],
        "o_lora_rank": p["o_lora_rank"],
        "n_routed_experts": p["n_routed_experts"],
        "n_shared_experts": p["n_shared_experts"],
        "num_experts_per_tok": p["num_experts_per_tok"],
        "moe_intermediate_size": p["moe_intermediate_size"],
        "scoring_func": "sqrtsoftplus",
        "norm_topk_prob": True,
        "routed_scaling_factor": p["routed_scaling_factor"],
        "swiglu_limit": p["swiglu_limit"],
        "num_hash_layers": p["num_hash_layers"],
        "sliding_window": p["sliding_window"],
        "index_n_heads": p["index_n_heads"],
        "index_head_dim": p["index_head_dim"],
        "index_topk": p["index_topk"],
        "hc_mult": p["hc_mult"],
        "hc_sinkhorn_iters": p["hc_sinkhorn_iters"],
        "hc_eps": p["hc_eps"],
        "rms_norm_eps": p["rms_norm_eps"],
        "rope_theta": p["rope_theta"],
        "compress_rope_theta": p["compress_rope_theta"],
        "rope_scaling": {
            "type": "yarn",
            "factor": p["yarn_factor"],
            "original_max_position_embeddings":
                p["yarn_original_max_position_embeddings"],
            "beta_fast": p["yarn_beta_fast"],
            "beta_slow": p["yarn_beta_slow"],
        },
        "max_position_embeddings": int(
            p["yarn_factor"] * p["yarn_original_max_position_embeddings"]),
        "num_nextn_predict_layers": nextn,
        "compress_ratios": list(p["compress_ratios"]) + [0] * nextn,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "scale_fmt": "ue8m0",
            "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
        },
        "expert_dtype": "fp4",
    }


# ---------------------------------------------------------------- weights --
class Gen:
    """Random tensors in released storage form, in a fixed order."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.t = {}

    def normal(self, shape, std, mean=0.0):
        return mean + std * self.rng.standard_normal(shape)

    def f32(self, name, arr):
        self.t[name] = ("F32", np.asarray(arr, "<f4"))

    def bf16(self, name, arr):
        self.t[name] = ("BF16", bf16_bits(arr))

    def norm(self, name, n):
        self.bf16(name, self.normal(n, 0.1, 1.0))

    def fp8(self, prefix, out, inn, gain=1.0):
        codes, scale = fp8_block_quant(
            self.normal((out, inn), gain / math.sqrt(inn)), self.rng)
        self.t[prefix + ".weight"] = ("F8_E4M3", codes)
        self.t[prefix + ".scale"] = ("F8_E8M0", scale)

    def fp4(self, prefix, out, inn, gain=1.0):
        packed, scale = mxfp4_quant(
            self.normal((out, inn), gain / math.sqrt(inn)), self.rng)
        self.t[prefix + ".weight"] = ("I8", packed)
        self.t[prefix + ".scale"] = ("F8_E8M0", scale)

    def linear_bf16(self, name, out, inn, gain=1.0):
        self.bf16(name, self.normal((out, inn), gain / math.sqrt(inn)))

    def hc(self, prefix, hc, H, mix, n_scale):
        """Hyper-connection fn [mix, hc*H], base [mix], scale [n_scale]."""
        self.f32(prefix + "_fn", self.normal((mix, hc * H), 1 / math.sqrt(hc * H)))
        self.f32(prefix + "_base", self.normal(mix, 0.5))
        self.f32(prefix + "_scale", self.rng.uniform(0.5, 1.5, n_scale))


# SwiGLU gate/up pre-activations get std ~1.5 so small swiglu_limit values
# actually clamp.
SWIGLU_GAIN = 1.5


def gen_block(g, p, pre, ratio, hashed):
    """One decoder block (main layer or mtp draft) under prefix `pre`."""
    H, nh, hd = p["hidden_size"], p["num_attention_heads"], p["head_dim"]
    qr, hc, E = p["q_lora_rank"], p["hc_mult"], p["n_routed_experts"]
    inter, grp = p["moe_intermediate_size"], p["o_groups"]
    g.norm(pre + "attn_norm.weight", H)
    g.norm(pre + "ffn_norm.weight", H)
    g.hc(pre + "hc_attn", hc, H, (2 + hc) * hc, 3)
    g.hc(pre + "hc_ffn", hc, H, (2 + hc) * hc, 3)
    a = pre + "attn."
    g.fp8(a + "wq_a", qr, H)
    g.norm(a + "q_norm.weight", qr)
    g.fp8(a + "wq_b", nh * hd, qr)
    g.fp8(a + "wkv", hd, H)
    g.norm(a + "kv_norm.weight", hd)
    g.linear_bf16(a + "wo_a.weight", grp * p["o_lora_rank"], nh * hd // grp)
    g.fp8(a + "wo_b", H, grp * p["o_lora_rank"])
    g.f32(a + "attn_sink", g.normal(nh, 1.0))
    kind = layer_kind(ratio)
    if kind != "sliding":
        coff = 2 if kind == "csa" else 1
        g.linear_bf16(a + "compressor.wkv.weight", coff * hd, H)
        g.linear_bf16(a + "compressor.wgate.weight", coff * hd, H)
        g.f32(a + "compressor.ape", g.normal((ratio, coff * hd), 0.5))
        g.norm(a + "compressor.norm.weight", hd)
    if kind == "csa":
        ni, di = p["index_n_heads"], p["index_head_dim"]
        g.fp8(a + "indexer.wq_b", ni * di, qr)
        g.linear_bf16(a + "indexer.weights_proj.weight", ni, H)
        g.linear_bf16(a + "indexer.compressor.wkv.weight", 2 * di, H)
        g.linear_bf16(a + "indexer.compressor.wgate.weight", 2 * di, H)
        g.f32(a + "indexer.compressor.ape", g.normal((CSA_RATIO, 2 * di), 0.5))
        g.norm(a + "indexer.compressor.norm.weight", di)
    f = pre + "ffn."
    g.linear_bf16(f + "gate.weight", E, H)
    if hashed:
        k, V = p["num_experts_per_tok"], p["vocab_size"]
        tid = np.argsort(g.rng.random((V, E)), axis=1)[:, :k]
        if p["tid2eid_dtype"] == "i64":
            g.t[f + "gate.tid2eid"] = ("I64", tid.astype("<i8"))
        else:
            g.t[f + "gate.tid2eid"] = ("I32", tid.astype("<i4"))
    else:
        g.f32(f + "gate.bias", g.normal(E, 0.1))
    for e in range(E):
        g.fp4(f"{f}experts.{e}.w1", inter, H, SWIGLU_GAIN)
        g.fp4(f"{f}experts.{e}.w2", H, inter)
        g.fp4(f"{f}experts.{e}.w3", inter, H, SWIGLU_GAIN)
    g.fp8(f + "shared_experts.w1", inter, H, SWIGLU_GAIN)
    g.fp8(f + "shared_experts.w2", H, inter)
    g.fp8(f + "shared_experts.w3", inter, H, SWIGLU_GAIN)


def gen_weights(p):
    """{released name: (dtype, storage array)} for the whole checkpoint."""
    g = Gen(p["seed"])
    H, hc, V = p["hidden_size"], p["hc_mult"], p["vocab_size"]
    g.bf16("embed.weight", g.normal((V, H), 1.0))
    for i, ratio in enumerate(p["compress_ratios"]):
        gen_block(g, p, f"layers.{i}.", ratio, i < p["num_hash_layers"])
    g.norm("norm.weight", H)
    g.linear_bf16("head.weight", V, H)
    g.hc("hc_head", hc, H, hc, 1)
    # Draft (mtp) layers: the target model ignores them; loaders must skip.
    for k in range(p["num_nextn_predict_layers"]):
        m = f"mtp.{k}."
        g.norm(m + "enorm.weight", H)
        g.norm(m + "hnorm.weight", H)
        g.fp8(m + "e_proj", H, H)
        g.fp8(m + "h_proj", H, H)
        gen_block(g, p, m, 0, False)
        g.norm(m + "norm.weight", H)
        g.hc(m + "hc_head", hc, H, hc, 1)
    return g.t


# ------------------------------------------- released -> transformers names --
# Per-layer renames, following the "deepseek_v4" entry of
# transformers/conversion_mapping.py (routed experts are fused separately).
LAYER_RENAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "hc_attn_fn": "attn_hc.fn",
    "hc_attn_base": "attn_hc.base",
    "hc_attn_scale": "attn_hc.scale",
    "hc_ffn_fn": "ffn_hc.fn",
    "hc_ffn_base": "ffn_hc.base",
    "hc_ffn_scale": "ffn_hc.scale",
    "attn.wq_a.weight": "self_attn.q_a_proj.weight",
    "attn.q_norm.weight": "self_attn.q_a_norm.weight",
    "attn.wq_b.weight": "self_attn.q_b_proj.weight",
    "attn.wkv.weight": "self_attn.kv_proj.weight",
    "attn.kv_norm.weight": "self_attn.kv_norm.weight",
    "attn.wo_a.weight": "self_attn.o_a_proj.weight",
    "attn.wo_b.weight": "self_attn.o_b_proj.weight",
    "attn.attn_sink": "self_attn.sinks",
    "attn.compressor.wkv.weight": "self_attn.compressor.kv_proj.weight",
    "attn.compressor.wgate.weight": "self_attn.compressor.gate_proj.weight",
    "attn.compressor.ape": "self_attn.compressor.position_bias",
    "attn.compressor.norm.weight": "self_attn.compressor.kv_norm.weight",
    "attn.indexer.wq_b.weight": "self_attn.compressor.indexer.q_b_proj.weight",
    "attn.indexer.weights_proj.weight":
        "self_attn.compressor.indexer.scorer.weights_proj.weight",
    "attn.indexer.compressor.wkv.weight":
        "self_attn.compressor.indexer.kv_proj.weight",
    "attn.indexer.compressor.wgate.weight":
        "self_attn.compressor.indexer.gate_proj.weight",
    "attn.indexer.compressor.ape": "self_attn.compressor.indexer.position_bias",
    "attn.indexer.compressor.norm.weight":
        "self_attn.compressor.indexer.kv_norm.weight",
    "ffn.gate.weight": "mlp.gate.weight",
    "ffn.gate.bias": "mlp.gate.e_score_correction_bias",
    "ffn.gate.tid2eid": "mlp.gate.tid2eid",
    "ffn.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
    "ffn.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
}
TOP_RENAMES = {
    "embed.weight": "model.embed_tokens.weight",
    "head.weight": "lm_head.weight",
    "norm.weight": "model.norm.weight",
    "hc_head_fn": "model.hc_head.hc_fn",
    "hc_head_base": "model.hc_head.hc_base",
    "hc_head_scale": "model.hc_head.hc_scale",
}
EXPERT_RE = re.compile(r"^layers\.(\d+)\.ffn\.experts\.(\d+)\.(w[123])\.weight$")


def dequantize(ckpt):
    """{released name: float32 or int64 array}; `.scale` companions are
    folded into their weights."""
    out = {}
    for name, (dt, arr) in ckpt.items():
        if name.endswith(".scale"):
            check(name[:-6] + ".weight" in ckpt, f"{name}: no weight for scale")
            continue
        sname = name[:-7] + ".scale" if name.endswith(".weight") else None
        if dt in ("F8_E4M3", "I8"):
            check(sname in ckpt and ckpt[sname][0] == "F8_E8M0",
                  f"{name}: {dt} weight without F8_E8M0 .scale")
            dq = fp8_block_dequant if dt == "F8_E4M3" else mxfp4_dequant
            out[name] = dq(arr, ckpt[sname][1])
        elif dt == "BF16":
            out[name] = bf16_value(arr)
        elif dt == "F32":
            out[name] = arr.astype(np.float32)
        elif dt in ("I32", "I64"):
            out[name] = arr.astype(np.int64)
        else:
            raise Fail(f"{name}: unexpected dtype {dt}")
    return out


def hf_state_arrays(ckpt, p):
    """The transformers state dict (numpy) for a released checkpoint:
    renamed, routed experts fused to gate_up_proj [E, 2I, H] (w1 rows then
    w3 rows) and down_proj [E, H, I]; mtp.* skipped."""
    vals = dequantize(ckpt)
    sd, experts = {}, {}
    for name, v in vals.items():
        if name.startswith("mtp."):
            continue
        if name in TOP_RENAMES:
            sd[TOP_RENAMES[name]] = v
            continue
        m = EXPERT_RE.match(name)
        if m:
            experts[(int(m.group(1)), int(m.group(2)), m.group(3))] = v
            continue
        m = re.match(r"^layers\.(\d+)\.(.+)$", name)
        check(m and m.group(2) in LAYER_RENAMES, f"{name}: no transformers name")
        sd[f"model.layers.{m.group(1)}.{LAYER_RENAMES[m.group(2)]}"] = v
    E = p["n_routed_experts"]
    for i in range(len(p["compress_ratios"])):
        try:
            w = {k: [experts.pop((i, e, k)) for e in range(E)]
                 for k in ("w1", "w2", "w3")}
        except KeyError as ex:
            raise Fail(f"layer {i}: missing routed expert tensor {ex}")
        pre = f"model.layers.{i}.mlp.experts."
        sd[pre + "gate_up_proj"] = np.stack(
            [np.concatenate([a, b], 0) for a, b in zip(w["w1"], w["w3"])])
        sd[pre + "down_proj"] = np.stack(w["w2"])
    check(not experts, f"expert tensors for unknown layers: {sorted(experts)[:3]}")
    return sd


INV_TOP = {v: k for k, v in TOP_RENAMES.items()}
INV_LAYER = {v: k for k, v in LAYER_RENAMES.items()}
FUSED_EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def released_name(name):
    """(layer or None, released name) of a transformers tensor name; for
    the fused routed experts, (layer, the transformers suffix)."""
    if name in INV_TOP:
        return None, INV_TOP[name]
    m = re.match(r"^model\.layers\.(\d+)\.(.+)$", name)
    check(m and (m.group(2) in INV_LAYER or m.group(2) in FUSED_EXPERTS),
          f"{name}: no released name")
    i, rest = m.group(1), m.group(2)
    return i, rest if rest in FUSED_EXPERTS else f"layers.{i}.{INV_LAYER[rest]}"


def released_arrays(sd, p):
    """The inverse of hf_state_arrays: a transformers state dict (numpy,
    float) -> {released name: float array}, routed experts split back into
    w1/w3 ([I, H] each) and w2 ([H, I]).  mtp.* are not in transformers."""
    inter, out = p["moe_intermediate_size"], {}
    for name, v in sd.items():
        i, rel = released_name(name)
        if rel == "mlp.experts.gate_up_proj":
            for e, w in enumerate(v):
                out[f"layers.{i}.ffn.experts.{e}.w1.weight"] = w[:inter]
                out[f"layers.{i}.ffn.experts.{e}.w3.weight"] = w[inter:]
        elif rel == "mlp.experts.down_proj":
            for e, w in enumerate(v):
                out[f"layers.{i}.ffn.experts.{e}.w2.weight"] = w
        else:
            out[rel] = v
    return out


def encode_like(template, values):
    """Released tensors for float `values` ({released name: array}), each in
    the storage form its `template` entry has (FP8 blocks and MXFP4 groups
    with the smallest exponent that fits, BF16 rounded to nearest even,
    F32, integers as they are).  Names only in the template (mtp.*) keep
    the template's tensors."""
    out = {}
    for name, (dt, arr) in template.items():
        if name.endswith(".scale"):
            continue
        if name not in values:
            out[name] = (dt, arr)
            sname = name[:-7] + ".scale"
            if name.endswith(".weight") and sname in template:
                out[sname] = template[sname]
            continue
        v = np.asarray(values[name], np.float64)
        check(v.shape == arr.shape or dt == "I8",
              f"{name}: shape {v.shape} != checkpoint {arr.shape}")
        if dt in ("F8_E4M3", "I8"):
            codes, scale = (fp8_block_quant if dt == "F8_E4M3" else mxfp4_quant)(v)
            out[name] = (dt, codes)
            out[name[:-7] + ".scale"] = ("F8_E8M0", scale)
        elif dt == "BF16":
            out[name] = (dt, bf16_bits(v))
        elif dt == "F32":
            out[name] = (dt, v.astype("<f4"))
        else:
            out[name] = (dt, np.asarray(v, arr.dtype))
    check(set(values) <= set(out), f"not in the checkpoint: {sorted(set(values) - set(out))[:3]}")
    return out


# ------------------------------------------------------------- tokenizer --
def tokenizer_vocab_size(path):
    """max id + 1 over the model vocab and the added tokens."""
    with open(path, encoding="utf-8") as f:
        tok = json.load(f)
    vocab = tok.get("model", {}).get("vocab")
    ids = []
    if isinstance(vocab, dict):
        ids = list(vocab.values())
    elif isinstance(vocab, list):          # Unigram: [[piece, score], ...]
        ids = list(range(len(vocab)))
    ids += [t["id"] for t in tok.get("added_tokens", [])]
    check(ids, f"{path}: no vocab or added_tokens found")
    n = max(ids) + 1
    if len(set(ids)) != n:
        print(f"note: {path}: {n - len(set(ids))} unused ids below {n}")
    return n


# ----------------------------------------------------------------- golden --
def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def make_ids(p, attempt):
    rng = np.random.default_rng([p["seed"], 7, attempt])
    ids = rng.integers(0, p["vocab_size"], p["n_ids"])
    ids[0] = 0                                  # bos
    return ids


def hf_config(cfg, p):
    """(DeepseekV4Config, notes) for the released config.json.
    transformers' legacy compress_ratios translation knows only 0/4/128, so
    layer_types and compress_rates are given explicitly; everything else goes
    through the same legacy kwargs a released config.json would (rope_scaling,
    qk_rope_head_dim, num_hash_layers).  Should transformers not read
    rope_scaling the way the release means it, the rope parameters are given
    explicitly instead and a note says so."""
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import \
        DeepseekV4Config
    names = {"sliding": "sliding_attention", "csa": "compressed_sparse_attention",
             "hca": "heavily_compressed_attention"}
    ratios, L, notes = p["compress_ratios"], len(p["compress_ratios"]), []
    hca = [r for r in ratios if layer_kind(r) == "hca"]
    kw = {k: v for k, v in cfg.items() if k not in (
        "compress_ratios", "quantization_config", "expert_dtype",
        "architectures", "model_type", "torch_dtype")}
    kw["layer_types"] = [names[layer_kind(r)] for r in ratios]
    kw["compress_rates"] = {"compressed_sparse_attention": CSA_RATIO,
                            "heavily_compressed_attention": hca[0] if hca else 128}
    rot = p["qk_rope_head_dim"] / p["head_dim"]
    main_want = {"rope_type": "default", "rope_theta": p["rope_theta"]}
    comp_want = {"rope_type": "yarn", "rope_theta": p["compress_rope_theta"],
                 "factor": p["yarn_factor"], "attention_factor": 1.0,
                 "original_max_position_embeddings":
                     p["yarn_original_max_position_embeddings"],
                 "beta_fast": p["yarn_beta_fast"],
                 "beta_slow": p["yarn_beta_slow"]}

    def build(kwargs):
        c = DeepseekV4Config(**json.loads(json.dumps(kwargs)))
        try:
            c._attn_implementation = "eager"   # V4 supports nothing else
        except Exception:
            pass
        rp = c.rope_parameters
        ok = all(rp["main"].get(k) == v for k, v in main_want.items()) and \
            all(rp["compress"].get(k) == v for k, v in comp_want.items())
        return c, ok

    c, ok = build(kw)
    if not ok:
        notes.append(f"transformers read rope_scaling as {c.rope_parameters}; "
                     "rope_parameters given explicitly instead")
        kw.pop("rope_scaling")
        kw["rope_parameters"] = {
            "main": dict(main_want, partial_rotary_factor=rot),
            "compress": dict(comp_want, partial_rotary_factor=rot)}
        c, ok = build(kw)
        check(ok, f"rope parameters {c.rope_parameters}, want main "
              f"{main_want} compress {comp_want}")
    # The config must mean what config.json says.
    check(c.layer_types == kw["layer_types"], f"layer_types {c.layer_types}")
    check(c.mlp_layer_types == ["hash_moe"] * p["num_hash_layers"] +
          ["moe"] * (L - p["num_hash_layers"]),
          f"mlp_layer_types {c.mlp_layer_types}")
    check(c.qk_rope_head_dim == p["qk_rope_head_dim"],
          f"qk_rope_head_dim {c.qk_rope_head_dim}")
    if set(ratios) <= {0, 4, 128}:   # the released-config path must agree
        kw2 = {k: v for k, v in kw.items()
               if k not in ("layer_types", "compress_rates")}
        kw2["compress_ratios"] = cfg["compress_ratios"]
        c2, _ = build(kw2)
        check(c2.layer_types == c.layer_types and
              c2.compress_rates == c.compress_rates,
              "legacy compress_ratios path disagrees with explicit layer_types")
    return c, notes


class Probe:
    """Forward hooks: top-k margins of the router and the indexer, clamp
    activity of the shared experts, residual size per layer.  Margins are
    (k-th best - (k+1)-th best) / std of the row's candidates; a tiny margin
    means a float32 rounding difference could flip the selection."""

    def __init__(self, model, p):
        import torch
        self.torch, self.p, self.on = torch, p, False
        self.reset()
        for name, mod in model.named_modules():
            cls = type(mod).__name__
            if cls == "DeepseekV4TopKRouter":
                mod.register_forward_hook(self.router)
            elif cls == "DeepseekV4IndexerScorer":
                mod.register_forward_hook(self.indexer)
            elif cls == "DeepseekV4DecoderLayer":
                mod.register_forward_hook(self.layer)
            elif name.endswith("shared_experts.gate_proj"):
                mod.register_forward_hook(self.clamp_gate)
            elif name.endswith("shared_experts.up_proj"):
                mod.register_forward_hook(self.clamp_up)

    def reset(self):
        self.router_gaps, self.index_gaps, self.layer_rms = [], [], []
        self.index_rows_sparse = 0
        self.clamped = self.clamp_total = 0

    def _gap(self, v, k):
        torch = self.torch
        s = torch.sort(v, descending=True).values
        spread = s.std() if s.numel() > 1 else torch.tensor(1.0)
        return float((s[k - 1] - s[k]) / max(float(spread), 1e-30))

    def router(self, mod, inp, out):
        if not self.on:
            return
        scores = mod.score_fn(out[0]) + mod.e_score_correction_bias
        k = mod.top_k
        if k < scores.shape[-1]:
            self.router_gaps += [self._gap(r, k) for r in scores]

    def indexer(self, mod, inp, out):
        # Full no-cache pass only: query t is position t.
        if not self.on:
            return
        scores = out[0]                                   # [S, T]
        k = self.p["index_topk"]
        for t in range(scores.shape[0]):
            valid = (t + 1) // CSA_RATIO
            if valid > k:
                self.index_rows_sparse += 1
                self.index_gaps.append(self._gap(scores[t, :valid], k))

    def layer(self, mod, inp, out):
        if self.on:
            self.layer_rms.append(float(out.float().pow(2).mean().sqrt()))

    def clamp_gate(self, mod, inp, out):
        if self.on:
            self.clamped += int((out > self.p["swiglu_limit"]).sum())
            self.clamp_total += out.numel()

    def clamp_up(self, mod, inp, out):
        if self.on:
            self.clamped += int((out.abs() > self.p["swiglu_limit"]).sum())
            self.clamp_total += out.numel()


def run_chunks(model, ids, sizes):
    """Logits through the cache, feeding `sizes` tokens per call."""
    import torch
    pkv, outs, pos = None, [], 0
    for n in sizes:
        o = model(input_ids=ids[:, pos:pos + n], past_key_values=pkv,
                  use_cache=True)
        pkv, pos = o.past_key_values, pos + n
        outs.append(o.logits[0])
    check(pos == ids.shape[1], "chunk sizes do not cover the sequence")
    return torch.cat(outs, 0)


def cache_modes(T):
    """Cache-path schedules: one call; the engine's `incremental` mode (first
    half as one prefill, then one token at a time); irregular chunks."""
    irregular, pat, pos = [], [37, 1, 1, 64, 5, 16, 3, 100, 2, 29], 0
    while pos < T:
        n = min(pat[len(irregular) % len(pat)], T - pos)
        irregular.append(n)
        pos += n
    return {"full_with_cache": [T],
            "incremental": [T // 2] + [1] * (T - T // 2),
            "chunked": irregular}


def golden(outdir, cfg, p, args):
    import torch
    import transformers
    from transformers.activations import ACT2FN
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import \
        DeepseekV4ForCausalLM
    t0 = time.time()
    torch.manual_seed(p["seed"])
    dev = torch.device(args.device)
    T, V = p["n_ids"], p["vocab_size"]
    ratios = p["compress_ratios"]
    hca = sorted({r for r in ratios if layer_kind(r) == "hca"})
    # Conditions the fixture exists to exercise.
    check(T >= 300, f"n_ids {T} < 300")
    check(T > p["sliding_window"], "sequence does not exceed the sliding window")
    check(CSA_RATIO in ratios, "no CSA layer")
    check(hca, "no HCA layer")
    check(T // hca[0] >= 2, f"only {T // hca[0]} HCA entries at {T} tokens")
    check(T // CSA_RATIO > p["index_topk"],
          f"index_topk {p['index_topk']} >= CSA entries {T // CSA_RATIO}: "
          "the indexer would select everything")

    x = torch.linspace(-30, 30, 601, dtype=torch.float64)
    check(torch.allclose(ACT2FN["sqrtsoftplus"](x),
                         torch.sqrt(torch.nn.functional.softplus(x))),
          "ACT2FN['sqrtsoftplus'] is not sqrt(softplus(x))")

    hf_cfg, notes = hf_config(cfg, p)
    for n in notes:
        print("note:", n)
    model = DeepseekV4ForCausalLM(hf_cfg).to(torch.float32).eval()
    experts_impl = "default"
    if hasattr(model, "set_experts_implementation"):   # the looped reference
        try:
            model.set_experts_implementation("eager")
            experts_impl = "eager"
        except Exception as ex:
            experts_impl = f"default (set eager failed: {ex})"
            print(f"note: experts implementation: {experts_impl}")
    check(getattr(model.config, "_attn_implementation", None) in (None, "eager"),
          f"attn implementation {model.config._attn_implementation}")
    sd = {k: torch.from_numpy(np.ascontiguousarray(v))
          for k, v in hf_state_arrays(read_checkpoint(outdir), p).items()}
    want = model.state_dict()
    missing, unexpected = sorted(set(want) - set(sd)), sorted(set(sd) - set(want))
    check(not missing and not unexpected,
          f"state dict mismatch: missing {missing} unexpected {unexpected}")
    for k, v in sd.items():
        check(tuple(v.shape) == tuple(want[k].shape),
              f"{k}: shape {tuple(v.shape)} != model {tuple(want[k].shape)}")
        check(v.dtype == want[k].dtype,
              f"{k}: dtype {v.dtype} != model {want[k].dtype}")
    model.load_state_dict(sd, strict=True)
    model.to(dev)
    for k, v in model.state_dict().items():
        check(torch.equal(v.cpu(), sd[k]), f"{k}: not the loaded value")
    check(model.lm_head.weight.data_ptr() !=
          model.model.embed_tokens.weight.data_ptr(), "head tied to embed")

    probe = Probe(model, p)

    def forward(attempt):
        ids = torch.from_numpy(make_ids(p, attempt)).long().unsqueeze(0).to(dev)
        probe.reset()
        probe.on = True
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits[0].float()
        probe.on = False
        return ids, logits, min(probe.router_gaps + probe.index_gaps,
                                default=math.inf)

    # Several id sequences; keep the one whose closest top-k decision is
    # furthest from a tie, so float32 rounding cannot flip a selection.
    margins = [forward(a)[2] for a in range(args.id_tries)]
    attempt = int(np.argmax(margins))
    print("top-k margins per id sequence: " +
          " ".join(f"{m:.2g}" for m in margins) + f" -> #{attempt}")
    check(margins[attempt] >= args.min_margin,
          f"best top-k margin {margins[attempt]:.3g} < {args.min_margin} "
          f"over {args.id_tries} id sequences")
    ids, logits, _ = forward(attempt)
    ids_np = ids[0].cpu().numpy()
    lg = logits.cpu().numpy().astype("<f4")
    check(lg.shape == (T, V), f"logits shape {lg.shape}")
    check(np.all(np.isfinite(lg)), "non-finite logits")
    std = float(lg.std())
    check(0.05 < std < 50, f"logits std {std} outside (0.05, 50)")
    check(all(math.isfinite(r) and r < 1e3 for r in probe.layer_rms),
          f"residual rms per layer {probe.layer_rms}")
    check(probe.index_rows_sparse > 0, "indexer never had more entries than topk")

    cache, errors = {}, []
    for mode, sizes in cache_modes(T).items():
        try:
            with torch.no_grad():
                c = run_chunks(model, ids, sizes).float().cpu().numpy()
            cache[mode] = float(np.abs(c - lg).max())
            print(f"{mode}: max |cache - full| = {cache[mode]:.3g}")
            if cache[mode] > args.cache_tol:
                errors.append(f"{mode}: max abs diff {cache[mode]:.3g} > "
                              f"{args.cache_tol}")
        except Exception as ex:          # keep the golden; report at the end
            cache[mode] = None
            errors.append(f"{mode}: {type(ex).__name__}: {ex}")

    lg.tofile(os.path.join(outdir, "logits.f32"))
    with open(os.path.join(outdir, "ids.txt"), "w") as f:
        f.write(",".join(str(int(i)) for i in ids_np) + "\n")
    n_csa = sum(layer_kind(r) == "csa" for r in ratios)
    info = {
        "fixture": args.preset,
        "command": "python3 " + " ".join(shlex.quote(a) for a in sys.argv),
        "reproduce_checkpoint": f"python3 tools/make_tiny_v4.py {args.preset_args} "
                                "--no-golden --out DIR",
        "versions": {"transformers": transformers.__version__,
                     "torch": torch.__version__, "numpy": np.__version__,
                     "python": sys.version.split()[0]},
        "device": str(dev),
        "dtype": "float32", "attn_implementation": "eager",
        "experts_implementation": experts_impl,
        "ids_file": "ids.txt", "n_ids": T, "ids_sequence": attempt,
        "logits_file": "logits.f32",
        "logits_layout": "little-endian float32, row-major [n_ids, vocab]",
        "logits_shape": [T, V],
        "logits_stats": {"mean": float(lg.mean()), "std": std,
                         "max_abs": float(np.abs(lg).max())},
        "reference_cache_vs_full_max_abs_diff": cache,
        "cache_modes": {"full_with_cache": "one call",
                        "incremental": f"prefill {T // 2}, then 1 token per call",
                        "chunked": cache_modes(T)["chunked"]},
        "conditions": {
            "layer_kinds": [layer_kind(r) for r in ratios],
            "sliding_window": p["sliding_window"],
            "hca_ratio": hca[0], "hca_entries_at_end": T // hca[0],
            "csa_entries_at_end": T // CSA_RATIO,
            "index_topk": p["index_topk"],
            "indexer_rows_with_more_entries_than_topk": probe.index_rows_sparse,
            "csa_layers": n_csa,
        },
        "topk_margins": {
            "min_router": min(probe.router_gaps, default=None),
            "min_indexer": min(probe.index_gaps, default=None),
            "required": args.min_margin,
            "definition": "(kth - (k+1)th score) / std of the row's candidates",
        },
        "shared_expert_clamp_fraction":
            probe.clamped / max(probe.clamp_total, 1),
        "residual_rms_per_layer": probe.layer_rms,
        "files": {f: sha256(os.path.join(outdir, f))
                  for f in sorted(os.listdir(outdir)) if f != "golden.json"},
        "seconds": round(time.time() - t0, 1),
        "notes": notes,
        "errors": errors,
    }
    with open(os.path.join(outdir, "golden.json"), "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
    print(f"golden: {T} ids, logits std {std:.3f}, margins router "
          f"{info['topk_margins']['min_router']} indexer "
          f"{info['topk_margins']['min_indexer']}, "
          f"{time.time() - t0:.1f}s")
    check(not errors, "; ".join(errors))


# ------------------------------------------------------------------- main --
def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--preset", required=True, choices=sorted(PRESETS))
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--no-golden", action="store_true",
                    help="write only the checkpoint (numpy only, no torch)")
    ap.add_argument("--tokenizer", help="tokenizer.json: vocab_size from it, "
                    "copied into the output directory")
    ap.add_argument("--device", default="cpu", help="torch device (golden)")
    ap.add_argument("--min-margin", type=float, default=1e-4,
                    help="smallest relative top-k margin accepted")
    ap.add_argument("--id-tries", type=int, default=32,
                    help="id sequences tried; the best top-k margin wins")
    ap.add_argument("--cache-tol", type=float, default=1e-3,
                    help="max |cache path - full| logits allowed")
    for f in INT_FIELDS + FLOAT_FIELDS:
        ap.add_argument("--" + f.replace("_", "-"), dest=f,
                        type=int if f in INT_FIELDS else float)
    ap.add_argument("--compress-ratios",
                    type=lambda s: [int(x) for x in s.split(",")],
                    help="per main layer, e.g. 0,4,128 (0 sliding, 4 CSA, "
                    "other HCA)")
    ap.add_argument("--tid2eid-dtype", choices=["i64", "i32"])
    return ap.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    p = dict(PRESETS[args.preset])
    overrides = []
    for f in INT_FIELDS + FLOAT_FIELDS + ["compress_ratios", "tid2eid_dtype"]:
        v = getattr(args, f)
        if v is not None:
            p[f] = v
            flag = "--" + f.replace("_", "-")
            val = ",".join(map(str, v)) if isinstance(v, list) else str(v)
            overrides.append(f"{flag} {val}")
    if args.tokenizer:
        p["vocab_size"] = tokenizer_vocab_size(args.tokenizer)
        overrides.append(f"--tokenizer {shlex.quote(args.tokenizer)}")
    args.preset_args = " ".join([f"--preset {args.preset}"] + overrides)
    validate(p)
    cfg = released_config(p)
    os.makedirs(args.out, exist_ok=True)
    for f in os.listdir(args.out):       # a stale shard would confuse loaders
        if f.endswith(".safetensors") or f.endswith(".index.json"):
            os.remove(os.path.join(args.out, f))
    t0 = time.time()
    tensors = gen_weights(p)
    files = write_checkpoint(args.out, tensors, p["shards"])
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    if args.tokenizer:
        shutil.copyfile(args.tokenizer, os.path.join(args.out, "tokenizer.json"))
        tc = os.path.join(os.path.dirname(args.tokenizer), "tokenizer_config.json")
        if os.path.exists(tc):
            shutil.copyfile(tc, os.path.join(args.out, "tokenizer_config.json"))
    size = sum(os.path.getsize(os.path.join(args.out, f)) for f in files)
    print(f"{args.preset}: {len(tensors)} tensors, {size / 1e6:.2f} MB in "
          f"{len(files)} file(s), vocab {p['vocab_size']}, layers "
          f"{p['compress_ratios']}, {time.time() - t0:.1f}s -> {args.out}")
    if not args.no_golden:
        golden(args.out, cfg, p, args)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Fail as e:
        print(f"make_tiny_v4: FAILED: {e}", file=sys.stderr)
        sys.exit(1)
