#!/usr/bin/env python3
"""Trains tokenmill's bundled demo model: a small Qwen3.5-architecture hybrid (Gated DeltaNet +
gated attention) with an MTP head, from scratch, on .corpus/ (tools/build_corpus.sh), within a
hard wall-clock budget; then evaluates it against transformers (tools/demo_eval.py) and writes
the model directory in the real Hugging Face layout.

  python3 tools/train_demo.py --out OUT [--train-seconds 270] [--deadline EPOCH] [--steps N]
  python3 tools/train_demo.py --smoke --out /tmp/demo_smoke      (CPU, tiny, a few steps)

Reproducible: seeded data order and init; the step count is fixed after measuring the speed of
the first steps (recorded as train_log.json "total_steps"; --steps N replays it exactly).
"""

import argparse
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_data  # noqa: E402
import st_io  # noqa: E402
from qwen35_torch import FULL, LINEAR, Qwen35, TextConfig, init_hf_like  # noqa: E402

T0 = time.time()
MAX_SHARD_BYTES = 12 * 1000 * 1000
MAX_MODEL_BYTES = 32 * 1000 * 1000  # bf16 bytes of all tensors (decimal MB: the stricter reading)
MTP_WEIGHT = 0.3
MIX = {"code": 0.42, "prose": 0.38, "zh": 0.12, "chat": 0.08}
VISION = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "in_channels": 3,
          "patch_size": 4, "temporal_patch_size": 2, "spatial_merge_size": 2,
          "num_position_embeddings": 16}


def log(*a):
    print("[train_demo %6.1fs]" % (time.time() - T0), *a, flush=True)


def demo_config(vocab, smoke, eos, intermediate=832):
    if smoke:
        return TextConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                          linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=32,
                          linear_value_head_dim=32, layer_types=[LINEAR, LINEAR, LINEAR, FULL],
                          mtp_num_hidden_layers=1, tie_word_embeddings=True, eos_token_id=eos)
    return TextConfig(vocab_size=vocab, hidden_size=320, intermediate_size=intermediate,
                      num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                      linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64,
                      linear_value_head_dim=64, linear_conv_kernel_dim=4,
                      layer_types=[LINEAR, LINEAR, LINEAR, FULL] * 2, full_attention_interval=4,
                      rope_theta=10000000.0, partial_rotary_factor=0.25, mtp_num_hidden_layers=1,
                      tie_word_embeddings=True, eos_token_id=eos)


def hf_config(cfg, tok):
    t = cfg.hf_text_config("qwen3_5_text")
    t["eos_token_id"] = tok.token_id("<|im_end|>")
    t["pad_token_id"] = tok.token_id("<|endoftext|>")
    t["bos_token_id"] = None
    t["max_position_embeddings"] = 32768
    return {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
            "text_config": t, "vision_config": dict(VISION, model_type="qwen3_5_vision",
                                                    out_hidden_size=cfg.hidden_size),
            "tie_word_embeddings": cfg.tie_word_embeddings, "dtype": "bfloat16",
            "image_token_id": tok.token_id("<|image_pad|>"), "video_token_id": tok.token_id("<|video_pad|>"),
            "vision_start_token_id": tok.token_id("<|vision_start|>"),
            "vision_end_token_id": tok.token_id("<|vision_end|>")}


def lr_at(step, total, peak, warmup, floor=0.1):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p)))


def losses(model, w):
    """w [B, L+1] tokens. Main: CE of x_{t+1} from x_<=t. MTP: CE of x_{p+2} from (h_p, x_{p+1})."""
    x = w[:, :-1]
    h = model.hidden(x)
    logits = model.logits(h)
    main = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1))
    m = model.mtp_hidden(h[:, :-1], w[:, 1:-1])
    ml = model.logits(m)
    mtp = F.cross_entropy(ml.float().reshape(-1, ml.shape[-1]), w[:, 2:].reshape(-1))
    return main, mtp


def save_model(model, cfg, conf, out, visual=None):
    """bf16 safetensors (A_log float32), sharded <= MAX_SHARD_BYTES, mtp.* in the last shard."""
    sd = model.state_dict()
    order = sorted(sd, key=lambda k: (k.startswith("mtp."), 0 if "embed_tokens" in k else 1, _layer(k), k))
    tensors = {}
    for k in order:
        v = sd[k].detach().cpu()
        tensors[k] = v.float() if k.endswith("A_log") else v.to(torch.bfloat16)
    if visual:
        tensors.update({k: v.to(torch.bfloat16) for k, v in visual.items()})
    os.makedirs(out, exist_ok=True)
    files = st_io.save_sharded(tensors, out, MAX_SHARD_BYTES, metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(conf, f, indent=2)
        f.write("\n")
    return files


def _layer(k):
    parts = k.split(".")
    for i, p in enumerate(parts[:-1]):
        if p == "layers" and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return -1


def tiny_visual(conf):
    """The tiny vision tower's weights from transformers' own class (real names and shapes)."""
    import transformers
    torch.manual_seed(99)
    c = transformers.Qwen3_5Config(**{k: v for k, v in conf.items() if k not in ("architectures", "model_type", "dtype")})
    m = transformers.Qwen3_5ForConditionalGeneration(c)
    return {k: v.detach().float() for k, v in m.state_dict().items() if k.startswith("model.visual.")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default=".corpus")
    ap.add_argument("--out", required=True)
    ap.add_argument("--template", default="tests/fixtures/templates/qwen35.jinja")
    ap.add_argument("--train-seconds", type=float, default=270.0)
    ap.add_argument("--deadline", type=float, default=0.0, help="epoch seconds by which everything must end")
    ap.add_argument("--eval-reserve", type=float, default=120.0, help="seconds kept for saving + evaluation")
    ap.add_argument("--steps", type=int, default=0, help="fixed number of steps (replay)")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--vocab", type=int, default=12288, help="config vocab_size (tokenizer has 32 fewer)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--no-eval", action="store_true")
    args = ap.parse_args()

    if not os.path.exists(args.template):
        if not args.smoke:
            sys.exit("train_demo: chat template %s is missing: it is tests/fixtures/templates/qwen35.jinja "
                     "(written by the text module); run from the repository root" % args.template)
        log("smoke: no template at %s; using the manual ChatML fallback" % args.template)
        template = None
    else:
        with open(args.template, encoding="utf-8") as f:
            template = f.read()
    for s in demo_data.SPLITS:
        for part in ("train", "heldout"):
            p = os.path.join(args.corpus, "%s_%s.txt" % (part, s))
            if not os.path.exists(p):
                sys.exit("train_demo: %s is missing: run tools/build_corpus.sh first" % p)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    dev = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    out = args.out
    os.makedirs(out, exist_ok=True)
    deadline = args.deadline or (time.time() + args.train_seconds + args.eval_reserve + 120)

    # ---------------------------------------------------------------- tokenizer
    try:
        if args.smoke:
            raise ImportError("smoke")
        tok = demo_data.train_tokenizer(args.corpus, args.vocab - 32 - len(demo_data.ADDED_TOKENS),
                                        {"code": 6_000_000, "prose": 6_000_000, "zh": 3_000_000}, log)
        byte_fallback = False
    except ImportError as e:
        if not args.smoke:
            raise
        log("smoke: byte-level fallback tokenizer (%s)" % e)
        tok = demo_data.ByteTokenizer()
        byte_fallback = True
    vocab = args.vocab if not byte_fallback else 320
    assert len(tok) <= vocab
    eos_doc = tok.token_id("<|endoftext|>")
    im_end = tok.token_id("<|im_end|>")
    if template is not None:
        try:
            render = demo_data.chat_renderer(template)
            render([{"role": "user", "content": "hi"}], True)
            render_kind = "jinja2"
        except ImportError:
            render, render_kind = demo_data.manual_chat, "manual (jinja2 missing)"
    else:
        render, render_kind = demo_data.manual_chat, "manual (no template)"
    log("chat rendering:", render_kind)
    tok.save(os.path.join(out, "tokenizer.json"))
    if template is not None:
        with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
            json.dump(demo_data.tokenizer_config(tok, template, 32768), f, indent=2, ensure_ascii=False)
            f.write("\n")
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": None, "eos_token_id": [im_end, eos_doc], "pad_token_id": eos_doc,
                   "do_sample": True, "temperature": 0.7, "top_p": 0.9, "top_k": 20,
                   "repetition_penalty": 1.1}, f, indent=2)
        f.write("\n")

    # ---------------------------------------------------------------- data
    cap = 400_000 if args.smoke else None
    streams, held = {}, {}
    for s in demo_data.SPLITS:
        docs = demo_data.read_docs(os.path.join(args.corpus, "train_%s.txt" % s))
        if cap:
            docs = [d[:4000] for d in docs[: max(4, cap // 4000)]]
        streams[s] = demo_data.encode_stream(tok, docs, eos_doc)
        held[s] = demo_data.read_docs(os.path.join(args.corpus, "heldout_%s.txt" % s))
    chats = demo_data.synthetic_chats(args.corpus, 300 if args.smoke else 6000, args.seed)
    chat_texts = []
    for c in chats:
        try:
            chat_texts.append(render(c, False))
        except Exception:  # a template may reject odd content; the manual form is equivalent
            chat_texts.append(demo_data.manual_chat(c, False))
    streams["chat"] = demo_data.encode_stream(tok, chat_texts, eos_doc)
    # validation: the last 2 % of each training stream, never sampled; used to watch for
    # over-fitting (the corpus is small) and to pick the checkpoint; the held-out split stays pure
    val = {}
    for s in demo_data.SPLITS:
        cut = int(len(streams[s]) * 0.98)
        val[s], streams[s] = streams[s][cut:], streams[s][:cut]
    for k, v in streams.items():
        log("stream %-5s %9d tokens" % (k, len(v)))
    bytes_per_token = {s: sum(len(d.encode()) for d in held[s]) / max(1, sum(len(x) for x in tok.encode_batch(held[s])))
                       for s in demo_data.SPLITS}
    log("held-out bytes/token:", {k: round(v, 2) for k, v in bytes_per_token.items()})

    # ---------------------------------------------------------------- model
    inter = 896  # lowered in steps of 64 until the model fits MAX_MODEL_BYTES
    while True:
        cfg = demo_config(vocab, args.smoke, im_end, inter)
        model = Qwen35(cfg)
        if args.smoke or sum(p.numel() for p in model.parameters()) * 2 <= MAX_MODEL_BYTES - 200_000:
            break
        inter -= 64
    init_hf_like(model, std=0.02, generator=torch.Generator().manual_seed(args.seed))
    n_params = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for n, p in model.named_parameters() if n.startswith("mtp."))
    inter = cfg.intermediate_size
    log("model: %d params (%d MTP), intermediate %d, %.1f MB bf16" % (n_params, n_mtp, inter, n_params * 2 / 1e6))
    model.to(dev)
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.dim() >= 2 and "embed_tokens" not in n else no_decay).append(p)
    opt_kw = dict(lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    if dev.type == "cuda":
        opt_kw["fused"] = True
    try:
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": no_decay, "weight_decay": 0.0}], **opt_kw)
    except (TypeError, RuntimeError):
        opt_kw.pop("fused", None)
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": no_decay, "weight_decay": 0.0}], **opt_kw)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    # ---------------------------------------------------------------- train
    seq = 64 if args.smoke else args.seq_len
    bsz = 4 if args.smoke else args.batch
    sampler = demo_data.Sampler(streams, MIX, seq, args.seed)
    budget = args.train_seconds
    budget = max(20.0, min(budget, deadline - time.time() - args.eval_reserve))
    total = args.steps or (6 if args.smoke else 0)
    warmup = 3 if args.smoke else 150
    log("training budget %.0f s, batch %d x %d tokens, device %s" % (budget, bsz, seq, dev))
    hist, val_hist = [], []
    val_windows = {}
    for s in demo_data.SPLITS:
        n = max(0, (len(val[s]) - 1) // (seq + 1))
        idx = np.linspace(0, n - 1, num=min(8, n)).astype(int) if n else []
        if len(idx):
            val_windows[s] = torch.from_numpy(np.stack([val[s][i * (seq + 1):(i + 1) * (seq + 1)] for i in idx]).astype(np.int64))
    best = {"loss": float("inf"), "step": 0, "state": None}

    def validate():
        model.eval()
        r = {}
        with torch.no_grad():
            for s, w in val_windows.items():
                w = w.to(dev)
                if dev.type == "cuda":
                    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                        lm, lt = losses(model, w)
                else:
                    lm, lt = losses(model, w)
                r[s] = float(lm)
                r[s + "_mtp"] = float(lt)
        model.train()
        mean = float(np.mean([r[s] for s in val_windows])) if val_windows else float("nan")
        val_hist.append({"step": step, "val": r, "val_mean": mean, "seconds": round(time.time() - t_start, 2)})
        log("step %5d validation %s" % (step, {k: round(v, 3) for k, v in r.items()}))
        if mean < best["loss"]:
            best.update(loss=mean, step=step,
                        state={k: v.detach().clone() for k, v in model.state_dict().items()})
    t_start = time.time()
    step = 0
    measured_at = None
    stopped_by_clock = False
    bad_steps = 0
    model.train()
    while True:
        if total and step >= total:
            break
        elapsed = time.time() - t_start
        if elapsed > budget:
            stopped_by_clock = True
            break
        w = torch.from_numpy(sampler.batch(bsz)).to(dev, non_blocking=True)
        lr = lr_at(step, total or 10 ** 9, args.lr, warmup)
        for gi, g in enumerate(opt.param_groups):
            g["lr"] = lr
        if dev.type == "cuda":
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                main_l, mtp_l = losses(model, w)
        else:
            main_l, mtp_l = losses(model, w)
        loss = main_l + MTP_WEIGHT * mtp_l
        opt.zero_grad(set_to_none=True)
        if not torch.isfinite(loss):
            bad_steps += 1
            log("step %d: non-finite loss %s, skipped (%d so far)" % (step, float(loss), bad_steps))
            if bad_steps > 20:
                log("too many non-finite losses: stopping")
                break
            step += 1
            continue
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if not total and step == 5:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            measured_at = (step, time.time())
        if not total and measured_at and step == measured_at[0] + 20:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            rate = 20 / (time.time() - measured_at[1])
            remaining = budget - (time.time() - t_start)
            total = step + int(remaining * rate * 0.96)
            log("measured %.2f steps/s -> total_steps %d" % (rate, total))
        if total and step % max(2 if args.smoke else 100, total // 10) == 0 and step < total:
            validate()
        if step % (1 if args.smoke else 25) == 0 or step == 1:
            rec = {"step": step, "loss": float(main_l), "mtp_loss": float(mtp_l), "lr": lr,
                   "grad_norm": float(gnorm), "seconds": round(time.time() - t_start, 2),
                   "tokens": step * bsz * seq}
            hist.append(rec)
            if step % (1 if args.smoke else 100) == 0 or step == 1:
                log("step %5d loss %.4f mtp %.4f lr %.2e gnorm %.2f %.0f tok/s" % (
                    step, rec["loss"], rec["mtp_loss"], lr, rec["grad_norm"],
                    rec["tokens"] / max(1e-9, rec["seconds"])))
    train_seconds = time.time() - t_start
    validate()
    selected = step
    if best["state"] is not None and best["step"] != step:
        model.load_state_dict(best["state"])
        selected = best["step"]
        log("validation loss was lowest at step %d: keeping that checkpoint" % selected)
    log("trained %d steps in %.1f s (%s)" % (step, train_seconds, "stopped by the clock" if stopped_by_clock else "complete"))
    model.eval()

    # ---------------------------------------------------------------- save
    conf = hf_config(cfg, tok)
    visual = None
    if not args.smoke:
        try:
            visual = tiny_visual(conf)
        except Exception as e:
            log("no vision tower weights (%r): config keeps vision_config; transformers will init it" % e)
    files = save_model(model, cfg, conf, out, visual)
    log("saved", files)
    train_log = {"seed": args.seed, "total_steps": step, "selected_step": selected, "validation": val_hist,
                 "non_finite_steps": bad_steps, "planned_steps": total, "stopped_by_clock": stopped_by_clock,
                 "train_seconds": round(train_seconds, 1), "batch": bsz, "seq_len": seq, "peak_lr": args.lr,
                 "warmup": warmup, "mtp_weight": MTP_WEIGHT, "mix": MIX, "params": n_params, "mtp_params": n_mtp,
                 "intermediate_size": inter, "tokenizer_size": len(tok), "vocab_size": vocab,
                 "stream_tokens": {k: int(len(v)) for k, v in streams.items()},
                 "heldout_bytes_per_token": bytes_per_token, "chat_rendering": render_kind,
                 "device": str(dev), "torch": torch.__version__, "history": hist}
    with open(os.path.join(out, "train_log.json"), "w") as f:
        json.dump(train_log, f, indent=1)
    write_curves(hist, val_hist, out)
    if args.no_eval:
        return
    import demo_eval
    demo_eval.evaluate(model, cfg, tok, held, out, dev, render, deadline, smoke=args.smoke, log=log)


def write_curves(hist, val_hist, out):
    with open(os.path.join(out, "loss.csv"), "w") as f:
        f.write("step,tokens,seconds,loss,mtp_loss,lr,val_mean\n")
        vals = {v["step"]: v["val_mean"] for v in val_hist}
        for r in hist:
            f.write("%d,%d,%.2f,%.5f,%.5f,%.6g,%s\n" % (r["step"], r["tokens"], r["seconds"], r["loss"], r["mtp_loss"],
                                                       r["lr"], ("%.5f" % vals[r["step"]]) if r["step"] in vals else ""))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib missing: loss.csv only (plot it with gnuplot)")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["tokens"] / 1e6 for r in hist], [r["loss"] for r in hist], label="main (next token)")
    ax.plot([r["tokens"] / 1e6 for r in hist], [r["mtp_loss"] for r in hist], label="MTP (token after next)")
    if val_hist and hist:
        tok_per_step = hist[-1]["tokens"] / max(1, hist[-1]["step"])
        ax.plot([v["step"] * tok_per_step / 1e6 for v in val_hist], [v["val_mean"] for v in val_hist], "o-",
                label="validation (main, mean of code/prose/zh)")
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("cross-entropy (nats)")
    ax.set_title("tokenmill demo model")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "loss.png"), dpi=90)


if __name__ == "__main__":
    main()
