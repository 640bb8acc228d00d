#!/usr/bin/env python3
"""Tests for tools/make_tiny_v4.py's numpy part (formats, safetensors,
released names and shapes, the transformers state dict).  Needs only
numpy:  python3 tools/test_make_tiny_v4.py

The expected values here are computed independently of the generator: the
number formats from their bit definitions, the tensor list from the
released-format table of DEEPSEEK_V4.md, the transformers names and shapes
from the module definitions of modeling_deepseek_v4.py."""
import hashlib
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_tiny_v4 as mt  # noqa: E402

SCRIPT = os.path.join(HERE, "make_tiny_v4.py")


def fp8_ref(code):
    """E4M3 (fn) from its bits."""
    s, e, m = code >> 7, (code >> 3) & 15, code & 7
    if e == 15 and m == 7:
        return math.nan
    v = math.ldexp(m / 8, -6) if e == 0 else math.ldexp(1 + m / 8, e - 7)
    return -v if s else v


FP8_REF = np.array([fp8_ref(c) for c in range(256)])
E2M1_REF = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def fp4_ref(code):
    v = E2M1_REF[code & 7]
    return -v if code & 8 else v


# ------------------------------------------------------------ tiny reader --
ITEMSIZE = {"F32": 4, "BF16": 2, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1,
            "I32": 4, "I64": 8}


def read_st(path):
    """Parse one safetensors file; assert its layout is well formed."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    assert n % 8 == 0, f"{path}: header length {n} not 8-aligned"
    hdr = json.loads(data[8:8 + n].decode("utf-8"))
    hdr.pop("__metadata__", None)
    spans = sorted(tuple(h["data_offsets"]) for h in hdr.values())
    pos = 0
    for b, e in spans:
        assert b == pos, f"{path}: hole or overlap at {b}"
        pos = e
    assert 8 + n + pos == len(data), f"{path}: data does not end the file"
    out = {}
    for name, h in hdr.items():
        b, e = h["data_offsets"]
        count = int(np.prod(h["shape"])) if h["shape"] else 1
        assert e - b == count * ITEMSIZE[h["dtype"]], f"{name}: size"
        out[name] = (h["dtype"], h["shape"], data[8 + n + b:8 + n + e])
    return out


def read_dir(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if not os.path.exists(idx):
        return read_st(os.path.join(d, "model.safetensors")), None
    with open(idx) as f:
        index = json.load(f)
    out = {}
    for fname in sorted(set(index["weight_map"].values())):
        part = read_st(os.path.join(d, fname))
        for k in part:
            assert index["weight_map"][k] == fname, k
        out.update(part)
    assert set(out) == set(index["weight_map"])
    assert index["metadata"]["total_size"] == sum(len(v[2]) for v in out.values())
    return out, index


def u8(t):
    return np.frombuffer(t[2], np.uint8).reshape(t[1])


# ------------------------------------------- expected released tensor list --
def expected_tensors(c):
    """{name: (dtype, shape)} per the released-format table."""
    H, nh, hd = c["hidden_size"], c["num_attention_heads"], c["head_dim"]
    qr, g, ol = c["q_lora_rank"], c["o_groups"], c["o_lora_rank"]
    E, I, hc = c["n_routed_experts"], c["moe_intermediate_size"], c["hc_mult"]
    ni, di, V = c["index_n_heads"], c["index_head_dim"], c["vocab_size"]
    L = c["num_hidden_layers"]
    ex = {}

    def fp8(n, o, i):
        ex[n + ".weight"] = ("F8_E4M3", [o, i])
        ex[n + ".scale"] = ("F8_E8M0", [-(-o // 128), -(-i // 128)])

    def fp4(n, o, i):
        ex[n + ".weight"] = ("I8", [o, i // 2])
        ex[n + ".scale"] = ("F8_E8M0", [o, i // 32])

    def block(p, ratio, hashed):
        ex[p + "attn_norm.weight"] = ("BF16", [H])
        ex[p + "ffn_norm.weight"] = ("BF16", [H])
        for s in ("hc_attn", "hc_ffn"):
            ex[p + s + "_fn"] = ("F32", [(2 + hc) * hc, hc * H])
            ex[p + s + "_base"] = ("F32", [(2 + hc) * hc])
            ex[p + s + "_scale"] = ("F32", [3])
        a = p + "attn."
        fp8(a + "wq_a", qr, H)
        ex[a + "q_norm.weight"] = ("BF16", [qr])
        fp8(a + "wq_b", nh * hd, qr)
        fp8(a + "wkv", hd, H)
        ex[a + "kv_norm.weight"] = ("BF16", [hd])
        ex[a + "wo_a.weight"] = ("BF16", [g * ol, nh * hd // g])
        fp8(a + "wo_b", H, g * ol)
        ex[a + "attn_sink"] = ("F32", [nh])
        if ratio:
            w = 2 * hd if ratio == 4 else hd
            ex[a + "compressor.wkv.weight"] = ("BF16", [w, H])
            ex[a + "compressor.wgate.weight"] = ("BF16", [w, H])
            ex[a + "compressor.ape"] = ("F32", [ratio, w])
            ex[a + "compressor.norm.weight"] = ("BF16", [hd])
        if ratio == 4:
            fp8(a + "indexer.wq_b", ni * di, qr)
            ex[a + "indexer.weights_proj.weight"] = ("BF16", [ni, H])
            ex[a + "indexer.compressor.wkv.weight"] = ("BF16", [2 * di, H])
            ex[a + "indexer.compressor.wgate.weight"] = ("BF16", [2 * di, H])
            ex[a + "indexer.compressor.ape"] = ("F32", [4, 2 * di])
            ex[a + "indexer.compressor.norm.weight"] = ("BF16", [di])
        f = p + "ffn."
        ex[f + "gate.weight"] = ("BF16", [E, H])
        if hashed:
            ex[f + "gate.tid2eid"] = (None, [V, c["num_experts_per_tok"]])
        else:
            ex[f + "gate.bias"] = ("F32", [E])
        for e in range(E):
            fp4(f"{f}experts.{e}.w1", I, H)
            fp4(f"{f}experts.{e}.w2", H, I)
            fp4(f"{f}experts.{e}.w3", I, H)
        fp8(f + "shared_experts.w1", I, H)
        fp8(f + "shared_experts.w2", H, I)
        fp8(f + "shared_experts.w3", I, H)

    ex["embed.weight"] = ("BF16", [V, H])
    ex["head.weight"] = ("BF16", [V, H])
    ex["norm.weight"] = ("BF16", [H])
    ex["hc_head_fn"] = ("F32", [hc, hc * H])
    ex["hc_head_base"] = ("F32", [hc])
    ex["hc_head_scale"] = ("F32", [1])
    for i in range(L):
        block(f"layers.{i}.", c["compress_ratios"][i], i < c["num_hash_layers"])
    return ex


def expected_hf(c):
    """{transformers name: shape} from modeling_deepseek_v4.py's modules."""
    H, nh, hd = c["hidden_size"], c["num_attention_heads"], c["head_dim"]
    qr, g, ol = c["q_lora_rank"], c["o_groups"], c["o_lora_rank"]
    E, I, hc = c["n_routed_experts"], c["moe_intermediate_size"], c["hc_mult"]
    ni, di, V = c["index_n_heads"], c["index_head_dim"], c["vocab_size"]
    mix = (2 + hc) * hc
    ex = {"model.embed_tokens.weight": [V, H], "lm_head.weight": [V, H],
          "model.norm.weight": [H], "model.hc_head.hc_fn": [hc, hc * H],
          "model.hc_head.hc_base": [hc], "model.hc_head.hc_scale": [1]}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        r = c["compress_ratios"][i]
        ex.update({
            p + "input_layernorm.weight": [H],
            p + "post_attention_layernorm.weight": [H],
            p + "attn_hc.fn": [mix, hc * H], p + "attn_hc.base": [mix],
            p + "attn_hc.scale": [3],
            p + "ffn_hc.fn": [mix, hc * H], p + "ffn_hc.base": [mix],
            p + "ffn_hc.scale": [3],
            p + "self_attn.q_a_proj.weight": [qr, H],
            p + "self_attn.q_a_norm.weight": [qr],
            p + "self_attn.q_b_proj.weight": [nh * hd, qr],
            p + "self_attn.kv_proj.weight": [hd, H],
            p + "self_attn.kv_norm.weight": [hd],
            p + "self_attn.o_a_proj.weight": [g * ol, nh * hd // g],
            p + "self_attn.o_b_proj.weight": [H, g * ol],
            p + "self_attn.sinks": [nh],
            p + "mlp.gate.weight": [E, H],
            p + "mlp.experts.gate_up_proj": [E, 2 * I, H],
            p + "mlp.experts.down_proj": [E, H, I],
            p + "mlp.shared_experts.gate_proj.weight": [I, H],
            p + "mlp.shared_experts.up_proj.weight": [I, H],
            p + "mlp.shared_experts.down_proj.weight": [H, I],
        })
        if i < c["num_hash_layers"]:
            ex[p + "mlp.gate.tid2eid"] = [V, c["num_experts_per_tok"]]
        else:
            ex[p + "mlp.gate.e_score_correction_bias"] = [E]
        if r:
            w = 2 * hd if r == 4 else hd
            q = p + "self_attn.compressor."
            ex.update({q + "kv_proj.weight": [w, H], q + "gate_proj.weight": [w, H],
                       q + "position_bias": [r, w], q + "kv_norm.weight": [hd]})
        if r == 4:
            q = p + "self_attn.compressor.indexer."
            ex.update({q + "kv_proj.weight": [2 * di, H],
                       q + "gate_proj.weight": [2 * di, H],
                       q + "position_bias": [4, 2 * di],
                       q + "kv_norm.weight": [di],
                       q + "q_b_proj.weight": [ni * di, qr],
                       q + "scorer.weights_proj.weight": [ni, H]})
    return ex


def generate(outdir, *args):
    r = subprocess.run([sys.executable, SCRIPT, "--out", outdir, "--no-golden",
                        *args], capture_output=True, text=True)
    return r


class Formats(unittest.TestCase):
    def test_fp8_table(self):
        got = mt.FP8_VALUES
        nan = np.isnan(FP8_REF)
        self.assertEqual(list(np.where(nan)[0]), [0x7F, 0xFF])
        self.assertTrue(np.array_equal(np.isnan(got), nan))
        self.assertTrue(np.array_equal(got[~nan], FP8_REF[~nan]))
        self.assertEqual(FP8_REF[0x01], 2.0 ** -9)          # smallest subnormal
        self.assertEqual(FP8_REF[0x07], 7 / 8 * 2.0 ** -6)  # largest subnormal
        self.assertEqual(FP8_REF[0x38], 1.0)
        self.assertEqual(FP8_REF[0x7E], 448.0)
        self.assertEqual(FP8_REF[0xFE], -448.0)

    def test_fp8_encode(self):
        codes = np.array([c for c in range(256) if c not in (0x7F, 0xFF)])
        self.assertTrue(np.array_equal(mt.fp8_e4m3_encode(FP8_REF[codes]), codes))
        x = np.random.default_rng(0).standard_normal(20000) * 30
        x = np.concatenate([x, x * 1e-3, [0.0, -0.0, 448.0, -448.0]])
        y = FP8_REF[mt.fp8_e4m3_encode(x)]
        finite = FP8_REF[~np.isnan(FP8_REF)]
        best = np.abs(x[:, None] - finite[None, :]).min(1)
        self.assertTrue(np.all(np.abs(x - y) <= best))
        self.assertTrue(np.array_equal(np.signbit(y), np.signbit(x)))
        with self.assertRaises(mt.Fail):
            mt.fp8_e4m3_encode(np.array([449.0]))

    def test_fp4(self):
        self.assertEqual([float(v) for v in mt.FP4_VALUES],
                         [fp4_ref(c) for c in range(16)])
        self.assertTrue(np.signbit(mt.FP4_VALUES[8]))
        codes = np.arange(16)
        self.assertTrue(np.array_equal(
            mt.fp4_e2m1_encode(mt.FP4_VALUES[codes]), codes))
        x = np.random.default_rng(1).uniform(-6, 6, 5000)
        y = mt.FP4_VALUES[mt.fp4_e2m1_encode(x)]
        best = np.abs(x[:, None] - np.array(E2M1_REF + [-v for v in E2M1_REF])
                      [None, :]).min(1)
        self.assertTrue(np.all(np.abs(x - y) <= best))

    def test_mxfp4_nibble_order(self):
        packed = np.zeros((1, 16), np.uint8)
        packed[0, 0] = 0xF1                     # low nibble 1 (0.5), high 15 (-6)
        packed[0, 1] = 0x2A                     # low 10 (-1), high 2 (1.0)
        scale = np.array([[128]], np.uint8)     # 2^1
        v = mt.mxfp4_dequant(packed.view(np.int8), scale)
        self.assertEqual(v[0, :4].tolist(), [1.0, -12.0, -2.0, 2.0])
        self.assertEqual(v.shape, (1, 32))

    def test_mxfp4_roundtrip(self):
        rng = np.random.default_rng(2)
        w = rng.standard_normal((8, 64)) * 0.1
        packed, scale = mt.mxfp4_quant(w, rng)
        self.assertEqual((packed.dtype, packed.shape), (np.int8, (8, 32)))
        self.assertEqual(scale.shape, (8, 2))
        b = packed.view(np.uint8)
        codes = np.stack([b & 15, b >> 4], -1).reshape(8, 64)
        ref = np.array([[fp4_ref(c) for c in row] for row in codes])
        ref *= np.repeat(2.0 ** (scale.astype(float) - 127), 32, 1)
        self.assertTrue(np.array_equal(mt.mxfp4_dequant(packed, scale), ref))
        # within half a step of the largest code of each group's scale
        step = np.repeat(2.0 ** (scale.astype(float) - 127), 32, 1)
        self.assertTrue(np.all(np.abs(ref - w) <= step + 1e-12))

    def test_fp8_blocks(self):
        rng = np.random.default_rng(3)
        w = rng.standard_normal((300, 200)) * 0.05
        codes, scale = mt.fp8_block_quant(w, rng)
        self.assertEqual(scale.shape, (3, 2))
        i, j = np.meshgrid(np.arange(300) // 128, np.arange(200) // 128,
                           indexing="ij")
        ref = FP8_REF[codes] * 2.0 ** (scale[i, j].astype(float) - 127)
        self.assertTrue(np.array_equal(mt.fp8_block_dequant(codes, scale),
                                       ref.astype(np.float32)))
        err = np.abs(ref - w)
        tol = np.maximum(np.abs(w) / 16, 2.0 ** (scale[i, j] - 127.0 - 10))
        self.assertTrue(np.all(err <= tol))
        with self.assertRaises(mt.Fail):
            mt.fp8_block_dequant(codes, scale[:2])

    def test_bf16(self):
        x = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -2.5, 3e-3, 65504.0],
                     np.float32)
        y = mt.bf16_value(mt.bf16_bits(x))
        # ties go to the even mantissa; 3e-3 = 1.536 * 2^-9 -> 197/128 * 2^-9
        self.assertEqual(y.tolist(), [1.0, 1.0, 1 + 2 ** -6, -2.5,
                                      197 / 128 * 2 ** -9, 65536.0])
        r = np.random.default_rng(4).standard_normal(1000).astype(np.float32)
        z = mt.bf16_value(mt.bf16_bits(r))
        self.assertTrue(np.all(z.view(np.uint32) & 0xFFFF == 0))
        self.assertTrue(np.all(np.abs(z - r) <= np.abs(r) * 2.0 ** -8))


class Checkpoints(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dirs = {}
        for name in ("tiny-a", "tiny-b"):
            d = os.path.join(cls.tmp.name, name)
            r = generate(d, "--preset", name)
            assert r.returncode == 0, r.stderr
            cls.dirs[name] = d

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def load(self, name):
        d = self.dirs[name]
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        return cfg, *read_dir(d)

    def test_config(self):
        for name in self.dirs:
            cfg, _, _ = self.load(name)
            p = mt.PRESETS[name]
            L = len(p["compress_ratios"])
            self.assertEqual(cfg["num_hidden_layers"], L)
            self.assertEqual(cfg["compress_ratios"], p["compress_ratios"] +
                             [0] * cfg["num_nextn_predict_layers"])
            self.assertEqual(cfg["quantization_config"]["weight_block_size"],
                             [128, 128])
            self.assertEqual(cfg["quantization_config"]["scale_fmt"], "ue8m0")
            self.assertEqual(cfg["expert_dtype"], "fp4")
            self.assertEqual(cfg["rope_scaling"]["type"], "yarn")
            self.assertEqual((cfg["bos_token_id"], cfg["eos_token_id"]), (0, 1))
            self.assertIn(4, cfg["compress_ratios"])
            self.assertTrue(any(r not in (0, 4) for r in cfg["compress_ratios"]))
        a, b = self.load("tiny-a")[0], self.load("tiny-b")[0]
        for k in ("hc_mult", "o_groups", "n_routed_experts", "num_hash_layers",
                  "compress_ratios", "hidden_size"):
            self.assertNotEqual(a[k], b[k], k)

    def test_tensor_list(self):
        for name in self.dirs:
            cfg, t, _ = self.load(name)
            ex = expected_tensors(cfg)
            main = {k: v for k, v in t.items() if not k.startswith("mtp.")}
            self.assertEqual(sorted(set(main) ^ set(ex)), [])
            for k, (dt, shape) in ex.items():
                self.assertEqual(t[k][1], shape, k)
                if dt:
                    self.assertEqual(t[k][0], dt, k)
            want = "I64" if mt.PRESETS[name]["tid2eid_dtype"] == "i64" else "I32"
            tids = [k for k in t if k.endswith("tid2eid")]
            self.assertEqual(len(tids), cfg["num_hash_layers"])
            for k in tids:
                self.assertEqual(t[k][0], want)
                a = np.frombuffer(t[k][2], "<i8" if want == "I64" else "<i4")
                a = a.reshape(t[k][1])
                self.assertTrue(a.min() >= 0 and a.max() < cfg["n_routed_experts"])
                self.assertTrue(all(len(set(r)) == len(r) for r in a.tolist()))
            for k in range(cfg["num_nextn_predict_layers"]):
                mtp = [n for n in t if n.startswith(f"mtp.{k}.")]
                self.assertIn(f"mtp.{k}.e_proj.weight", mtp)
                self.assertIn(f"mtp.{k}.attn.wq_a.weight", mtp)
                self.assertIn(f"mtp.{k}.ffn.experts.0.w1.weight", mtp)

    def test_sharding(self):
        _, _, idx = self.load("tiny-a")
        self.assertIsNone(idx)
        _, t, idx = self.load("tiny-b")
        files = set(idx["weight_map"].values())
        self.assertEqual(len(files), mt.PRESETS["tiny-b"]["shards"])

    def test_values_exercise_formats(self):
        for name in self.dirs:
            _, t, _ = self.load(name)
            fp8 = np.concatenate([u8(v).ravel() for v in t.values()
                                  if v[0] == "F8_E4M3"])
            self.assertFalse(np.any((fp8 & 0x7F) == 0x7F), "NaN code")
            sub = ((fp8 >> 3) & 15 == 0) & (fp8 & 7 != 0)
            self.assertGreater(sub.sum(), 0, "no FP8 subnormals")
            fp4 = np.concatenate([u8(v).ravel() for v in t.values()
                                  if v[0] == "I8"])
            nib = np.concatenate([fp4 & 15, fp4 >> 4])
            self.assertEqual(sorted(set(nib.tolist())), list(range(16)))
            s8 = [u8(t[k[:-7] + ".scale"]) for k, v in t.items()
                  if v[0] == "F8_E4M3"]
            self.assertGreaterEqual(len(set(np.concatenate(
                [s.ravel() for s in s8]).tolist())), 4)
            self.assertTrue(any(len(set(s.ravel().tolist())) > 1 for s in s8),
                            "no FP8 weight with differing block scales")
            s4 = np.concatenate([u8(t[k[:-7] + ".scale"]).ravel()
                                 for k, v in t.items() if v[0] == "I8"])
            self.assertGreaterEqual(len(set(s4.tolist())), 4)
            self.assertFalse(np.any(s4 == 255))
            for k, v in t.items():
                if v[0] == "F32" and (k.endswith(("attn_sink", "ape", "_base",
                                                  "gate.bias"))):
                    self.assertGreater(np.abs(np.frombuffer(v[2], "<f4")).min(),
                                       0, k)

    def test_hf_state_dict(self):
        for name in self.dirs:
            cfg, t, _ = self.load(name)
            p = dict(mt.PRESETS[name])
            sd = mt.hf_state_arrays(mt.read_checkpoint(self.dirs[name]), p)
            ex = expected_hf(cfg)
            self.assertEqual(sorted(set(sd) ^ set(ex)), [])
            for k, shape in ex.items():
                self.assertEqual(list(sd[k].shape), shape, k)
            I = cfg["moe_intermediate_size"]
            for layer, e in ((0, 0), (cfg["num_hidden_layers"] - 1,
                                      cfg["n_routed_experts"] - 1)):
                gu = sd[f"model.layers.{layer}.mlp.experts.gate_up_proj"][e]
                dn = sd[f"model.layers.{layer}.mlp.experts.down_proj"][e]
                for w, got in (("w1", gu[:I]), ("w3", gu[I:]), ("w2", dn)):
                    n = f"layers.{layer}.ffn.experts.{e}.{w}"
                    b, s = u8(t[n + ".weight"]), u8(t[n + ".scale"])
                    codes = np.stack([b & 15, b >> 4], -1).reshape(b.shape[0], -1)
                    ref = np.vectorize(fp4_ref)(codes) * np.repeat(
                        2.0 ** (s.astype(float) - 127), 32, 1)
                    self.assertTrue(np.array_equal(got, ref), n)
            n = "layers.0.attn.wq_b"
            c8, s8 = u8(t[n + ".weight"]), u8(t[n + ".scale"])
            i, j = np.meshgrid(np.arange(c8.shape[0]) // 128,
                               np.arange(c8.shape[1]) // 128, indexing="ij")
            ref = FP8_REF[c8] * 2.0 ** (s8[i, j].astype(float) - 127)
            self.assertTrue(np.array_equal(
                sd["model.layers.0.self_attn.q_b_proj.weight"], ref))
            emb = np.frombuffer(t["embed.weight"][2], "<u2").astype(np.uint32)
            self.assertTrue(np.array_equal(
                sd["model.embed_tokens.weight"].ravel().view(np.uint32),
                emb << 16))

    def test_encode_trained_weights(self):
        """released_arrays inverts hf_state_arrays, and encode_like writes
        float weights (what training produces) back into the released
        storage with the smallest exponent per block/group: values already
        on the grid come back exactly, and every block uses its top
        codes."""
        for name in self.dirs:
            p = dict(mt.PRESETS[name])
            ckpt = mt.read_checkpoint(self.dirs[name])
            sd = mt.hf_state_arrays(ckpt, p)
            rel = mt.released_arrays(sd, p)
            self.assertEqual(sorted(rel), sorted(
                n for n in ckpt if not n.startswith("mtp.") and not n.endswith(".scale")))
            enc = mt.encode_like(ckpt, rel)
            self.assertEqual(sorted(enc), sorted(ckpt))
            self.assertEqual({n: v[0] for n, v in enc.items()},
                             {n: v[0] for n, v in ckpt.items()})
            back = mt.dequantize(enc)
            for n, v in mt.dequantize(ckpt).items():
                self.assertTrue(np.array_equal(back[n], v), n)
            c8, s8 = enc["layers.0.attn.wq_b.weight"][1], enc["layers.0.attn.wq_b.scale"][1]
            self.assertEqual(s8.shape, ckpt["layers.0.attn.wq_b.scale"][1].shape)
            for i in range(s8.shape[0]):
                for j in range(s8.shape[1]):
                    blk = c8[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
                    self.assertGreaterEqual(np.abs(FP8_REF[blk]).max(), 224, (i, j))
            b = enc["layers.0.ffn.experts.0.w2.weight"][1].view(np.uint8)
            codes = np.stack([b & 15, b >> 4], -1).reshape(b.shape[0], -1, 32)
            mags = np.array(E2M1_REF)[codes & 7].max(-1)
            self.assertTrue(np.all(mags >= 3), "an MXFP4 group could use a smaller exponent")
            # off-grid float weights round to the nearest code
            w = rel["layers.0.attn.wq_b.weight"] * 1.01
            codes, scale = mt.fp8_block_quant(w)
            err = np.abs(mt.fp8_block_dequant(codes, scale) - w)
            step = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(w), 1e-30))) - 3)
            self.assertTrue(np.all(err <= np.maximum(step, 2.0 ** -9 * 2.0 ** (
                scale.astype(float).max() - 127)) / 2 + 1e-12))

    def test_deterministic(self):
        with tempfile.TemporaryDirectory() as d:
            self.assertEqual(generate(d, "--preset", "tiny-b").returncode, 0)
            for f in os.listdir(d):
                with open(os.path.join(d, f), "rb") as a, \
                        open(os.path.join(self.dirs["tiny-b"], f), "rb") as b:
                    self.assertEqual(hashlib.sha256(a.read()).digest(),
                                     hashlib.sha256(b.read()).digest(), f)


class Cli(unittest.TestCase):
    def test_tokenizer_vocab(self):
        with tempfile.TemporaryDirectory() as d:
            tok = {"model": {"type": "BPE",
                             "vocab": {f"t{i}": i for i in range(300)}},
                   "added_tokens": [{"id": 300 + i, "content": f"<s{i}>"}
                                    for i in range(5)]}
            tp = os.path.join(d, "tokenizer.json")
            with open(tp, "w") as f:
                json.dump(tok, f)
            out = os.path.join(d, "demo")
            r = generate(out, "--preset", "demo", "--tokenizer", tp)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(os.path.join(out, "config.json")) as f:
                cfg = json.load(f)
            self.assertEqual(cfg["vocab_size"], 305)
            with open(os.path.join(out, "tokenizer.json")) as f:
                self.assertEqual(json.load(f), tok)
            t, _ = read_dir(out)
            self.assertEqual(t["embed.weight"][1], [305, cfg["hidden_size"]])

    def test_bad_input(self):
        with tempfile.TemporaryDirectory() as d:
            for args, msg in (
                    (["--preset", "tiny-a", "--o-groups", "3"], "o_groups"),
                    (["--preset", "tiny-a", "--hidden-size", "100"], "multiples of 32"),
                    (["--preset", "demo"], "vocab_size missing"),
                    (["--preset", "tiny-a", "--compress-ratios", "4,8,16"],
                     "one HCA ratio")):
                r = generate(os.path.join(d, "x"), *args)
                self.assertEqual(r.returncode, 1, args)
                self.assertIn(msg, r.stderr, args)


if __name__ == "__main__":
    unittest.main(verbosity=2)
