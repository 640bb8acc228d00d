#!/usr/bin/env node
// Development twin of tools/make_tokenizer.py for machines without Python
// `tokenizers`: the same fixtures and golden format from HF tokenizers' npm
// build (same Rust core), installed outside the repository:
//   mkdir -p /tmp/npmtok && (cd /tmp/npmtok && npm install tokenizers@0.23.2)
//   NODE_PATH=/tmp/npmtok/node_modules node tools/make_tokenizer_dev.cjs
//   NODE_PATH=... node tools/make_tokenizer_dev.cjs --golden-only --tokenizer X --out G
//       [--fuzz N [--seed S]]   (N random texts instead of the spec's cases)
// The npm binding cannot configure the BPE trainer, so training runs to
// completion and the merges are cut to VOCAB_SIZE afterwards with the
// special tokens and the full byte alphabet placed as BpeTrainer places them.
// The Python script's output is authoritative; this one lets the C tests run
// before it is available.
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const hf = require('tokenizers');

const ROOT = path.dirname(__dirname);
const CORPUS = path.join(ROOT, 'tools', 'tokenizer_corpus');
const FIXTURES = path.join(ROOT, 'tests', 'fixtures', 'tokenizer');
const VOCAB_SIZE = 4096;
const VERSION = require('tokenizers/package.json').version;

const PRE_TOKENIZER = {
  type: 'Sequence', pretokenizers: [
    { type: 'Split', pattern: { Regex: '\\p{N}{1,3}' }, behavior: 'Isolated', invert: false },
    { type: 'Split', pattern: { Regex: '[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+' }, behavior: 'Isolated', invert: false },
    { type: 'Split', pattern: { Regex: "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+" +
      '|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+' },
      behavior: 'Isolated', invert: false },
    { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
  ],
};

function tokenizerJson(vocab, merges, added) {
  return {
    version: '1.0', truncation: null, padding: null, added_tokens: added, normalizer: null,
    pre_tokenizer: PRE_TOKENIZER, post_processor: null,
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
      end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: false,
      vocab, merges },
  };
}

function addTokens(tok, specs) {
  for (const t of specs) {
    tok.addAddedTokens([new hf.AddedToken(t.content, t.special, {
      singleWord: t.single_word, leftStrip: t.lstrip, rightStrip: t.rstrip, normalized: t.normalized })]);
  }
}

function train(spec) {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'mktok-'));
  const corpus = path.join(tmp, 'corpus.txt');
  fs.writeFileSync(corpus, fs.readFileSync(path.join(CORPUS, 'train.txt'), 'utf8') + spec.extra_train.join(''));
  const t0 = hf.Tokenizer.fromString(JSON.stringify(tokenizerJson({}, [], [])));
  t0.train([corpus]);
  t0.save(path.join(tmp, 'full.json'));
  const learned = JSON.parse(fs.readFileSync(path.join(tmp, 'full.json'), 'utf8')).model.merges;
  fs.rmSync(tmp, { recursive: true });

  const vocab = {};
  const added = spec.trainer_special_tokens.map((content, id) => {
    vocab[content] = id;
    return { id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true };
  });
  const alphabet = hf.byteLevelAlphabet().sort((a, b) => a.codePointAt(0) - b.codePointAt(0));
  for (const c of alphabet) vocab[c] = Object.keys(vocab).length;
  const merges = [];
  for (const [a, b] of learned) {
    if (Object.keys(vocab).length >= VOCAB_SIZE) break;
    merges.push([a, b]);
    if (!(a + b in vocab)) vocab[a + b] = Object.keys(vocab).length;
  }
  const tok = hf.Tokenizer.fromString(JSON.stringify(tokenizerJson(vocab, merges, added)));
  addTokens(tok, spec.added_tokens);
  return tok;
}

// Deterministic PRNG (mulberry32) for the random inputs.
function rng(seed) {
  return () => {
    seed = (seed + 0x6D2B79F5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function decodeInputs(tok, encoded, seed) {
  const seqs = encoded.map((e) => e.ids_special);
  const vocab = tok.getVocab(true);
  const allIds = [...new Set(Object.values(vocab))].sort((a, b) => a - b);
  const byteIds = hf.byteLevelAlphabet().filter((c) => c in vocab).map((c) => vocab[c]).sort((a, b) => a - b);
  const r = rng(seed);
  const pick = (arr) => arr[Math.floor(r() * arr.length)];
  for (let k = 0; k < 8; k++) seqs.push(Array.from({ length: 1 + Math.floor(r() * 59) }, () => pick(allIds)));
  for (let k = 0; k < 8; k++) seqs.push(Array.from({ length: 1 + Math.floor(r() * 11) }, () => pick(byteIds)));
  return seqs;
}

// n random texts: words, spaces, digits, the tokenizer's added tokens and
// random code points (any plane, no surrogates).
function fuzzCases(spec, file, n, seed) {
  let added = (JSON.parse(fs.readFileSync(file, 'utf8')).added_tokens || []).map((a) => a.content);
  added = added.slice(0, 50).concat(added.length > 50 ? added.slice(-30) : []);
  const r = rng(seed);
  const pick = (arr) => arr[Math.floor(r() * arr.length)];
  const codePoint = () => {
    const k = r();
    const [lo, size] = k < 0.3 ? [0x20, 0x60] : k < 0.5 ? [0xa0, 0x2000] : k < 0.7 ? [0x3000, 0x7000]
      : k < 0.8 ? [0x1f000, 0x1000] : [0, 0x110000];
    const c = lo + Math.floor(r() * size);
    return String.fromCodePoint(c >= 0xd800 && c <= 0xdfff ? 0x41 : c);
  };
  const cases = [];
  for (let i = 0; i < n; i++) {
    let text = '';
    for (let k = 1 + Math.floor(r() * 40); k > 0; k--) {
      const x = r();
      text += x < 0.3 ? pick(spec.fuzz_words) : x < 0.5 ? pick(spec.fuzz_spaces)
        : x < 0.6 && added.length ? pick(added) : x < 0.7 ? String(Math.floor(r() * 1e7)) : codePoint();
    }
    cases.push({ name: `fuzz${i}`, text });
  }
  return cases;
}

async function goldens(file, cases, seed) {
  const raw = JSON.parse(fs.readFileSync(file, 'utf8'));
  const full = hf.Tokenizer.fromFile(file);
  raw.added_tokens = [];
  const plain = hf.Tokenizer.fromString(JSON.stringify(raw));
  const encoded = [];
  for (const c of cases) {
    const s = await full.encode(c.text, null, { addSpecialTokens: false });
    const p = await plain.encode(c.text, null, { addSpecialTokens: false });
    encoded.push({ name: c.name, text: c.text, bytes: Buffer.byteLength(c.text), ids_special: s.getIds(), ids_plain: p.getIds() });
  }
  const decoded = [];
  for (const ids of decodeInputs(full, encoded, seed)) {
    const text = await full.decode(ids, false), skip = await full.decode(ids, true);
    decoded.push({ ids, text, bytes: Buffer.byteLength(text), text_skip_special: skip,
      bytes_skip_special: Buffer.byteLength(skip) });
  }
  return { generator: `tokenizers ${VERSION} (node)`, tokenizer: path.basename(file), encode: encoded, decode: decoded };
}

async function variantGoldens(file, spec) {
  const base = JSON.parse(fs.readFileSync(file, 'utf8'));
  const cases = spec.cases.filter((c) => spec.variant_cases.includes(c.name));
  const variants = [];
  for (const v of spec.variants) {
    const raw = JSON.parse(JSON.stringify(base));
    if ('pre_tokenizer' in v) raw.pre_tokenizer = v.pre_tokenizer;
    Object.assign(raw.model, v.model || {});
    const tok = hf.Tokenizer.fromString(JSON.stringify(raw));
    const out = {};
    for (const k of ['name', 'pre_tokenizer', 'model']) if (k in v) out[k] = v[k];
    out.encode = [];
    for (const c of cases) {
      const e = await tok.encode(c.text, null, { addSpecialTokens: false });
      out.encode.push({ name: c.name, text: c.text, bytes: Buffer.byteLength(c.text), ids_special: e.getIds() });
    }
    variants.push(out);
  }
  return { generator: `tokenizers ${VERSION} (node)`, tokenizer: path.basename(file), variants };
}

// One encode/decode entry per line: small files, readable diffs.
function writeJson(g, file) {
  const list = (xs) => '[\n' + xs.map((x) => JSON.stringify(x)).join(',\n') + '\n]';
  const head = `{"generator": ${JSON.stringify(g.generator)}, "tokenizer": ${JSON.stringify(g.tokenizer)},\n`;
  fs.writeFileSync(file, head + (g.variants ? `"variants": ${list(g.variants)}}\n`
    : `"encode": ${list(g.encode)},\n"decode": ${list(g.decode)}}\n`));
  console.log('wrote', file, fs.statSync(file).size, 'bytes');
}

async function main() {
  const args = process.argv.slice(2);
  const opt = (name) => { const i = args.indexOf(name); return i >= 0 ? args[i + 1] : undefined; };
  const spec = JSON.parse(fs.readFileSync(path.join(CORPUS, 'spec.json'), 'utf8'));
  if (args.includes('--golden-only')) {
    if (!opt('--tokenizer') || !opt('--out')) throw new Error('--golden-only needs --tokenizer and --out');
    const seed = opt('--seed') ? Number(opt('--seed')) : 1;
    const cases = opt('--fuzz') ? fuzzCases(spec, opt('--tokenizer'), Number(opt('--fuzz')), seed)
      : spec.cases.concat(spec.flags_cases);
    writeJson(await goldens(opt('--tokenizer'), cases, seed), opt('--out'));
    return;
  }
  fs.mkdirSync(FIXTURES, { recursive: true });
  const mainPath = path.join(FIXTURES, 'tokenizer.json');
  const flagsPath = path.join(FIXTURES, 'tokenizer-flags.json');
  const tok = train(spec);
  tok.save(mainPath);
  addTokens(tok, spec.flags_added_tokens);
  tok.save(flagsPath);
  console.log('vocab', tok.getVocabSize(false), 'with added', tok.getVocabSize(true));
  writeJson(await goldens(mainPath, spec.cases, 1), path.join(FIXTURES, 'golden.json'));
  writeJson(await goldens(flagsPath, spec.flags_cases, 2), path.join(FIXTURES, 'golden-flags.json'));
  writeJson(await variantGoldens(mainPath, spec), path.join(FIXTURES, 'golden-variants.json'));
}

main().catch((e) => { console.error(e); process.exit(1); });
