import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { openai, anthropic, URL_BASE, KEY, MODEL, USER, GREEDY, status, post, streamChat } from './common.mjs';

const NO_THINK = { chat_template_kwargs: { enable_thinking: false } };

test('anthropic messages: streaming and non-streaming agree; event order', async () => {
  const params = { model: MODEL, max_tokens: 24, temperature: 0, system: 'You write Python.', messages: USER };
  const m = await anthropic.messages.create(params);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.ok(['end_turn', 'max_tokens', 'stop_sequence', 'tool_use'].includes(m.stop_reason));
  assert.ok(m.usage.input_tokens > 5 && m.usage.output_tokens >= 1);
  const text = m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  const types = [];
  let streamed = '';
  const s = await anthropic.messages.create({ ...params, stream: true });
  for await (const ev of s) {
    types.push(ev.type);
    if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') streamed += ev.delta.text;
  }
  assert.equal(streamed, text);
  assert.equal(types[0], 'message_start');
  assert.equal(types.at(-1), 'message_stop');
  assert.equal(types.at(-2), 'message_delta');
  assert.ok(types.indexOf('content_block_start') < types.indexOf('content_block_stop'));
  const count = await post('/v1/messages/count_tokens', JSON.stringify({ model: MODEL, system: 'You write Python.', messages: USER }));
  assert.equal(count.status, 200);
  assert.equal(count.body.input_tokens, m.usage.input_tokens + (m.usage.cache_read_input_tokens ?? 0));
});

test('anthropic tool_use / tool_result history and stop_sequences', async () => {
  const m = await anthropic.messages.create({
    model: MODEL, max_tokens: 16, temperature: 0,
    tools: [{ name: 'reverse', description: 'Reverse', input_schema: { type: 'object', properties: { s: { type: 'string' } } } }],
    messages: [
      ...USER,
      { role: 'assistant', content: [{ type: 'tool_use', id: 'tu1', name: 'reverse', input: { s: 'abc' } }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'tu1', content: 'cba' }] },
    ],
  });
  for (const b of m.content) if (b.type === 'tool_use') assert.equal(typeof b.input, 'object');
  const full = m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  if (full.length >= 4) {
    const stop = full.slice(1, 3);
    const m2 = await anthropic.messages.create({
      model: MODEL, max_tokens: 16, temperature: 0, stop_sequences: [stop],
      tools: [{ name: 'reverse', description: 'Reverse', input_schema: { type: 'object', properties: { s: { type: 'string' } } } }],
      messages: [
        ...USER,
        { role: 'assistant', content: [{ type: 'tool_use', id: 'tu1', name: 'reverse', input: { s: 'abc' } }] },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'tu1', content: 'cba' }] },
      ],
    });
    assert.equal(m2.stop_reason, 'stop_sequence');
    assert.equal(m2.stop_sequence, stop);
  }
});

test('auth: wrong or missing keys get 401 in each API shape; /health is open', async () => {
  const badOpenAI = new OpenAI({ baseURL: `${URL_BASE}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(badOpenAI.chat.completions.create({ ...GREEDY, messages: USER }), (e) => e.status === 401 && e.error?.type === 'authentication_error');
  const badAnthropic = new Anthropic({ baseURL: URL_BASE, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(badAnthropic.messages.create({ model: MODEL, max_tokens: 4, messages: USER }), (e) => e.status === 401 && e.error?.error?.type === 'authentication_error');
  const r = await fetch(`${URL_BASE}/v1/models`);
  assert.equal(r.status, 401);
  const h = await fetch(`${URL_BASE}/health`);
  assert.equal(h.status, 200);
  const xkey = await fetch(`${URL_BASE}/v1/models`, { headers: { 'x-api-key': KEY } });
  assert.equal(xkey.status, 200);
});

test('completions: echo with logprobs scores the prompt; max_tokens 0', async () => {
  const prompt = 'def reverse(s):\n    return s[::-1]\n';
  const r = await openai.completions.create({ model: MODEL, prompt, max_tokens: 0, echo: true, logprobs: 1 });
  const c = r.choices[0];
  assert.equal(c.text, prompt);
  assert.equal(c.logprobs.tokens.join(''), prompt);
  assert.equal(c.logprobs.token_logprobs[0], null);
  assert.ok(c.logprobs.token_logprobs.slice(1).every((x) => typeof x === 'number' && x <= 0));
  assert.equal(r.usage.completion_tokens, 0);
  // The greedy continuation's first token is the argmax: its score equals the best top logprob.
  const g = await openai.completions.create({ model: MODEL, prompt, max_tokens: 1, temperature: 0, logprobs: 2 });
  const lp = g.choices[0].logprobs;
  const best = Math.max(...Object.values(lp.top_logprobs[0]));
  assert.ok(Math.abs(best - lp.token_logprobs[0]) < 1e-4);
});

test('16 concurrent streaming clients get the sequential greedy outputs', async () => {
  const prompts = Array.from({ length: 16 }, (_, i) => [{ role: 'user', content: `Write a Python function number ${i} that adds numbers.` }]);
  const params = (m) => ({ model: MODEL, temperature: 0, max_tokens: 16, ...NO_THINK, messages: m });
  const sequential = [];
  for (const m of prompts) sequential.push((await streamChat(params(m))).content);
  const concurrent = await Promise.all(prompts.map((m) => streamChat(params(m)).then((s) => s.content)));
  assert.deepEqual(concurrent, sequential);
});

test('a client that disconnects mid-stream frees its sequence', async () => {
  const ctl = new AbortController();
  // Long enough to outlast the checks below: the demo model writes ~1,400 tokens a second, so
  // 400 tokens could finish before the status poll saw the stream running.
  const r = await fetch(`${URL_BASE}/v1/chat/completions`, {
    method: 'POST', signal: ctl.signal,
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ model: MODEL, max_tokens: 4000, ignore_eos: true, stream: true, messages: USER, ...NO_THINK }),
  });
  const reader = r.body.getReader();
  await reader.read();
  // The first chunk can leave before the engine admits the request (it is queued for a step),
  // so wait for it to be running (up to 10 s: 2 s once ran out on a loaded 2-core machine).
  let running = 0;
  for (const t1 = Date.now(); Date.now() - t1 < 10000; ) {
    running = (await status()).models[0].sequences.running;
    if (running === 1) break;
    await new Promise((res) => setTimeout(res, 10));
  }
  assert.equal(running, 1, 'the stream is running before the disconnect');
  ctl.abort();
  const t0 = Date.now();
  while (Date.now() - t0 < 3000) {
    const s = (await status()).models[0];
    running = s.sequences.running + s.sequences.queued;
    if (running === 0 && s.memory.state_slots_used === 0) break;
    await new Promise((res) => setTimeout(res, 50));
  }
  assert.equal(running, 0);
  assert.ok(Date.now() - t0 < 2000, `freed after ${Date.now() - t0} ms`);
});

test('bad input gets 400/413 with a clear message and the server keeps serving', async () => {
  const ok = JSON.stringify({ model: MODEL, max_tokens: 2, messages: USER });
  const cases = [
    ['/v1/chat/completions', '{"messages": [', 400, 'not valid JSON'],
    ['/v1/chat/completions', JSON.stringify({ model: MODEL, messages: USER, temperature: 'hot' }), 400, 'temperature'],
    ['/v1/chat/completions', JSON.stringify({ model: 'nope', messages: USER }), 400, "model 'nope'"],
    ['/v1/chat/completions', JSON.stringify({ model: MODEL, messages: [] }), 400, 'messages'],
    ['/v1/chat/completions', JSON.stringify({ model: MODEL, messages: USER, max_tokens: 100000000 }), 400, 'max'],
    ['/v1/chat/completions', JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'x '.repeat(200000) }] }), 400, 'context window'],
    ['/v1/chat/completions', Buffer.from('{"model": "demo", "messages": [{"role": "user", "content": "\xff\xfe"}]}', 'latin1'), 400, 'UTF-8'],
    ['/v1/chat/completions', JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'x'.repeat(2 << 20) }] }), 413, 'limit'],
    ['/v1/messages', JSON.stringify({ model: MODEL, messages: USER }), 400, 'max_tokens'],
    ['/v1/completions', JSON.stringify({ model: MODEL, prompt: [1, -5] }), 400, 'prompt[1]'],
    // Found by the fuzz targets (docs/TESTING.md): a number past a double's range was a 500, a
    // schema that refers to itself with no value in between crashed the server.
    ['/v1/chat/completions', `{"model": "${MODEL}", "messages": ${JSON.stringify(USER)}, "temperature": 1e999}`, 400, 'number overflow'],
    ['/v1/chat/completions', JSON.stringify({ model: MODEL, messages: USER, max_tokens: 8,
      response_format: { type: 'json_schema', json_schema: { name: 'loop', schema: { $ref: '#' } } } }), 400, 'leads back to itself'],
  ];
  for (const [path, body, code, text] of cases) {
    const r = await post(path, body);
    assert.equal(r.status, code, `${path} ${String(body).slice(0, 60)}`);
    const msg = path.startsWith('/v1/messages') ? r.body.error.message : r.body.error.message;
    if (path.startsWith('/v1/messages')) assert.equal(r.body.type, 'error');
    assert.ok(msg.includes(text), `${msg} should mention ${text}`);
    const again = await post('/v1/chat/completions', ok);
    assert.equal(again.status, 200, 'still serving');
  }
});

test('metrics and status', async () => {
  const m = await (await fetch(`${URL_BASE}/metrics`)).text();
  for (const name of ['tokenmill_requests_total', 'tokenmill_time_to_first_token_seconds_bucket',
    'tokenmill_running_sequences', 'tokenmill_cache_bytes_used', 'tokenmill_generation_tokens_total']) {
    assert.ok(m.includes(name), name);
  }
  const s = await status();
  assert.equal(s.models[0].name, MODEL);
  assert.ok(s.models[0].memory.budget_bytes > 0);
});
