#!/usr/bin/env node
// SPDX-License-Identifier: Apache-2.0
// Generates the golden token ids of tests/data/tokenizer/hf_golden.json with @lenml/tokenizers
// (a port of transformers.js' tokenizers), from the real tokenizer.json files in
// ../shared/tokenizers/hf/. CI does not run this; the output is committed.
//
// Usage (node and npm installed):
//   mkdir -p /tmp/npm-tok && (cd /tmp/npm-tok && npm init -y && npm install @lenml/tokenizers@3.7.2)
//   NODE_PATH=/tmp/npm-tok/node_modules node tools/tokenizer/make_golden.js [SHARED_DIR]
'use strict';
const fs = require('fs');
const path = require('path');
const { TokenizerLoader } = require('@lenml/tokenizers');

const repo = path.resolve(__dirname, '..', '..');
const shared = process.argv[2] || path.resolve(repo, '..', 'shared');
const texts = JSON.parse(fs.readFileSync(path.join(repo, 'tests/data/tokenizer/hf_texts.json'),
                                         'utf8')).texts;
const out = { about: 'ids from @lenml/tokenizers 3.7.2, encode(text, {add_special_tokens: false})',
              models: {} };
for (const name of ['llama3', 'qwen3']) {
  const dir = path.join(shared, 'tokenizers', 'hf', name);
  const tokenizer = TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8')),
    tokenizerConfig: JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8')),
  });
  out.models[name] = texts.map((text) => tokenizer.encode(text, { add_special_tokens: false }));
}
const lines = ['{', `  "about": ${JSON.stringify(out.about)},`, '  "models": {'];
const names = Object.keys(out.models);
names.forEach((name, m) => {
  lines.push(`    ${JSON.stringify(name)}: [`);
  out.models[name].forEach((ids, i) => {
    const comma = i + 1 < out.models[name].length ? ',' : '';
    lines.push(`      ${JSON.stringify(ids)}${comma}`);
  });
  lines.push(`    ]${m + 1 < names.length ? ',' : ''}`);
});
lines.push('  }', '}');
fs.writeFileSync(path.join(repo, 'tests/data/tokenizer/hf_golden.json'), lines.join('\n') + '\n');
console.log(`wrote ${texts.length} texts x ${names.length} models`);
