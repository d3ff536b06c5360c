import { test } from 'node:test';
import assert from 'node:assert/strict';
import { openai, MODEL, USER, GREEDY, streamChat } from './common.mjs';

const NO_THINK = { chat_template_kwargs: { enable_thinking: false } };

test('models list names the served model', async () => {
  const list = await openai.models.list();
  assert.ok(list.data.some((m) => m.id === MODEL));
});

test('chat: non-streaming and streaming greedy outputs agree', async () => {
  const r = await openai.chat.completions.create({ ...GREEDY, ...NO_THINK, messages: USER });
  const c = r.choices[0];
  assert.equal(r.object, 'chat.completion');
  assert.equal(typeof c.message.content, 'string');
  assert.ok(['stop', 'length'].includes(c.finish_reason));
  assert.ok(r.usage.prompt_tokens > 5);
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= GREEDY.max_tokens);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  const s = await streamChat({ ...GREEDY, ...NO_THINK, messages: USER });
  assert.equal(s.content, c.message.content);
  assert.equal(s.finish, c.finish_reason);
  assert.deepEqual(s.usage.completion_tokens, r.usage.completion_tokens);
  assert.ok('cached_tokens' in s.usage.prompt_tokens_details);
});

test('thinking on produces reasoning tokens, off produces none', async () => {
  const on = await openai.chat.completions.create({
    ...GREEDY, max_tokens: 8, messages: USER, chat_template_kwargs: { enable_thinking: true },
  });
  assert.ok(on.usage.completion_tokens_details.reasoning_tokens >= 1);
  const off = await openai.chat.completions.create({ ...GREEDY, max_tokens: 8, ...NO_THINK, messages: USER });
  assert.equal(off.usage.completion_tokens_details.reasoning_tokens, 0);
  assert.ok(!off.choices[0].message.reasoning_content);
  // A zero budget closes the reasoning at once: no reasoning text reaches the client.
  const budget = await openai.chat.completions.create({
    ...GREEDY, max_tokens: 8, messages: USER, chat_template_kwargs: { enable_thinking: true }, thinking_budget: 0,
  });
  assert.ok(!budget.choices[0].message.reasoning_content);
});

test('stop strings cut the output before the stop text', async () => {
  const full = (await openai.chat.completions.create({ ...GREEDY, max_tokens: 32, ...NO_THINK, messages: USER }))
    .choices[0].message.content;
  assert.ok(full.length >= 6, `greedy output too short to pick a stop string: ${JSON.stringify(full)}`);
  const stop = full.slice(3, 6);
  const r = await openai.chat.completions.create({ ...GREEDY, max_tokens: 32, ...NO_THINK, messages: USER, stop: [stop] });
  assert.equal(r.choices[0].message.content, full.slice(0, full.indexOf(stop)));
  assert.equal(r.choices[0].finish_reason, 'stop');
});

test('logprobs: one entry per token, top_logprobs sorted, greedy picks the top one', async () => {
  const r = await openai.chat.completions.create({
    ...GREEDY, max_tokens: 8, ...NO_THINK, messages: USER, logprobs: true, top_logprobs: 3,
    // Off explicitly: the demo's generation_config.json default (1.1) would otherwise let the
    // penalised greedy pick differ from the raw top logprob.
    repetition_penalty: 1,
  });
  const lp = r.choices[0].logprobs.content;
  assert.ok(lp.length >= 1 && lp.length <= r.usage.completion_tokens);
  for (const t of lp) {
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 3);
    for (let i = 1; i < 3; i++) assert.ok(t.top_logprobs[i - 1].logprob >= t.top_logprobs[i].logprob);
    assert.ok(Math.abs(t.top_logprobs[0].logprob - t.logprob) < 1e-4, 'greedy token is the most likely');
    assert.equal(Buffer.from(t.bytes).toString('utf8').length > 0, true);
  }
});

test('n > 1 with a seed returns n choices', async () => {
  const r = await openai.chat.completions.create({ model: MODEL, max_tokens: 6, n: 3, seed: 5, temperature: 1, ...NO_THINK, messages: USER });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
});

test('json_schema output parses and validates', async () => {
  const schema = {
    type: 'object',
    properties: { name: { type: 'string', enum: ['reverse', 'sort'] }, args: { type: 'integer' }, ok: { type: 'boolean' } },
    required: ['name', 'args', 'ok'],
    additionalProperties: false,
  };
  const r = await openai.chat.completions.create({
    ...GREEDY, max_tokens: 64, ...NO_THINK, messages: USER,
    response_format: { type: 'json_schema', json_schema: { name: 'call', schema } },
  });
  const v = JSON.parse(r.choices[0].message.content);
  assert.deepEqual(Object.keys(v).sort(), ['args', 'name', 'ok']);
  assert.ok(['reverse', 'sort'].includes(v.name));
  assert.ok(Number.isInteger(v.args));
  assert.equal(typeof v.ok, 'boolean');
  const o = await openai.chat.completions.create({
    ...GREEDY, max_tokens: 64, ...NO_THINK, messages: USER, response_format: { type: 'json_object' },
  });
  if (o.choices[0].finish_reason === 'stop') assert.equal(typeof JSON.parse(o.choices[0].message.content), 'object');
});

test('tool conversations are accepted and tool calls come back well-formed', async () => {
  const tools = [{ type: 'function', function: { name: 'reverse', description: 'Reverse a string',
    parameters: { type: 'object', properties: { s: { type: 'string' } }, required: ['s'] } } }];
  const messages = [
    ...USER,
    { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'reverse', arguments: '{"s": "abc"}' } }] },
    { role: 'tool', tool_call_id: 'c1', content: 'cba' },
  ];
  for (const stream of [false, true]) {
    if (!stream) {
      const r = await openai.chat.completions.create({ ...GREEDY, ...NO_THINK, messages, tools });
      for (const tc of r.choices[0].message.tool_calls ?? []) JSON.parse(tc.function.arguments);
      assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason));
    } else {
      const s = await streamChat({ ...GREEDY, ...NO_THINK, messages, tools });
      assert.ok(['stop', 'length', 'tool_calls'].includes(s.finish));
    }
  }
});
