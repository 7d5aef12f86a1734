// SPDX-License-Identifier: Apache-2.0
// The official OpenAI Node.js client (npm package `openai`, unmodified) against `protokv serve`:
// models, chat and completions, plain and streamed, the kv_compression extension and the error
// statuses. Run by openai_client.sh, which starts the server; exits non-zero on the first failure.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';

// The client lives in the cache folder, not in the repo: resolved from there (ES modules ignore
// NODE_PATH).
const [port, apiKey, npmDir] = process.argv.slice(2);
const OpenAI = createRequire(`${npmDir}/`)('openai');
const baseURL = `http://127.0.0.1:${port}/v1`;
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });

const models = await client.models.list();
const model = models.data[0].id;
assert.equal(models.data[0].object, 'model');

const messages = [{ role: 'user', content: 'alpha 17 beta 23 gamma 42. The value of gamma is' }];
const greedy = { model, messages, max_tokens: 12, temperature: 0 };

const chat = await client.chat.completions.create(greedy);
assert.equal(chat.object, 'chat.completion');
assert.equal(chat.choices[0].message.role, 'assistant');
assert.equal(typeof chat.choices[0].message.content, 'string');
assert.ok(['stop', 'length'].includes(chat.choices[0].finish_reason));
assert.equal(chat.usage.total_tokens, chat.usage.prompt_tokens + chat.usage.completion_tokens);

let streamed = '';
let usage = null;
const stream = await client.chat.completions.create({
  ...greedy, stream: true, stream_options: { include_usage: true },
});
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  streamed += chunk.choices[0]?.delta?.content ?? '';
}
assert.equal(streamed, chat.choices[0].message.content);
assert.deepEqual(usage, chat.usage);

// The extension object travels in the body unchanged; the response reports the bytes stored.
const compressed = await client.chat.completions.create({
  ...greedy, kv_compression: { press: 'snapkv', budget: 8 },
});
assert.ok(compressed.kv_compression.kv_bytes < compressed.kv_compression.kv_bytes_full);

const completion = await client.completions.create({
  model, prompt: 'one two three four', max_tokens: 6, temperature: 0,
});
assert.equal(completion.object, 'text_completion');
let text = '';
for await (const chunk of await client.completions.create({
  model, prompt: 'one two three four', max_tokens: 6, temperature: 0, stream: true,
})) {
  text += chunk.choices[0]?.text ?? '';
}
assert.equal(text, completion.choices[0].text);

await assert.rejects(
  client.chat.completions.create({ ...greedy, kv_compression: { press: 'nope', budget: 4 } }),
  (e) => e instanceof OpenAI.BadRequestError && /nope/.test(e.message),
);
await assert.rejects(
  new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0 }).models.list(),
  (e) => e instanceof OpenAI.AuthenticationError,
);
console.log('openai client: ok');
