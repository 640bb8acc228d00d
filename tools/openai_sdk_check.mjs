// The official OpenAI SDK (Node) against a running stack (make run):
// models (list and retrieve), chat (n = 1 and 3), streaming with usage,
// completions, the Responses API
// (plain and streamed) and two error shapes.  Exits non-zero on any
// mismatch.  Run by tools/openai_sdk_check.sh.
import OpenAI from 'openai';
import assert from 'node:assert/strict';

const base = process.env.LLM_BASE_URL ?? 'http://127.0.0.1:8080/v1';
const model = process.env.LLM_MODEL ?? 'tiny-demo';
const client = new OpenAI({ baseURL: base, apiKey: process.env.LLM_API_KEY ?? 'unused' });

const models = await client.models.list();
assert.ok(models.data.some(m => m.id === model), `model ${model} is listed`);
const one = await client.models.retrieve(model);
assert.equal(one.id, model);
assert.equal(one.object, 'model');
console.log('ok models:', models.data.map(m => m.id).join(', '), '(and retrieve)');

const chat = await client.chat.completions.create({
  model, messages: [{ role: 'user', content: 'Hello!' }], max_tokens: 8 });
assert.equal(chat.object, 'chat.completion');
assert.ok(['stop', 'length'].includes(chat.choices[0].finish_reason));
assert.equal(chat.usage.total_tokens, chat.usage.prompt_tokens + chat.usage.completion_tokens);
console.log('ok chat:', chat.choices[0].finish_reason, chat.usage.completion_tokens, 'tokens');

const several = await client.chat.completions.create({
  model, messages: [{ role: 'user', content: 'Hello!' }], max_tokens: 4, n: 3 });
assert.deepEqual(several.choices.map(c => c.index), [0, 1, 2]);
console.log('ok chat n=3:', several.usage.completion_tokens, 'tokens in all');

const stream = await client.chat.completions.create({
  model, messages: [{ role: 'user', content: 'Stream, please.' }], max_tokens: 8,
  stream: true, stream_options: { include_usage: true } });
let chunks = 0, text = '', usage = null, finish = null;
for await (const c of stream) {
  chunks++;
  if (c.choices[0]?.delta?.content) text += c.choices[0].delta.content;
  if (c.choices[0]?.finish_reason) finish = c.choices[0].finish_reason;
  if (c.usage) usage = c.usage;
}
assert.ok(finish && usage && usage.completion_tokens >= 1, 'stream ends with finish_reason and usage');
console.log('ok chat stream:', chunks, 'chunks,', usage.completion_tokens, 'tokens');

const comp = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 6 });
assert.equal(comp.object, 'text_completion');
console.log('ok completions:', comp.choices[0].finish_reason);

const resp = await client.responses.create({ model, input: 'Say hi', max_output_tokens: 8 });
assert.ok(['completed', 'incomplete'].includes(resp.status));
assert.ok(resp.usage.output_tokens >= 1);
console.log('ok responses:', resp.status, resp.output.map(o => o.type).join(','));

const rs = await client.responses.create({ model, input: 'Say hi', max_output_tokens: 8, stream: true });
const types = [];
for await (const ev of rs) types.push(ev.type);
assert.equal(types[0], 'response.created');
assert.ok(['response.completed', 'response.incomplete'].includes(types.at(-1)));
console.log('ok responses stream:', types.length, 'events');

await assert.rejects(
  client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] }),
  e => e.status === 404);
await assert.rejects(
  client.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }], max_tokens: 10_000_000 }),
  e => e.status === 400 && e.code === 'context_length_exceeded');
console.log('ok errors: 404 unknown model, 400 context_length_exceeded');
