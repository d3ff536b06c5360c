// tool_choice enforcement (required / any, a named tool, none) with the official clients, and the
// server's honesty about its defaults: /api/status shows the effective settings and the demo
// model's generation_config.json sampling defaults; cached_tokens stays 0 with no prefix cache.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { openai, anthropic, MODEL, USER, GREEDY, status } from './common.mjs';

const NO_THINK = { chat_template_kwargs: { enable_thinking: false } };
// Bounded argument types, so even the tiny demo model finishes its call well within max_tokens.
const TOOLS = [
  { type: 'function', function: { name: 'reverse', description: 'Reverse a string', parameters: {
    type: 'object',
    properties: { s: { type: 'string', enum: ['abc', 'hello'] }, times: { type: 'integer' } },
    required: ['s', 'times'], additionalProperties: false } } },
  { type: 'function', function: { name: 'flag', description: 'Set a flag', parameters: {
    type: 'object', properties: { on: { type: 'boolean' } }, required: ['on'], additionalProperties: false } } },
];

function checkArgs(name, text) {
  const a = JSON.parse(text);  // arguments always parse
  if (name === 'reverse') {
    assert.deepEqual(Object.keys(a).sort(), ['s', 'times']);
    assert.ok(['abc', 'hello'].includes(a.s), text);
    assert.ok(Number.isInteger(a.times), text);
  } else {
    assert.equal(name, 'flag');
    assert.deepEqual(Object.keys(a), ['on']);
    assert.equal(typeof a.on, 'boolean');
  }
}

// Streams a chat request and folds tool_call deltas (OpenAI's format) into whole calls.
async function streamCalls(params) {
  const s = await openai.chat.completions.create({ ...params, stream: true });
  const calls = [];
  let finish = null, content = '';
  for await (const chunk of s) {
    for (const c of chunk.choices) {
      content += c.delta?.content ?? '';
      for (const tc of c.delta?.tool_calls ?? []) {
        calls[tc.index] ??= { id: '', name: '', arguments: '' };
        if (tc.id) calls[tc.index].id = tc.id;
        if (tc.function?.name) calls[tc.index].name += tc.function.name;
        calls[tc.index].arguments += tc.function?.arguments ?? '';
      }
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { calls, finish, content };
}

const BASE = { ...GREEDY, max_tokens: 200, messages: USER, tools: TOOLS };

test('tool_choice required: every reply is one or more well-formed calls', async () => {
  const one = { parallel_tool_calls: false };
  for (const extra of [{ ...NO_THINK, ...one },
    { ...one, chat_template_kwargs: { enable_thinking: true }, thinking_budget: 8 },
    { ...NO_THINK, ...one, temperature: 1, seed: 7, n: 2 },
    NO_THINK]) {  // parallel calls allowed: the model may keep calling until max_tokens
    const r = await openai.chat.completions.create({ ...BASE, ...extra, tool_choice: 'required' });
    for (const c of r.choices) {
      if (extra.parallel_tool_calls === false) {
        assert.equal(c.finish_reason, 'tool_calls');
        assert.equal(c.message.tool_calls.length, 1);
      } else {
        assert.ok(['tool_calls', 'length'].includes(c.finish_reason));
        assert.ok(c.message.tool_calls.length >= 1);
      }
      for (const tc of c.message.tool_calls) {
        assert.equal(tc.type, 'function');
        assert.ok(tc.id);
        checkArgs(tc.function.name, tc.function.arguments);
      }
    }
  }
  const s = await streamCalls({ ...BASE, ...NO_THINK, tool_choice: 'required', parallel_tool_calls: false });
  assert.equal(s.finish, 'tool_calls');
  assert.equal(s.calls.length, 1);
  checkArgs(s.calls[0].name, s.calls[0].arguments);
});

test('tool_choice naming a function calls exactly that function', async () => {
  for (const name of ['flag', 'reverse']) {
    const tool_choice = { type: 'function', function: { name } };
    const r = await openai.chat.completions.create({ ...BASE, ...NO_THINK, tool_choice });
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    assert.equal(m.tool_calls.length, 1);
    assert.equal(m.tool_calls[0].function.name, name);
    checkArgs(name, m.tool_calls[0].function.arguments);
    const s = await streamCalls({ ...BASE, ...NO_THINK, tool_choice });
    assert.equal(s.finish, 'tool_calls');
    assert.equal(s.calls.length, 1);
    assert.equal(s.calls[0].name, name);
    assert.equal(s.calls[0].arguments, m.tool_calls[0].function.arguments);  // greedy: same call
  }
});

test('tool_choice none gives no tool calls; conflicting requests are 400', async () => {
  const r = await openai.chat.completions.create({ ...BASE, ...NO_THINK, max_tokens: 24, tool_choice: 'none' });
  assert.ok(!r.choices[0].message.tool_calls?.length);
  assert.notEqual(r.choices[0].finish_reason, 'tool_calls');
  await assert.rejects(
    openai.chat.completions.create({ ...BASE, tool_choice: 'required', response_format: { type: 'json_object' } }),
    (e) => e.status === 400 && /tool_choice/.test(e.message));
  await assert.rejects(
    openai.chat.completions.create({ ...BASE, tool_choice: { type: 'function', function: { name: 'nope' } } }),
    (e) => e.status === 400 && /nope/.test(e.message));
});

const A_TOOLS = TOOLS.map((t) => ({ name: t.function.name, description: t.function.description,
  input_schema: t.function.parameters }));

test('anthropic tool_choice any and tool force tool_use blocks', async () => {
  const base = { model: MODEL, max_tokens: 200, temperature: 0, messages: USER, tools: A_TOOLS,
    thinking: { type: 'disabled' } };
  for (const thinking of [{ type: 'disabled' }, { type: 'enabled', budget_tokens: 8 }]) {
    const tool_choice = { type: 'any', disable_parallel_tool_use: true };
    const any = await anthropic.messages.create({ ...base, thinking, tool_choice });
    assert.equal(any.stop_reason, 'tool_use');
    const uses = any.content.filter((b) => b.type === 'tool_use');
    assert.ok(uses.length >= 1);
    for (const u of uses) checkArgs(u.name, JSON.stringify(u.input));
  }

  const one = await anthropic.messages.create({ ...base, tool_choice: { type: 'tool', name: 'reverse' } });
  const named = one.content.filter((b) => b.type === 'tool_use');
  assert.equal(one.stop_reason, 'tool_use');
  assert.equal(named.length, 1);
  assert.equal(named[0].name, 'reverse');
  checkArgs('reverse', JSON.stringify(named[0].input));

  const streamed = await anthropic.messages.stream({ ...base, tool_choice: { type: 'tool', name: 'reverse' } }).finalMessage();
  const su = streamed.content.filter((b) => b.type === 'tool_use');
  assert.equal(streamed.stop_reason, 'tool_use');
  assert.equal(su.length, 1);
  assert.deepEqual(su[0].input, named[0].input);
});

test('status reports effective settings and generation_config.json defaults', async () => {
  const m = (await status()).models.find((x) => x.name === MODEL);
  const s = m.settings;
  assert.equal(s.kv_cache_dtype, 'f32');  // "auto" resolved to what the engine stores
  // The modes in effect: test_api.sh asks for --batch-precision fast, which the CPU backend
  // (F32 throughout) does not run, so it must not be claimed.
  assert.match(m.device, /^cpu \(/);
  assert.equal(s.prefill_precision, 'exact');
  assert.equal(s.batch_precision, 'exact');
  assert.equal(s.speculative, false);
  assert.equal(s.draft_depth, 0);
  assert.equal(s.prefix_cache, false);
  assert.match(s.generation_config, /generation_config\.json$/);
  // The demo settings set no sampling defaults, so the model directory's file supplies them.
  const gc = JSON.parse(readFileSync(s.generation_config, 'utf8'));
  const near = (a, b) => typeof a === 'number' && Math.abs(a - b) < 1e-6;  // stored as float
  assert.ok(near(s.sampling_defaults.temperature, gc.temperature));
  assert.equal(s.sampling_defaults.top_k, gc.top_k);
  assert.ok(near(s.sampling_defaults.top_p, gc.top_p));
  assert.ok(near(s.sampling_defaults.repetition_penalty, gc.repetition_penalty));
  assert.equal(s.sampling_defaults.min_p, null);  // neither file sets it: the built-in default
});

test('cached_tokens tells the truth: 0 without a prefix cache', async () => {
  const req = { ...GREEDY, max_tokens: 2, ...NO_THINK, messages: USER };
  await openai.chat.completions.create(req);
  const again = await openai.chat.completions.create(req);  // the same prompt again
  assert.equal(again.usage.prompt_tokens_details.cached_tokens, 0);
  const m = (await status()).models.find((x) => x.name === MODEL);
  assert.equal(m.totals.cached_prompt_tokens, 0);
});

test('decode steps stay on the device through the server, and never overlap on the CPU', async () => {
  // Rows picked by the backend (greedy, or sampled with top-k, penalties included: the demo's
  // generation_config sets a repetition penalty) send only their ids to the host; a request
  // asking for logprobs needs its logits there. The CPU backend computes a step as it is
  // launched, so the server never launches one behind another there (that would only hold each
  // token back a step); the engine tests check overlapped steps' tokens with the overlap forced.
  const totals = async () => (await status()).models.find((x) => x.name === MODEL).totals;
  // A step either stays on the device (ids only) or sends its logits to the host
  // (steps_logits_to_host), never both.
  const check = async (req, to_host) => {
    const before = await totals();
    const r = await openai.chat.completions.create({ max_tokens: 16, ...NO_THINK, messages: USER, ...req });
    assert.ok(r.usage.completion_tokens >= 8, JSON.stringify(r.usage));
    const after = await totals();
    assert.ok(after.steps - before.steps >= 8, JSON.stringify([before, after]));
    assert.equal(after.steps_overlapped - before.steps_overlapped, 0, JSON.stringify([before, after]));
    const host = after.steps_logits_to_host - before.steps_logits_to_host;
    assert.equal(host, to_host ? after.steps - before.steps : 0, JSON.stringify([before, after]));
  };
  const ignore = { ignore_eos: true };
  await check({ ...GREEDY, ...ignore, repetition_penalty: 1 });
  await check({ ...GREEDY, ...ignore });
  await check({
    model: MODEL, temperature: 0.8, top_k: 20, top_p: 0.95, presence_penalty: 1.5, seed: 5, ...ignore,
  });
  await check({ ...GREEDY, ...ignore, logprobs: true }, true);
});

test('generation_config.json sampling defaults apply to requests that set none', async () => {
  // The demo's file sets repetition_penalty 1.1: a greedy request without one must decode as
  // with 1.1 given explicitly, and (on these weights) differently from 1.0.
  const req = { ...GREEDY, max_tokens: 32, ...NO_THINK, messages: USER };
  const text = async (extra) => (await openai.chat.completions.create({ ...req, ...extra })).choices[0].message.content;
  const dflt = await text({});
  assert.equal(dflt, await text({ repetition_penalty: 1.1 }));
  assert.notEqual(dflt, await text({ repetition_penalty: 1 }));
});
