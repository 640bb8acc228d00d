#!/usr/bin/env node
// Print the general category HF tokenizers' regex engine (Oniguruma inside
// the tokenizers npm build) gives every code point, as JSON ranges
// [[first, last, "Lu"], ...].  Used by tools/gen_onig_unicode.py.
//   NODE_PATH=/tmp/npmtok/node_modules node tools/hf_unicode_categories.cjs
'use strict';
const hf = require('tokenizers');

const GCS = ['Lu', 'Ll', 'Lt', 'Lm', 'Lo', 'Mn', 'Mc', 'Me', 'Nd', 'Nl', 'No', 'Pc', 'Pd', 'Ps', 'Pe',
  'Pi', 'Pf', 'Po', 'Sm', 'Sc', 'Sk', 'So', 'Zs', 'Zl', 'Zp', 'Cc', 'Cf', 'Co', 'Cn'];

// Split(invert) + Removed keeps exactly the runs the pattern matches.
function matcher(re) {
  const j = { version: '1.0', truncation: null, padding: null, added_tokens: [], normalizer: null,
    pre_tokenizer: { type: 'Split', pattern: { Regex: re }, behavior: 'Removed', invert: true },
    post_processor: null, decoder: null,
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
      end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: false,
      vocab: {}, merges: [] } };
  return hf.Tokenizer.fromString(JSON.stringify(j)).getPreTokenizer();
}

const cps = [];
for (let c = 0; c <= 0x10ffff; c++) if (c < 0xd800 || c > 0xdfff) cps.push(c);
const cat = new Map();
for (const gc of GCS) {
  const m = matcher(`\\p{${gc}}+`);
  for (let i = 0; i < cps.length; i += 50000) {
    for (const [piece] of m.preTokenizeString(String.fromCodePoint(...cps.slice(i, i + 50000)))) {
      for (const ch of piece) {
        const c = ch.codePointAt(0);
        if (cat.has(c)) throw new Error(`U+${c.toString(16)} is both ${cat.get(c)} and ${gc}`);
        cat.set(c, gc);
      }
    }
  }
}
const ranges = [];
for (const c of cps) {
  const gc = cat.get(c);
  if (!gc) throw new Error(`U+${c.toString(16)} has no category`);
  const last = ranges[ranges.length - 1];
  if (last && last[1] === c - 1 && last[2] === gc) last[1] = c;
  else ranges.push([c, c, gc]);
}
console.log(JSON.stringify({ tokenizers: require('tokenizers/package.json').version, ranges }));
