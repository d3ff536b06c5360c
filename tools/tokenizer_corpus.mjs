// The tokenizer test corpus: >= 2,000 varied strings built deterministically from a seed
// (used by tools/gen_tokenizer_fixtures.mjs and tools/bench_tokenizer_reference.mjs).
// Characters are drawn from blocks assigned before Unicode 14, so the reference's ICU tables and
// the Debian PCRE2/utf8proc tables agree on their properties.

export function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const WORDS = (
  "the of and to in is was he for it with as his on be at by had are but from or have an they " +
  "which one you were all her she there would their we him been has when who will no more if out " +
  "so up said what its about than into them can only other time new some could these two may first " +
  "then do any like my now over such our man me even most made after also did many before must " +
  "through back years where much your way well down should because each just those people how too " +
  "little state good very make world still own see men work long get here between both life being " +
  "under never day same another know while last might us great old year off come since against go " +
  "came right used take three tokenizer inference server request model latency throughput kernel " +
  "memory cache attention gradient parameter Hello World Paris London OpenAI Qwen Llama GPU CPU API " +
  "HTTP JSON naïve café résumé coöperate façade jalapeño Zürich São Paulo Ærøskøbing Straße"
).split(" ");
const CONTRACTIONS = ["don't", "it's", "we're", "I've", "they'll", "she'd", "I'm", "WON'T", "IT'S",
  "We'RE", "you'Ll", "o'clock", "rock'n'roll", "'tis", "students'"];
const PUNCT = [".", ",", "!", "?", ";", ":", "...", " -", " —", " (", ")", "\"", "'", "!?", " &", " /"];
const CJK_ZH = "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生自会那后能对着事其里所去行过家十用发天如然作方成者多日都三小军二无同么经法当起与好看学进种将还分此心前面又定见只主没公从知全给长提它但向气手样己美很被特所化给电话程序数据模型字节编码测试";
const JA = "これはテストですカタカナひらがな日本語の文章を分割しますトークナイザーでしょうかありがとうございますラーメン東京駅に行きたい";
const KO = "안녕하세요토크나이저테스트입니다한국어문장서울에서만나요감사합니다좋은하루되세요";
const SCRIPTS = [
  "Привет, как дела? Съешь же ещё этих мягких французских булок.",
  "Γειά σου Κόσμε· ἀλφάβητο ΑΒΓΔ αβγδ ς",
  "مرحبا بالعالم، هذا اختبار ١٢٣٤٥٦",
  "שלום עולם זה מבחן",
  "नमस्ते दुनिया, यह एक परीक्षण है। १२३",
  "สวัสดีชาวโลก นี่คือการทดสอบ",
  "Xin chào thế giới, đây là một bài kiểm tra tiếng Việt",
  "Բարև աշխարհ, ქართული ენა, አማርኛ ቋንቋ",
  "Türkçe ğüşıöç İstanbul ıI, Polski źdźbło, Čeština ŘŠŽ",
];
const EMOJI = ["😀", "👍", "👍🏽", "❤️", "🇫🇷", "🇯🇵", "👨‍👩‍👧‍👦", "🧑‍💻", "🏳️‍🌈", "✨", "🔥", "🤖",
  "👩🏿‍🚀", "☕", "🎉", "1️⃣", "#️⃣", "🐍", "🦀", "🚀", "😂😂😂", "🙏🏻", "🫡"].filter((e) => !e.includes("🫡"));
const SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
  "</tool_call>", "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
  "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>", "<｜begin▁of▁sentence｜>",
  "<｜end▁of▁sentence｜>", "<｜Assistant｜>", "<｜User｜>", "<|start|>", "<|channel|>", "<|message|>",
  "<|return|>", "<|end|>", "<s>", "</s>", "<unk>", "<|im_start", "<think", "< think>", "<|im_end|",
  "<|fim_prefix|>", "<image_soft_token>", "[INST]", "<unused12>", "<0x41>", "<｜tool▁sep｜>"];
const SPACES = [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2009", "\u200b", "\u2028",
  "\u0085", "\ufeff", "\u000b", "\u000c", "\u202f", "\u1680"];
// Strings whose NFC form differs from the input (decomposed accents, singletons, jamo).
const COMBINING = ["e\u0301", "a\u0308", "o\u0302\u0301", "n\u0303", "A\u030a", "\u212b", "\u212a",
  "\u2126", "\u1100\u1161\u11a8", "\u1112\u1161\u11ab", "\uf900", "u\u031b\u0323", "c\u0327",
  "i\u0307", "\u0915\u093c", "e\u0301\u0301", "\u0301", "Å", "é", "x\u0300\u0316", "ﬁ", "①", "²"];
const SNIPPETS = [
  "def f(x):\n    return x * 2  # double\n",
  "for i in range(10):\n\tprint(f\"{i:>4}\")\n",
  "class Foo:\n    def __init__(self, a: int = 0) -> None:\n        self.a = a\n",
  "#include <vector>\nint main() {\n  std::vector<int> v{1, 2, 3};\n  return v.size() > 2 ? 0 : 1;\n}\n",
  "template <typename T>\nT max(T a, T b) { return a < b ? b : a; }\r\n",
  "{\"name\": \"tokenmill\", \"version\": \"0.1.0\", \"ids\": [1, 2, 3], \"ok\": true, \"x\": null}",
  "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
  "if (a && b || !c) { x += 0x1F; y <<= 3; z = a->b.c[4]; }",
  "    indented\n        deeper\n\t\ttabs\n",
  "<html><body><div class=\"x\">Hi &amp; bye</div></body></html>",
  "$ ls -la /usr/bin | grep -E '^-r' > out.txt 2>&1",
  "const f = async (a, b) => { await g(a ?? b); };",
  "x = [i**2 for i in range(100) if i % 3 == 0]",
  "fn main() { let s: &str = \"héllo\"; println!(\"{s}\"); }",
  "key: value\nlist:\n  - one\n  - two\n",
  "    \n\n\n    \n",
];

function pick(rnd, arr) { return arr[Math.floor(rnd() * arr.length)]; }
function int(rnd, lo, hi) { return lo + Math.floor(rnd() * (hi - lo + 1)); }
function chars(rnd, src, n) {
  const a = Array.from(src);
  let s = "";
  for (let i = 0; i < n; ++i) s += pick(rnd, a);
  return s;
}

function sentence(rnd) {
  const n = int(rnd, 3, 18);
  const w = [];
  for (let i = 0; i < n; ++i) {
    let x = rnd() < 0.1 ? pick(rnd, CONTRACTIONS) : pick(rnd, WORDS);
    if (i === 0 || rnd() < 0.08) x = x[0].toUpperCase() + x.slice(1);
    if (rnd() < 0.03) x = x.toUpperCase();
    w.push(x);
    if (rnd() < 0.12) w[w.length - 1] += pick(rnd, PUNCT);
  }
  return w.join(" ") + pick(rnd, [".", ".", "!", "?", ":", ""]);
}

function number(rnd) {
  switch (int(rnd, 0, 7)) {
    case 0: return String(int(rnd, 0, 9999));
    case 1: return chars(rnd, "0123456789", int(rnd, 5, 40));
    case 2: return `${int(rnd, 0, 999)},${String(int(rnd, 0, 999)).padStart(3, "0")},${String(int(rnd, 0, 999)).padStart(3, "0")}`;
    case 3: return (rnd() * 1e6).toFixed(int(rnd, 1, 6));
    case 4: return `+1 (${int(rnd, 200, 999)}) 555-${int(rnd, 1000, 9999)}`;
    case 5: return chars(rnd, "٠١٢٣٤٥٦٧٨٩０１２３４５６７８９¹²³½ⅫⅣ", int(rnd, 1, 8));
    case 6: return `v${int(rnd, 0, 9)}.${int(rnd, 0, 20)}.${int(rnd, 0, 99)}-rc${int(rnd, 1, 3)}`;
    default: return `${int(rnd, 1, 31)}/${int(rnd, 1, 12)}/20${int(rnd, 10, 30)} ${int(rnd, 0, 23)}:${String(int(rnd, 0, 59)).padStart(2, "0")}`;
  }
}

function whitespace(rnd) {
  const parts = [];
  const n = int(rnd, 1, 6);
  for (let i = 0; i < n; ++i) {
    parts.push(pick(rnd, WORDS));
    const sp = pick(rnd, SPACES);
    parts.push(rnd() < 0.5 ? sp.repeat(int(rnd, 1, 40)) : sp);
  }
  if (rnd() < 0.3) parts.unshift(" ".repeat(int(rnd, 1, 9)));
  return parts.join("");
}

function withSpecials(rnd) {
  const parts = [];
  const n = int(rnd, 1, 5);
  for (let i = 0; i < n; ++i) {
    parts.push(pick(rnd, SPECIALS));
    parts.push(pick(rnd, ["", " ", "\n", "  ", "user\n", "assistant\n", " hi ", sentence(rnd), "\n\n"]));
  }
  return parts.join(pick(rnd, ["", "", " ", "\n"]));
}

function mixed(rnd) {
  const gens = [() => sentence(rnd), () => chars(rnd, CJK_ZH, int(rnd, 1, 30)), () => chars(rnd, JA, int(rnd, 1, 20)),
    () => chars(rnd, KO, int(rnd, 1, 20)), () => pick(rnd, SCRIPTS), () => pick(rnd, EMOJI), () => number(rnd),
    () => pick(rnd, COMBINING), () => pick(rnd, SPACES), () => pick(rnd, SPECIALS), () => pick(rnd, PUNCT)];
  let s = "";
  const n = int(rnd, 2, 10);
  for (let i = 0; i < n; ++i) s += pick(rnd, gens)() + (rnd() < 0.5 ? " " : "");
  return s;
}

// Random code points from assigned, pre-Unicode-14 ranges (no surrogates).
const RANGES = [[0x20, 0x7e], [0xa0, 0x24f], [0x300, 0x36f], [0x370, 0x3ff], [0x400, 0x4ff], [0x590, 0x5ff],
  [0x600, 0x6ff], [0x900, 0x97f], [0xe00, 0xe5b], [0x1100, 0x11ff], [0x2000, 0x206f], [0x20a0, 0x20bf],
  [0x2100, 0x214f], [0x2190, 0x22ff], [0x2460, 0x24ff], [0x3000, 0x303f], [0x3040, 0x30ff], [0x4e00, 0x9fa5],
  [0xac00, 0xd7a3], [0xf900, 0xfa2d], [0xfe30, 0xfe4f], [0xff00, 0xffef], [0x1f300, 0x1f5ff], [0x1f600, 0x1f64f],
  [0x1d400, 0x1d7ff], [0x10000, 0x1000b], [0x20000, 0x2a6d6]];
function randomUnicode(rnd) {
  let s = "";
  const n = int(rnd, 1, 60);
  for (let i = 0; i < n; ++i) {
    const [lo, hi] = pick(rnd, RANGES);
    const cp = int(rnd, lo, hi);
    if (cp === 0xfffe || cp === 0xffff) continue;
    s += String.fromCodePoint(cp);
  }
  return s;
}

function paragraph(rnd) {
  const n = int(rnd, 2, 8);
  const s = [];
  for (let i = 0; i < n; ++i) s.push(sentence(rnd));
  return s.join(rnd() < 0.8 ? " " : "\n\n");
}

function code(rnd) {
  let s = pick(rnd, SNIPPETS);
  if (rnd() < 0.3) s = s.replaceAll("\n", "\r\n");
  if (rnd() < 0.3) s = s.replaceAll("    ", "\t");
  if (rnd() < 0.5) s += pick(rnd, SNIPPETS);
  return s;
}

// Byte strings that are not valid UTF-8 (as hex); the reference sees TextDecoder's decoding.
function invalidBytes(rnd) {
  const pieces = ["ff", "c0af", "e28", "ed a080".replace(" ", ""), "f4908080", "80", "c3", "e282ac", "f09f98",
    "f09f9880", "fe", "efbbbf", "48656c6c6f", "20", "0a", "00", "c328", "e0a080", "e08080", "f8888080"];
  let h = "";
  const n = int(rnd, 1, 8);
  for (let i = 0; i < n; ++i) h += pick(rnd, pieces);
  return h.length % 2 ? h + "0" : h;
}

export function buildCorpus(seed) {
  const rnd = mulberry32(seed);
  const out = [];
  const add = (text) => out.push({ text });
  // Fixed edge cases first.
  ["", " ", "  ", "\n", "\r\n", "\t", "a", "A", "'s", " 's", "'S", "ſ", "Hello world", " Hello", "Hello ",
    "hello\n\nworld", "\u2581", "\u2581\u2581x", "▁ ▁", "<0x41>", "<|im_start|>", "<|im_start|><|im_end|>",
    " <think> ", "<think>\n</think>\n\n", "a\u0301", "\u00e9", "\ufeff", "\u0085", "ℌ𝔢𝔩𝔩𝔬", "ﬀ ﬁ ﬂ",
    "1234567890123", "3.14159", "-42", "x".repeat(300), " ".repeat(300), "\n".repeat(50), "ab".repeat(200),
    "😀".repeat(30), "的".repeat(100), "\t \t \t", "\r\r\n\n", "Ø ø Ǆ ǅ ǆ ß ẞ ﬃ"].forEach(add);
  const gens = [
    [260, () => sentence(rnd)], [160, () => paragraph(rnd)], [220, () => code(rnd)],
    [120, () => chars(rnd, CJK_ZH, int(rnd, 1, 60))], [80, () => chars(rnd, JA, int(rnd, 1, 40))],
    [80, () => chars(rnd, KO, int(rnd, 1, 40)) + (rnd() < 0.5 ? " " + chars(rnd, KO, 5) : "")],
    [90, () => Array.from({ length: int(rnd, 1, 8) }, () => pick(rnd, EMOJI)).join(rnd() < 0.5 ? "" : " ")],
    [160, () => whitespace(rnd)], [140, () => Array.from({ length: int(rnd, 1, 5) }, () => number(rnd)).join(pick(rnd, [" ", "", ", ", "\n"]))],
    [240, () => mixed(rnd)], [220, () => withSpecials(rnd)],
    [150, () => Array.from({ length: int(rnd, 1, 6) }, () => pick(rnd, COMBINING) + pick(rnd, WORDS)).join(pick(rnd, [" ", ""]))],
    [60, () => pick(rnd, SCRIPTS) + " " + sentence(rnd)], [120, () => randomUnicode(rnd)],
  ];
  for (const [n, g] of gens) for (let i = 0; i < n; ++i) add(g());
  // A few long strings (exercise long-word BPE and long whitespace/number runs).
  add(chars(rnd, CJK_ZH, 3000));
  add(Array.from({ length: 30 }, () => paragraph(rnd)).join("\n\n"));
  add(chars(rnd, "abcdefghijklmnopqrstuvwxyz", 4000));
  add(chars(rnd, "0123456789", 3000));
  add(" ".repeat(5000) + "x" + "\t".repeat(1000));
  add(chars(rnd, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", 2000) + "==");
  const decoder = new TextDecoder("utf-8");
  for (let i = 0; i < 40; ++i) {
    const hex = invalidBytes(rnd);
    const bytes = Uint8Array.from(hex.match(/../g).map((b) => parseInt(b, 16)));
    out.push({ text: decoder.decode(bytes), hex });
  }
  return out;
}
