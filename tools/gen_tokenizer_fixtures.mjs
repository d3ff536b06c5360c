// Generates the tokenizer exactness fixtures in tests/fixtures/tokenizer/ from the reference
// implementation, @lenml/tokenizers (a port of transformers.js), run on Node.
//
//   node tools/gen_tokenizer_fixtures.mjs        (from the repository root, after `npm ci`)
//
// Outputs (deterministic: a seeded PRNG builds the corpus; rerunning gives identical files):
//   corpus.jsonl          one test string per line: a JSON string, or {"hex": "..."} for raw bytes
//                         that are not valid UTF-8 (the reference sees them decoded by TextDecoder,
//                         i.e. each maximal invalid subpart becomes U+FFFD).
//   spm_legacy/, spm_metaspace/  two small SentencePiece-style BPE tokenizers (byte_fallback,
//                         "▁" word marker) trained here on part of the corpus: they add the
//                         Metaspace layout and added tokens with lstrip/rstrip, which the real
//                         Llama 2 tokenizer (family llama2) does not have (see docs/TESTING.md).
//   <family>.ids          line 1: JSON header {family, tokenizer, config, special, skip}; then one
//                         line per corpus string: a round-trip flag ('1' when the reference's
//                         decode(encode(x)) == x) followed by the ids, each as 3 characters of
//                         base 94 (ASCII 33..126, most significant first).
//   <family>.decode.jsonl {"i": index, "d": reference decode} for strings that do not round-trip.
// The header's "special" holds [index, ids] for encode(x, add_special_tokens=true) on a sample
// and "skip" holds [index, decode(ids, skip_special_tokens=true)] on strings with special tokens.
import fs from "node:fs";
import path from "node:path";
import { TokenizerLoader } from "@lenml/tokenizers";
import { buildCorpus } from "./tokenizer_corpus.mjs";

const ROOT = path.resolve(path.dirname(new URL(import.meta.url).pathname), "..");
const OUT = path.join(ROOT, "tests/fixtures/tokenizer");
const NM = "node_modules/@lenml";

const FAMILIES = [
  ["qwen3", `${NM}/tokenizer-qwen3/models`],
  ["llama3", `${NM}/tokenizer-llama3/models`],
  ["gemma3", `${NM}/tokenizer-gemma3/models`],
  ["deepseek_v3", `${NM}/tokenizer-deepseek_v3/models`],
  ["gptoss", `${NM}/tokenizer-gptoss/models`],
  ["llama2", `${NM}/tokenizer-llama2/models`],  // SentencePiece BPE: the real Llama 2 vocabulary
  ["spm_legacy", "tests/fixtures/tokenizer/spm_legacy"],
  ["spm_metaspace", "tests/fixtures/tokenizer/spm_metaspace"],
];

// ---- SentencePiece-style BPE trained on the corpus -------------------------------------------
const SPM = "\u2581";

function trainSpmBpe(texts, numMerges) {
  const words = new Map();  // word (symbols joined by \u0000) -> count
  const charCount = new Map();
  for (const t of texts) {
    const norm = SPM + t.replaceAll(" ", SPM);
    for (const w of norm.split(new RegExp(`(?=${SPM})`, "u"))) {
      if (!w) continue;
      const chars = Array.from(w);
      for (const c of chars) charCount.set(c, (charCount.get(c) ?? 0) + 1);
      const key = chars.join("\u0000");
      words.set(key, (words.get(key) ?? 0) + 1);
    }
  }
  // Alphabet: characters seen at least 4 times (rarer ones exercise byte_fallback).
  const alphabet = [...charCount.entries()].filter(([, n]) => n >= 4)
    .sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1)).slice(0, 500).map(([c]) => c);
  const vocab = { "<unk>": 0, "<s>": 1, "</s>": 2 };
  for (let b = 0; b < 256; ++b) vocab[`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`] = 3 + b;
  for (const c of alphabet) if (!(c in vocab)) vocab[c] = Object.keys(vocab).length;
  const inAlpha = new Set(alphabet);
  let ws = [...words.entries()].map(([k, n]) => [k.split("\u0000"), n]);
  const merges = [];
  for (let m = 0; m < numMerges; ++m) {
    const pairs = new Map();
    for (const [syms, n] of ws) {
      for (let i = 0; i + 1 < syms.length; ++i) {
        const a = syms[i], b = syms[i + 1];
        if (!(a in vocab) || !(b in vocab) || (a.length === 1 && !inAlpha.has(a))) continue;
        const k = a + "\u0000" + b;
        pairs.set(k, (pairs.get(k) ?? 0) + n);
      }
    }
    let best = null, bestN = 1;
    for (const [k, n] of pairs) if (n > bestN || (n === bestN && best !== null && k < best)) { best = k; bestN = n; }
    if (best === null) break;
    const [a, b] = best.split("\u0000");
    merges.push([a, b]);
    if (!((a + b) in vocab)) vocab[a + b] = Object.keys(vocab).length;
    ws = ws.map(([syms, n]) => {
      const out = [];
      for (let i = 0; i < syms.length; ++i) {
        if (i + 1 < syms.length && syms[i] === a && syms[i + 1] === b) { out.push(a + b); ++i; } else out.push(syms[i]);
      }
      return [out, n];
    });
  }
  return { vocab, merges };
}

function spmAddedTokens(vocab) {
  const at = (content, id, special, extra = {}) => ({ id, content, single_word: false, lstrip: false,
    rstrip: false, normalized: false, special, ...extra });
  const n = Object.keys(vocab).length;
  return [at("<unk>", 0, true), at("<s>", 1, true), at("</s>", 2, true),
    at("<|im_start|>", n, true), at("<|im_end|>", n + 1, true, { rstrip: true }),
    at("<think>", n + 2, false, { lstrip: true }), at("</think>", n + 3, false)];
}

function writeSpmTokenizers(trainTexts) {
  const { vocab, merges } = trainSpmBpe(trainTexts, 1500);
  const model = (mergeFormat) => ({ type: "BPE", dropout: null, unk_token: "<unk>",
    continuing_subword_prefix: null, end_of_word_suffix: null, fuse_unk: true, byte_fallback: true,
    ignore_merges: false, vocab,
    merges: mergeFormat === "string" ? merges.map(([a, b]) => `${a} ${b}`) : merges });
  const post = { type: "TemplateProcessing",
    single: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
    pair: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
      { SpecialToken: { id: "<s>", type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } }],
    special_tokens: { "<s>": { id: "<s>", ids: [1], tokens: ["<s>"] } } };
  // Llama 2's original layout: the normalizer adds the word marker.
  const legacy = { version: "1.0", truncation: null, padding: null, added_tokens: spmAddedTokens(vocab),
    normalizer: { type: "Sequence", normalizers: [{ type: "Prepend", prepend: SPM },
      { type: "Replace", pattern: { String: " " }, content: SPM }] },
    pre_tokenizer: null, post_processor: post,
    decoder: { type: "Sequence", decoders: [{ type: "Replace", pattern: { String: SPM }, content: " " },
      { type: "ByteFallback" }, { type: "Fuse" }, { type: "Strip", content: " ", start: 1, stop: 0 }] },
    model: model("string") };
  // Mistral's layout: a Metaspace pre-tokenizer and decoder.
  const meta = { type: "Metaspace", replacement: SPM, prepend_scheme: "first", split: false, add_prefix_space: true };
  const metaspace = { version: "1.0", truncation: null, padding: null, added_tokens: spmAddedTokens(vocab),
    normalizer: null, pre_tokenizer: meta, post_processor: post,
    decoder: { type: "Sequence", decoders: [meta, { type: "ByteFallback" }, { type: "Fuse" }] },
    model: model("pairs") };
  const config = { bos_token: "<s>", eos_token: "</s>", unk_token: "<unk>", clean_up_tokenization_spaces: false,
    model_max_length: 4096, additional_special_tokens: ["<|im_start|>", "<|im_end|>"],
    chat_template: [{ name: "default", template: "{% for m in messages %}{{ m.content }}{% endfor %}" },
      { name: "tool_use", template: "{{ tools }}" }] };
  for (const [dir, tj] of [["spm_legacy", legacy], ["spm_metaspace", metaspace]]) {
    fs.mkdirSync(path.join(OUT, dir), { recursive: true });
    fs.writeFileSync(path.join(OUT, dir, "tokenizer.json"), JSON.stringify(tj) + "\n");
    fs.writeFileSync(path.join(OUT, dir, "tokenizer_config.json"), JSON.stringify(config, null, 1) + "\n");
  }
}

// ---- fixtures -----------------------------------------------------------------------------------
const B94 = (n) => {
  if (n < 0 || n >= 94 ** 3) throw new Error(`id ${n} does not fit 3 base-94 digits`);
  return String.fromCharCode(33 + Math.floor(n / 8836), 33 + (Math.floor(n / 94) % 94), 33 + (n % 94));
};

function loadTokenizer(dir) {
  const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(ROOT, dir, "tokenizer.json"), "utf8"));
  const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(ROOT, dir, "tokenizer_config.json"), "utf8"));
  return TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
}

function main() {
  fs.mkdirSync(OUT, { recursive: true });
  const corpus = buildCorpus(20240601);
  fs.writeFileSync(path.join(OUT, "corpus.jsonl"),
    corpus.map((e) => JSON.stringify(e.hex !== undefined ? { hex: e.hex } : e.text)).join("\n") + "\n");
  writeSpmTokenizers(corpus.filter((e, i) => i % 3 === 0 && e.hex === undefined).map((e) => e.text));
  const dec = { clean_up_tokenization_spaces: false };
  for (const [family, dir] of FAMILIES) {
    const tok = loadTokenizer(dir);
    const lines = [], decodes = [], special = [], skip = [];
    corpus.forEach((e, i) => {
      const ids = tok.encode(e.text, { add_special_tokens: false });
      const back = ids.length ? tok.decode(ids, dec) : "";
      const rt = back === e.text;
      lines.push((rt ? "1" : "0") + ids.map(B94).join(""));
      if (!rt) decodes.push(JSON.stringify({ i, d: back }));
      if (i % 40 === 0) special.push([i, tok.encode(e.text, { add_special_tokens: true })]);
      if (ids.length && ids.some((id) => tok.all_special_ids.includes(id)) && skip.length < 60) {
        skip.push([i, tok.decode(ids, { ...dec, skip_special_tokens: true })]);
      }
    });
    const header = { family, tokenizer: `${dir}/tokenizer.json`, config: `${dir}/tokenizer_config.json`,
      count: corpus.length, special, skip };
    fs.writeFileSync(path.join(OUT, `${family}.ids`), JSON.stringify(header) + "\n" + lines.join("\n") + "\n");
    fs.writeFileSync(path.join(OUT, `${family}.decode.jsonl`), decodes.join("\n") + (decodes.length ? "\n" : ""));
    console.log(`${family}: ${corpus.length} strings, ${decodes.length} do not round-trip`);
  }
}

main();
