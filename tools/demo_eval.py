#!/usr/bin/env python3
"""Evaluation half of tools/train_demo.py, run on the saved (bf16) model directory:
  1. reload the shards with our own reader into tools/qwen35_torch.py (strict names);
  2. transformers cross-check: Qwen3_5ForConditionalGeneration.from_pretrained in float64 on the
     CPU vs qwen35_torch float64 on the same weights (max |logprob diff|), and demo_logprobs.json
     (3 held-out texts: ids + transformers per-token logprobs; 2 chat prompts rendered through the
     template: greedy 32-token continuations with top-1/top-2 margins);
  3. MTP teacher-forced first-draft acceptance on held-out code / prose / zh;
  4. held-out perplexity from transformers (context 512, non-overlapping windows) on the exact
     texts written to eval/heldout_{code,prose,zh}.txt;
  5. greedy sample generations; 6. an MLX 4-bit copy in mlx-4bit/. Writes summary.json.
Each stage is independent: a failure is recorded in summary.json and the next stage runs.
Can also be run alone: python3 tools/demo_eval.py --model OUT [--corpus .corpus]
"""

import argparse
import json
import math
import os
import shutil
import sys
import time
import traceback

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_data  # noqa: E402
import mlx_quant  # noqa: E402
import st_io  # noqa: E402
from qwen35_torch import Qwen35, TextConfig  # noqa: E402

CONTEXT = 512
PPL_TOKENS = 4096
LOGPROB_TOKENS = 200
CHAT_PROMPTS = ["Write a Python function that reverses a string.", "What does the os.path module do?"]
GEN_PROMPTS = [("code", "def fibonacci(n):\n"), ("code", "import os\nimport sys\n\n\ndef main():\n"),
               ("prose", "The Python standard library"), ("prose", "A list comprehension is"),
               ("zh", "ls 命令用于")]


def load_mine(model_dir, cfg, dtype, dev):
    m = Qwen35(cfg)
    t = st_io.load_dir(model_dir)
    sd = {k: v.to(dtype) for k, v in t.items() if not k.startswith("model.visual.")}
    missing, unexpected = m.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise RuntimeError("reload: missing %s unexpected %s" % (missing[:5], unexpected[:5]))
    return m.to(dtype).to(dev).eval(), t


def token_records(logits, ids):
    lp = torch.log_softmax(logits.double(), -1)
    top2 = torch.topk(logits.double(), 2, dim=-1)
    return {"ids": ids, "next_logprobs": [float(lp[t, ids[t + 1]]) for t in range(len(ids) - 1)],
            "top1": top2.indices[:, 0].tolist(), "top1_logprob": [float(lp[t, top2.indices[t, 0]]) for t in range(len(ids))],
            "margin": (top2.values[:, 0] - top2.values[:, 1]).tolist()}


def greedy(fwd, ids, steps, stop=None):
    ids = list(ids)
    toks, lps, margins = [], [], []
    with torch.no_grad():
        for _ in range(steps):
            logits = fwd(torch.tensor([ids]))[0, -1].double().cpu()
            lp = torch.log_softmax(logits, -1)
            top2 = torch.topk(logits, 2)
            t = int(top2.indices[0])
            toks.append(t)
            lps.append(float(lp[t]))
            margins.append(float(top2.values[0] - top2.values[1]))
            ids.append(t)
            if stop is not None and t in stop:
                break
    return toks, lps, margins


def ppl_windows(fwd, ids, context):
    """Non-overlapping windows of `context` tokens; within a window every token after the first
    is scored given the window's earlier tokens. Returns (total nll, scored tokens)."""
    nll, n = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(ids), context):
            w = ids[s:s + context]
            if len(w) < 2:
                continue
            lp = torch.log_softmax(fwd(torch.tensor([w]))[0].double(), -1).cpu()
            idx = torch.tensor(w[1:])
            nll -= float(lp[torch.arange(len(w) - 1), idx].sum())
            n += len(w) - 1
    return nll, n


def text_with_tokens(tok, docs, n_tokens, joiner="\n\n"):
    """The shortest prefix of the joined documents (cut at a line end) that has >= n_tokens."""
    text = joiner.join(docs)
    lines = text.split("\n")
    lo, hi = 1, len(lines)
    if len(tok.encode(text)) < n_tokens:
        return text
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tok.encode("\n".join(lines[:mid]))) >= n_tokens:
            hi = mid
        else:
            lo = mid + 1
    return "\n".join(lines[:lo])


def evaluate(model, cfg, tok, held, out, dev, render, deadline, smoke=False, log=print):
    summary = {"stages": {}, "errors": {}}
    T = time.time()
    n_ppl = 256 if smoke else PPL_TOKENS
    n_lp = 48 if smoke else LOGPROB_TOKENS
    ctx = 64 if smoke else CONTEXT
    eval_dir = os.path.join(out, "eval")
    os.makedirs(eval_dir, exist_ok=True)
    stop_ids = {tok.token_id("<|im_end|>"), tok.token_id("<|endoftext|>")}

    def stage(name, budget_s):
        left = deadline - time.time()
        if left < budget_s:
            summary["stages"][name] = "skipped: %.0f s left, needs about %.0f s" % (left, budget_s)
            log("stage %s skipped (%.0f s left)" % (name, left))
            return False
        return True

    def run(name, fn, budget_s):
        if not stage(name, budget_s):
            return
        t = time.time()
        try:
            fn()
            summary["stages"][name] = "ok in %.1f s" % (time.time() - t)
        except Exception as e:
            summary["stages"][name] = "FAILED: %r" % e
            summary["errors"][name] = traceback.format_exc()
            log("stage %s FAILED:\n%s" % (name, traceback.format_exc()))
        log("stage %s: %s" % (name, summary["stages"][name]))

    state = {}

    # ------------------------------------------------------------ texts
    texts = {}
    for s in demo_data.SPLITS:
        texts[s] = text_with_tokens(tok, held[s], n_ppl)
        with open(os.path.join(eval_dir, "heldout_%s.txt" % s), "w", encoding="utf-8") as f:
            f.write(texts[s])
    lp_texts = {s: text_with_tokens(tok, held[s][:1], n_lp, "") for s in demo_data.SPLITS}

    # ------------------------------------------------------------ 1. reload
    def reload():
        m32, tensors = load_mine(out, cfg, torch.float32, dev)
        state["m32"], state["tensors"] = m32, tensors
        ids = torch.tensor([tok.encode(lp_texts["code"])[:64]], device=dev)
        with torch.no_grad():
            a = torch.log_softmax(m32(ids).float(), -1)
        summary["reload_tensors"] = len(tensors)
        summary["mtp_tensors"] = sum(1 for k in tensors if k.startswith("mtp."))
        summary["visual_tensors"] = sum(1 for k in tensors if k.startswith("model.visual."))
        summary["reload_logprob_finite"] = bool(torch.isfinite(a).all())
    run("reload", reload, 5)
    if "m32" not in state:
        _write(out, summary)
        return summary
    m32 = state["m32"]

    # ------------------------------------------------------------ 2. transformers cross-check + demo_logprobs
    def crosscheck():
        m64 = Qwen35(cfg).double().eval()
        m64.load_state_dict({k: v.double() for k, v in state["tensors"].items()
                             if not k.startswith("model.visual.")}, strict=True)
        mine = lambda ids: m64(ids)
        if smoke:
            ref_fwd, src = mine, "qwen35_torch float64 (smoke: no transformers)"
            summary["transformers"] = None
        else:
            import gen_golden
            hf = gen_golden.HF()
            with open(os.path.join(out, "config.json")) as f:
                conf = json.load(f)
            model, loading, impl, rename = hf.load(out, "dense", conf["text_config"], state["tensors"])
            missing, bad = hf.check_params(model, {k: v.float() for k, v in state["tensors"].items()}, rename)
            tied = torch.equal(model.lm_head.weight, model.get_input_embeddings().weight)
            summary["transformers"] = {"version": hf.version, "class": type(model).__name__,
                                       "attn_implementation": impl, "loading_info": loading,
                                       "params_missing": missing, "params_changed": bad,
                                       "lm_head_tied": tied, "notes": hf.notes}
            ref_fwd, src = hf.fwd(model), "transformers %s %s float64 CPU" % (hf.version, type(model).__name__)
            state["hf_fwd"] = ref_fwd
        state["m64"] = mine
        recs, worst = [], 0.0
        with torch.no_grad():
            for s in demo_data.SPLITS:
                ids = tok.encode(lp_texts[s])
                r = token_records(ref_fwd(torch.tensor([ids]))[0], ids)
                mr = token_records(mine(torch.tensor([ids]))[0], ids)
                d = max(abs(a - b) for a, b in zip(r["next_logprobs"], mr["next_logprobs"]))
                worst = max(worst, d)
                r.update(split=s, text=lp_texts[s], qwen35_torch_max_abs_diff=d)
                recs.append(r)
        chats = []
        for q in CHAT_PROMPTS:
            text = render([{"role": "user", "content": q}], True)
            ids = tok.encode(text)
            toks, lps, margins = greedy(ref_fwd, ids, 32)
            mt, _, _ = greedy(mine, ids, 32)
            chats.append({"messages": [{"role": "user", "content": q}], "add_generation_prompt": True,
                          "rendered": text, "prompt_ids": ids, "tokens": toks, "logprobs": lps,
                          "margins": margins, "text": tok.decode(toks), "qwen35_torch_equal": mt == toks})
        summary["qwen35_torch_vs_reference_max_abs_logprob_diff"] = worst
        doc = {"source": src, "model": "models/demo (this directory's safetensors)",
               "tokenization": "tokenizer.json via the tokenizers library, no special tokens added",
               "texts": recs, "chat": chats}
        with open(os.path.join(out, "demo_logprobs.json"), "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        log("cross-check: max |logprob(qwen35_torch) - logprob(%s)| = %.3g" % (src, worst))
        try:  # informational: does transformers' own tokenizer agree with tokenizer.json?
            if not smoke:
                from transformers import AutoTokenizer
                at = AutoTokenizer.from_pretrained(out)
                same = all(at.encode(lp_texts[s], add_special_tokens=False) == tok.encode(lp_texts[s])
                           for s in demo_data.SPLITS)
                rendered = at.apply_chat_template([{"role": "user", "content": CHAT_PROMPTS[0]}],
                                                  tokenize=False, add_generation_prompt=True)
                summary["autotokenizer"] = {"class": type(at).__name__, "same_ids": same,
                                            "same_chat_rendering": rendered == chats[0]["rendered"]}
        except Exception as e:
            summary["autotokenizer"] = "failed: %r" % e
    run("transformers_crosscheck", crosscheck, 40)

    # ------------------------------------------------------------ 3. MTP acceptance
    def mtp_accept():
        res = {}
        for s in demo_data.SPLITS:
            ids = demo_data.encode_stream(tok, held[s], tok.token_id("<|endoftext|>"))
            n = min(len(ids) // ctx, 4 if smoke else 96) * ctx  # up to 96 windows (49k tokens)
            if n == 0:
                continue
            w = torch.from_numpy(ids[:n].astype(np.int64)).view(-1, ctx).to(dev)
            acc_t = acc_a = main_a = cnt = 0
            with torch.no_grad():
                for b in range(0, w.shape[0], 16):
                    x = w[b:b + 16]
                    h = m32.hidden(x)
                    main_top = m32.logits(h).argmax(-1)  # target's greedy token at each position
                    d = m32.logits(m32.mtp_hidden(h[:, :-1], x[:, 1:])).argmax(-1)  # draft for x_{p+2}
                    # acceptance: draft at p equals the target's own argmax at p+1 (given x_{<=p+1})
                    acc_t += int((d[:, :-1] == main_top[:, 1:-1]).sum())
                    acc_a += int((d[:, :-1] == x[:, 2:]).sum())
                    main_a += int((main_top[:, :-1] == x[:, 1:]).sum())
                    cnt += d[:, :-1].numel()
            res[s] = {"positions": cnt, "acceptance_vs_target_greedy": acc_t / cnt,
                      "draft_accuracy_vs_actual_next2": acc_a / cnt,
                      "main_top1_accuracy": main_a / (w.shape[0] * (ctx - 1))}
            log("MTP %s: acceptance %.3f, vs actual %.3f (main top-1 %.3f)" % (
                s, res[s]["acceptance_vs_target_greedy"], res[s]["draft_accuracy_vs_actual_next2"],
                res[s]["main_top1_accuracy"]))
        summary["mtp"] = res
    run("mtp_acceptance", mtp_accept, 10)

    # ------------------------------------------------------------ 4. perplexity
    def perplexity():
        res = {}
        ref = state.get("hf_fwd") or state.get("m64")
        for s in demo_data.SPLITS:
            ids = tok.encode(texts[s])
            r = {"file": "eval/heldout_%s.txt" % s, "tokens": len(ids), "context": ctx}
            if ref is not None:
                nll, n = ppl_windows(ref, ids, ctx)
                r["reference_ppl"] = math.exp(nll / n)
            if state.get("m64") is not None and state.get("hf_fwd") is not None:
                nll2, n2 = ppl_windows(state["m64"], ids, ctx)
                r["qwen35_torch_f64_ppl"] = math.exp(nll2 / n2)
            nll3, n3 = ppl_windows(lambda x: m32(x.to(dev)), ids, ctx)
            r["qwen35_torch_f32_ppl"] = math.exp(nll3 / n3)
            r["scored_tokens"] = n3
            res[s] = r
            log("perplexity %s: %s" % (s, {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}))
        summary["perplexity"] = res
        summary["perplexity_definition"] = (
            "ids = tokenizer.json encoding of the file (no special tokens); windows ids[0:%d], ids[%d:%d], ...; "
            "every token but a window's first is scored given the window's earlier tokens; "
            "ppl = exp(total NLL / scored tokens)" % (ctx, ctx, 2 * ctx))
    run("perplexity", perplexity, 30)

    # ------------------------------------------------------------ 5. generations
    def generations():
        gens = []
        fwd = lambda x: m32(x.to(dev))
        for kind, p in GEN_PROMPTS:
            toks, _, _ = greedy(fwd, tok.encode(p), 40 if smoke else 80, stop_ids)
            gens.append({"kind": kind, "prompt": p, "continuation": tok.decode(toks)})
        for q in CHAT_PROMPTS:
            text = render([{"role": "user", "content": q}], True)
            toks, _, _ = greedy(fwd, tok.encode(text), 40 if smoke else 120, stop_ids)
            gens.append({"kind": "chat", "prompt": q, "continuation": tok.decode(toks)})
        summary["generations"] = gens
        with open(os.path.join(out, "generations.txt"), "w", encoding="utf-8") as f:
            for g in gens:
                f.write("=== %s | greedy | prompt: %r\n%s%s\n\n" % (g["kind"], g["prompt"], g["prompt"] if g["kind"] != "chat" else "",
                                                                      g["continuation"]))
    run("generations", generations, 10)

    # ------------------------------------------------------------ 6. MLX 4-bit copy
    def mlx4():
        hf = {k: v.float().numpy() for k, v in state["tensors"].items()}
        t, dtypes, quant = mlx_quant.to_mlx(hf, 4, 64, moe_router_bits=None, tie_word_embeddings=cfg.tie_word_embeddings)
        files = {}
        for k, v in t.items():
            files[k] = v.astype(np.uint32) if dtypes[k] == "U32" else (
                v.astype(np.float32) if dtypes[k] == "F32" else torch.from_numpy(v.astype(np.float32)).to(torch.bfloat16))
        d = os.path.join(out, "mlx-4bit")
        os.makedirs(d, exist_ok=True)
        st_io.save_sharded(files, d, 12 * 1000 * 1000, metadata={"format": "mlx"})
        with open(os.path.join(out, "config.json")) as f:
            conf = json.load(f)
        conf["quantization"] = quant
        conf["quantization_config"] = quant
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(conf, f, indent=2)
        for fn in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            if os.path.exists(os.path.join(out, fn)):
                shutil.copy(os.path.join(out, fn), os.path.join(d, fn))
        deq = mlx_quant.from_mlx(t, quant)
        m = Qwen35(cfg)
        m.load_state_dict({k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in deq.items()}, strict=False)
        m = m.to(dev).eval()
        res = {"bytes": sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))}
        for s in demo_data.SPLITS:
            nll, n = ppl_windows(lambda x: m(x.to(dev)), tok.encode(texts[s]), ctx)
            res["qwen35_torch_f32_ppl_" + s] = math.exp(nll / n)
        summary["mlx_4bit"] = res
        log("MLX 4-bit copy:", res)
    run("mlx_4bit", mlx4, 15)

    summary["eval_seconds"] = round(time.time() - T, 1)
    _write(out, summary)
    return summary


def _write(out, summary):
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1, ensure_ascii=False)


def main():
    ap = argparse.ArgumentParser(description="re-run the demo model's evaluation")
    ap.add_argument("--model", required=True)
    ap.add_argument("--corpus", default=".corpus")
    ap.add_argument("--template", default="tests/fixtures/templates/qwen35.jinja")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--seconds", type=float, default=600)
    args = ap.parse_args()
    with open(os.path.join(args.model, "config.json")) as f:
        cfg = TextConfig.from_hf(json.load(f))
    try:
        from tokenizers import Tokenizer
        tok = demo_data.BPETokenizer(Tokenizer.from_file(os.path.join(args.model, "tokenizer.json")))
    except ImportError:
        tok = demo_data.ByteTokenizer()
    with open(args.template, encoding="utf-8") as f:
        render = demo_data.chat_renderer(f.read())
    held = {s: demo_data.read_docs(os.path.join(args.corpus, "heldout_%s.txt" % s)) for s in demo_data.SPLITS}
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    evaluate(None, cfg, tok, held, args.model, dev, render, time.time() + args.seconds, smoke=args.smoke)


if __name__ == "__main__":
    main()
