// Shared setup for the API tests: clients pointed at the server test_api.sh started.
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

export const URL_BASE = process.env.TM_API_URL;
export const KEY = process.env.TM_API_KEY;
export const MODEL = process.env.TM_MODEL || 'demo';
if (!URL_BASE) throw new Error('TM_API_URL is not set: run tests/api/test_api.sh');

export const openai = new OpenAI({ baseURL: `${URL_BASE}/v1`, apiKey: KEY, maxRetries: 0 });
export const anthropic = new Anthropic({ baseURL: URL_BASE, apiKey: KEY, maxRetries: 0 });

export const USER = [{ role: 'user', content: 'Write a Python function that reverses a string.' }];
export const GREEDY = { model: MODEL, temperature: 0, max_tokens: 24 };

export async function status() {
  const r = await fetch(`${URL_BASE}/api/status`, { headers: { Authorization: `Bearer ${KEY}` } });
  return r.json();
}

export async function post(path, body, headers = {}) {
  const r = await fetch(`${URL_BASE}${path}`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${KEY}`, ...headers },
    body,
  });
  return { status: r.status, body: await r.json().catch(() => null) };
}

export async function streamChat(params) {
  const s = await openai.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let content = '', reasoning = '', usage = null, finish = null;
  for await (const chunk of s) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      content += c.delta?.content ?? '';
      reasoning += c.delta?.reasoning_content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { content, reasoning, usage, finish };
}
