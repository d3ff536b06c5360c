#!/usr/bin/env python3
"""Data side of tools/train_demo.py: the byte-level BPE tokenizer (trained with the `tokenizers`
library in Qwen's tokenizer.json format), chat-template rendering (jinja2, the way transformers'
apply_chat_template sets it up), corpus loading, synthetic chat samples and batch sampling."""

import json
import os
import re

import numpy as np

DOC_SEPARATOR = "<|endoftext|>"
# Qwen3.5's pre-tokenizer regex (transformers models/qwen3_5/tokenization_qwen3_5.py)
QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen's added tokens, in Qwen's order; special=False ones are ordinary text when decoding
ADDED_TOKENS = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
                ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
                ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
                ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
                ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
                ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
                ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
                ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
                ("<think>", False), ("</think>", False)]
SPLITS = ("code", "prose", "zh")


def read_docs(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return [d.strip("\n") for d in text.split("\n" + DOC_SEPARATOR + "\n") if d.strip()]


# ----------------------------------------------------------------------------- tokenizer
class BPETokenizer:
    """Wraps a tokenizers.Tokenizer (or ByteTokenizer in --smoke without the library)."""

    def __init__(self, tok):
        self.tok = tok

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts):
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=False)

    def token_id(self, s):
        return self.tok.token_to_id(s)

    def __len__(self):
        return self.tok.get_vocab_size(with_added_tokens=True)

    def save(self, path):
        self.tok.save(path)


class ByteTokenizer:
    """Fallback for local smoke tests only: bytes 0..255, then the added tokens."""

    def __init__(self):
        self.added = {t: 256 + i for i, (t, _) in enumerate(ADDED_TOKENS)}
        self.rev = {v: k for k, v in self.added.items()}
        self.pat = re.compile("(" + "|".join(re.escape(t) for t, _ in ADDED_TOKENS) + ")")

    def encode(self, text):
        out = []
        for part in self.pat.split(text):
            if part in self.added:
                out.append(self.added[part])
            elif part:
                out.extend(part.encode("utf-8"))
        return out

    def encode_batch(self, texts):
        return [self.encode(t) for t in texts]

    def decode(self, ids):
        bs, out = bytearray(), []
        for i in ids:
            if i in self.rev:
                out.append(bs.decode("utf-8", "replace"))
                bs = bytearray()
                out.append(self.rev[i])
            elif i < 256:
                bs.append(i)
        out.append(bs.decode("utf-8", "replace"))
        return "".join(out)

    def token_id(self, s):
        return self.added.get(s)

    def __len__(self):
        return 256 + len(ADDED_TOKENS)

    def save(self, path):
        with open(path, "w") as f:
            json.dump({"smoke_byte_tokenizer": True, "added": self.added}, f)


def train_tokenizer(corpus_dir, learned_vocab, caps, log):
    """Byte-level BPE in Qwen's format: NFC, Split(QWEN35_SPLIT, isolated) + ByteLevel(no regex),
    ByteLevel decoder; the added tokens come after the learned vocabulary (as in Qwen)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, \
        pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)

    def texts():
        for split in SPLITS:
            used = 0
            for d in read_docs(os.path.join(corpus_dir, "train_%s.txt" % split)):
                if used >= caps[split]:
                    break
                used += len(d.encode("utf-8"))
                yield d

    trainer = trainers.BpeTrainer(vocab_size=learned_vocab, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    tok.train_from_iterator(texts(), trainer=trainer)
    n_learned = tok.get_vocab_size(with_added_tokens=False)
    for content, special in ADDED_TOKENS:
        t = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False,
                       special=special)
        if special:
            tok.add_special_tokens([t])
        else:
            tok.add_tokens([t])
    log("tokenizer: %d learned tokens + %d added = %d" % (n_learned, len(ADDED_TOKENS),
                                                          tok.get_vocab_size(with_added_tokens=True)))
    return BPETokenizer(tok)


def tokenizer_config(tok, chat_template, model_max_length):
    """tokenizer_config.json in the form Qwen's checkpoints use."""
    decoder = {}
    for content, special in ADDED_TOKENS:
        decoder[str(tok.token_id(content))] = {"content": content, "lstrip": False, "normalized": False,
                                               "rstrip": False, "single_word": False, "special": special}
    return {"add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": decoder,
            "additional_special_tokens": [c for c, s in ADDED_TOKENS[1:14] if s],
            "bos_token": None, "chat_template": chat_template, "clean_up_tokenization_spaces": False,
            "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": model_max_length,
            "pad_token": "<|endoftext|>", "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}


# ----------------------------------------------------------------------------- chat template
def chat_renderer(template):
    """-> render(messages, add_generation_prompt, **kw): jinja2 set up like transformers'
    apply_chat_template (trim_blocks, lstrip_blocks, loopcontrols, tojson, raise_exception)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    compiled = env.from_string(template)

    def render(messages, add_generation_prompt=False, **kw):
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token="", eos_token="<|im_end|>", **kw)
    return render


def manual_chat(messages, add_generation_prompt=False):
    """Fallback when jinja2 is missing: the template's output for plain user/assistant turns."""
    out = []
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    for i, m in enumerate(messages):
        if m["role"] == "assistant" and i > last_user:
            out.append("<|im_start|>assistant\n<think>\n\n</think>\n\n%s<|im_end|>\n" % m["content"].strip())
        else:
            out.append("<|im_start|>%s\n%s<|im_end|>\n" % (m["role"], m["content"].strip()))
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n<think>\n")
    return "".join(out)


def synthetic_chats(corpus_dir, n, seed):
    """Question/answer pairs built from the corpus (title -> first paragraph; function name ->
    its source; Chinese page name -> its description), so the model learns the chat format and
    to end a reply with <|im_end|>."""
    rng = np.random.default_rng(seed)
    convs = []
    prose = read_docs(os.path.join(corpus_dir, "train_prose.txt"))
    code = read_docs(os.path.join(corpus_dir, "train_code.txt"))
    zh = read_docs(os.path.join(corpus_dir, "train_zh.txt"))
    for d in prose:
        paras = [p.strip() for p in d.split("\n\n") if len(p.strip()) > 80 and not p.startswith(" ")]
        title = d.split("\n", 1)[0].strip()
        if paras and 3 < len(title) < 80:
            q = ["Tell me about %s.", "What is %s?", "Explain %s briefly."][int(rng.integers(3))] % title
            convs.append([{"role": "user", "content": q}, {"role": "assistant", "content": paras[0][:1200]}])
    for d in code:
        for m in re.finditer(r"^def (\w+)\(.*?(?=^\S|\Z)", d, flags=re.M | re.S):
            body = m.group(0).rstrip()
            if 80 < len(body) < 1500 and not m.group(1).startswith("_"):
                q = ["Write a Python function named %s.", "Show me the code of %s.",
                     "How is %s implemented?"][int(rng.integers(3))] % m.group(1)
                convs.append([{"role": "user", "content": q},
                              {"role": "assistant", "content": "```python\n%s\n```" % body}])
    for d in zh:
        m = re.search(r"NAME\s*\n+\s*(\S+)\s*[-\u2014]+\s*(.+)", d)
        if m:
            paras = [p.strip() for p in d.split("\n\n") if sum("\u4e00" <= c <= "\u9fff" for c in p) > 20]
            ans = m.group(2).strip() + ("\n\n" + paras[1][:600] if len(paras) > 1 else "")
            convs.append([{"role": "user", "content": "%s 是什么？" % m.group(1)},
                          {"role": "assistant", "content": ans}])
    order = rng.permutation(len(convs))[:n]
    return [convs[i] for i in order]


# ----------------------------------------------------------------------------- token streams
def encode_stream(tok, docs, eos):
    """Documents -> one int32 stream, each document followed by eos."""
    ids = []
    for chunk in range(0, len(docs), 256):
        for e in tok.encode_batch(docs[chunk:chunk + 256]):
            ids.extend(e)
            ids.append(eos)
    return np.asarray(ids, dtype=np.int32)


class Sampler:
    """Deterministic batches: each row picks a stream by weight and a random window."""

    def __init__(self, streams, weights, seq_len, seed):
        self.names = [k for k in streams if len(streams[k]) > seq_len + 2]
        self.streams = streams
        w = np.array([weights[k] for k in self.names], dtype=np.float64)
        self.p = w / w.sum()
        self.len = seq_len
        self.rng = np.random.default_rng(seed)

    def batch(self, b):
        out = np.empty((b, self.len + 1), dtype=np.int64)
        which = self.rng.choice(len(self.names), size=b, p=self.p)
        for i, k in enumerate(which):
            s = self.streams[self.names[k]]
            o = int(self.rng.integers(0, len(s) - self.len - 1))
            out[i] = s[o:o + self.len + 1]
        return out
