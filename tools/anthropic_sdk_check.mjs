// The official Anthropic SDK (Node) against a running stack (make run):
// a message, a streamed message (MessageStream events and finalMessage),
// a forced tool call streamed and answered with a tool_result, count_tokens,
// and two error shapes.  Exits non-zero on any mismatch.  Run by
// tools/anthropic_sdk_check.sh.
//
// The tool call is forced with tool_choice {type: "tool"}: with a random
// model it comes out only when the server constrains decoding.  Against a
// stack whose engine runs the scripted test runner (llm_test_script on),
// LLM_SCRIPTED=1 adds a test_script that plays the call instead.
import Anthropic from '@anthropic-ai/sdk';
import assert from 'node:assert/strict';

const base = process.env.LLM_BASE_URL ?? 'http://127.0.0.1:8080';
const model = process.env.LLM_MODEL ?? 'tiny-demo';
const scripted = process.env.LLM_SCRIPTED === '1';
const client = new Anthropic({ baseURL: base, apiKey: process.env.LLM_API_KEY ?? 'unused' });
const user = [{ role: 'user', content: 'Hello!' }];
const script = (s) => (scripted ? { test_script: s } : {});

const msg = await client.messages.create({ model, max_tokens: 8, messages: user,
  ...script({ content: 'Hi there, friend' }) });
assert.equal(msg.type, 'message');
assert.equal(msg.role, 'assistant');
assert.match(msg.id, /^msg_/);
assert.ok(['end_turn', 'max_tokens'].includes(msg.stop_reason));
assert.equal(msg.content[0].type, 'text');
assert.ok(msg.usage.input_tokens >= 1 && msg.usage.output_tokens >= 1);
console.log('ok message:', msg.stop_reason, msg.usage.output_tokens, 'tokens');

const stream = client.messages.stream({ model, max_tokens: 8, system: 'Be brief.',
  messages: [{ role: 'user', content: 'Stream, please.' }], ...script({ content: 'Streaming text' }) });
let text = '', events = 0;
stream.on('text', (t) => { text += t; });
stream.on('streamEvent', () => { events++; });
const final = await stream.finalMessage();
assert.equal(final.content[0].type, 'text');
assert.equal(final.content[0].text, text, 'text events add up to the final text');
assert.ok(final.usage.output_tokens >= 1);
console.log('ok stream:', events, 'events,', final.usage.output_tokens, 'tokens,', final.stop_reason);

const tools = [{ name: 'get_weather', description: 'Current weather for a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
const ts = client.messages.stream({ model, max_tokens: 256, messages: [{ role: 'user', content: 'Weather in Paris?' }],
  tools, tool_choice: { type: 'tool', name: 'get_weather' },
  ...script({ tool_calls: [{ id: 'toolu_01', name: 'get_weather', arguments: '{"city":"Paris"}' }] }) });
let partial = '';
ts.on('inputJson', (delta) => { partial += delta; });
const call = await ts.finalMessage();
const use = call.content.find((b) => b.type === 'tool_use');
assert.ok(use, `a tool_use block (got ${JSON.stringify(call.content)})`);
assert.equal(call.stop_reason, 'tool_use');
assert.equal(use.name, 'get_weather');
assert.equal(typeof use.input.city, 'string');
assert.deepEqual(JSON.parse(partial), use.input, 'input_json_delta events add up to the input');
console.log('ok tool call (streamed):', use.name, JSON.stringify(use.input));

const answer = await client.messages.create({ model, max_tokens: 8, tools,
  messages: [{ role: 'user', content: 'Weather in Paris?' },
             { role: 'assistant', content: call.content },
             { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'sunny, 21 C' }] }],
  ...script({ content: 'It is sunny.' }) });
assert.equal(answer.type, 'message');
console.log('ok tool_result round trip:', answer.stop_reason);

const count = await client.messages.countTokens({ model, messages: user, tools });
assert.ok(Number.isInteger(count.input_tokens) && count.input_tokens >= 1);
console.log('ok count_tokens:', count.input_tokens);

await assert.rejects(client.messages.create({ model: 'no-such-model', max_tokens: 4, messages: user }),
  (e) => e instanceof Anthropic.NotFoundError && e.error?.error?.type === 'not_found_error');
await assert.rejects(client.messages.create({ model, max_tokens: 4, messages: [] }),
  (e) => e instanceof Anthropic.BadRequestError && e.error?.type === 'error');
console.log('ok errors: 404 not_found_error, 400 invalid_request_error');
