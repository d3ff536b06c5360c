// Load generator for the HTTP API, with the official openai client: N concurrent streaming chat
// completions (greedy, ignore_eos, a fixed number of tokens each), per-stream decode rate and
// time to first token, aggregate tokens per second; then the time to first token of a long
// prompt, idle and while N streams decode. Prints a table and writes JSON.
//
//   node tools/loadgen.mjs --url http://127.0.0.1:8000 --key KEY --model NAME \
//        [--streams 1,16,64] [--max-tokens 256] [--long-prompt-words 700] [--busy-streams N]
//        [--json out.json]
// --busy-streams: streams decoding while the long prompt's TTFT is measured (default: the most).
//
// Needs node_modules (npm ci at the repository root). tools/http_vs_engine.sh runs it next to
// `tokenmill bench` on the same model.
import OpenAI from 'openai';
import { writeFileSync } from 'node:fs';

function args() {
  const a = { url: 'http://127.0.0.1:8000', key: '', model: 'demo', streams: '1,16', maxTokens: 256,
              longPromptWords: 700, busyStreams: 0, json: '' };
  const v = process.argv.slice(2);
  for (let i = 0; i < v.length; i += 2) {
    const k = v[i], x = v[i + 1];
    if (x === undefined) throw new Error(`loadgen: ${k} needs a value`);
    if (k === '--url') a.url = x;
    else if (k === '--key') a.key = x;
    else if (k === '--model') a.model = x;
    else if (k === '--streams') a.streams = x;
    else if (k === '--max-tokens') a.maxTokens = Number(x);
    else if (k === '--long-prompt-words') a.longPromptWords = Number(x);
    else if (k === '--busy-streams') a.busyStreams = Number(x);
    else if (k === '--json') a.json = x;
    else throw new Error(`loadgen: unknown option ${k} (see the comment at the top of the file)`);
  }
  return a;
}

const opt = args();
const client = new OpenAI({ baseURL: `${opt.url}/v1`, apiKey: opt.key || 'none', maxRetries: 0 });
const now = () => performance.now() / 1000;

// One streaming request; times are seconds on the shared clock.
async function stream(prompt, maxTokens) {
  const t0 = now();
  const s = await client.chat.completions.create({
    model: opt.model, messages: [{ role: 'user', content: prompt }], temperature: 0,
    max_tokens: maxTokens, ignore_eos: true, stream: true, stream_options: { include_usage: true },
    chat_template_kwargs: { enable_thinking: false },
  });
  let first = null, tokens = 0, promptTokens = 0;
  for await (const chunk of s) {
    if (chunk.usage) {
      tokens = chunk.usage.completion_tokens;
      promptTokens = chunk.usage.prompt_tokens;
    }
    const d = chunk.choices[0]?.delta;
    if (first === null && (d?.content || d?.reasoning_content)) first = now();
  }
  return { start: t0, first: first ?? now(), end: now(), tokens, promptTokens };
}

const shortPrompt = 'Write a long story about a lighthouse keeper.';
const longPrompt = Array.from({ length: opt.longPromptWords }, (_, i) => `word${i % 97}`).join(' ');

const results = { url: opt.url, model: opt.model, max_tokens: opt.maxTokens, streams: [] };
await stream(shortPrompt, 8);  // warm-up: recordings, caches
for (const n of opt.streams.split(',').map(Number)) {
  const runs = await Promise.all(Array.from({ length: n }, () => stream(shortPrompt, opt.maxTokens)));
  const perStream = runs.map((r) => (r.tokens - 1) / Math.max(r.end - r.first, 1e-9));
  const firstAll = Math.min(...runs.map((r) => r.first)), endAll = Math.max(...runs.map((r) => r.end));
  const total = runs.reduce((s, r) => s + r.tokens, 0);
  const entry = {
    streams: n,
    aggregate_tok_s: total / Math.max(endAll - firstAll, 1e-9),
    per_stream_tok_s_mean: perStream.reduce((s, x) => s + x, 0) / n,
    ttft_s_mean: runs.reduce((s, r) => s + (r.first - r.start), 0) / n,
    tokens: total,
  };
  results.streams.push(entry);
  console.log(`streams ${String(n).padStart(3)}: aggregate ${entry.aggregate_tok_s.toFixed(1)} tok/s, ` +
              `per stream ${entry.per_stream_tok_s_mean.toFixed(2)} tok/s, mean TTFT ${entry.ttft_s_mean.toFixed(3)} s`);
}

// A long prompt's time to first token, idle and while the largest stream count decodes.
const idle = await stream(longPrompt, 1);
const n = opt.busyStreams || Math.max(...opt.streams.split(',').map(Number));
const background = Array.from({ length: n }, () => stream(shortPrompt, opt.maxTokens));
await new Promise((res) => setTimeout(res, 500));  // let them reach decode
const busy = await stream(longPrompt, 1);
await Promise.all(background);
results.long_prompt = { words: opt.longPromptWords, prompt_tokens: idle.promptTokens, ttft_idle_s: idle.first - idle.start,
                        ttft_busy_s: busy.first - busy.start, busy_streams: n };
console.log(`long prompt (${idle.promptTokens} tokens) TTFT: idle ${results.long_prompt.ttft_idle_s.toFixed(3)} s, ` +
            `with ${n} streams decoding ${results.long_prompt.ttft_busy_s.toFixed(3)} s ` +
            `(${(results.long_prompt.ttft_busy_s / results.long_prompt.ttft_idle_s).toFixed(2)}x)`);
if (opt.json) writeFileSync(opt.json, JSON.stringify(results, null, 2) + '\n');
