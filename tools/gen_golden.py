#!/usr/bin/env python3
"""Writes tokenmill's golden fixtures: tiny random-weight Qwen3.5 checkpoints in the real Hugging
Face layouts plus reference logprobs and greedy continuations computed by transformers in
float64 on the CPU (run on the GPU machine, which has transformers 5; see tools/device_job.sh).

Checkpoints (each a directory with config.json, model.safetensors, reference.json):
  dense            Qwen3_5ForConditionalGeneration layout, bf16 (A_log F32), untied lm_head, a
                   tiny vision tower (model.visual.*, to be skipped) and an MTP head (mtp.*);
                   layer_types [linear, full, linear, full]
  moe              Qwen3_5MoeForConditionalGeneration layout, 8 experts top-2 + shared expert,
                   experts as transformers keeps them (fused gate_up_proj / down_proj)
  causal_tied      Qwen3_5ForCausalLM layout (model.layers.*), tied embeddings, config.json
                   without layer_types (full_attention_interval 4 decides the pattern)
  dense_mlx_q{2,3,4,8}g64, dense_mlx_q4g32, moe_mlx_q4g32
                   MLX affine copies (tools/mlx_quant.py); their reference is transformers run
                   on the DEQUANTIZED weights (norms minus 1, conv transposed back)
reference.json: for 4 id sequences (lengths 1, 13, 64, 150) each position's logprob of the
actual next id, top-1 id, top-1 logprob and top-1/top-2 logit margin; greedy continuations (24
tokens) of 2 prompts with per-step margins; dense also has MTP reference drafts (from
tools/qwen35_torch.py: transformers has no MTP module).

--smoke: no transformers needed; references come from tools/qwen35_torch.py (for local tests of
this script only; never commit smoke output).
"""

import argparse
import json
import os
import shutil
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mlx_quant  # noqa: E402
import st_io  # noqa: E402
from qwen35_torch import FULL, LINEAR, Qwen35, TextConfig, causal_names  # noqa: E402

SEQ_LENGTHS = (1, 13, 64, 150)
GREEDY_PROMPT_LENGTHS = (5, 20)
GREEDY_STEPS = 24
FINAL_NORM_GAIN = 7.0  # 1 + w of the final norm: makes the distributions sharp (see README)
VISION = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
          "in_channels": 3, "patch_size": 4, "temporal_patch_size": 2, "spatial_merge_size": 2,
          "num_position_embeddings": 16}


def log(*a):
    print("[gen_golden %6.1fs]" % (time.time() - T0), *a, flush=True)


T0 = time.time()


# ----------------------------------------------------------------------------- configs
def dense_cfg():
    return TextConfig(vocab_size=512, hidden_size=64, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                      linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                      linear_value_head_dim=32, linear_conv_kernel_dim=4,
                      layer_types=[LINEAR, FULL, LINEAR, FULL], full_attention_interval=2,
                      mtp_num_hidden_layers=1, tie_word_embeddings=False, eos_token_id=1)


def moe_cfg():
    c = dense_cfg()
    c.intermediate_size = 0
    c.num_experts, c.num_experts_per_tok = 8, 2
    c.moe_intermediate_size, c.shared_expert_intermediate_size = 32, 64
    c.mtp_num_hidden_layers = 0
    return c


def causal_cfg():
    return TextConfig(vocab_size=512, hidden_size=64, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                      linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                      linear_value_head_dim=32, full_attention_interval=4,
                      mtp_num_hidden_layers=0, tie_word_embeddings=True, eos_token_id=1)


def hf_config(cfg, kind):
    """config.json for a checkpoint kind: 'dense' / 'moe' (nested) or 'causal' (flat)."""
    if kind == "causal":
        t = cfg.hf_text_config("qwen3_5_text")
        t.pop("layer_types")  # the loader must derive them from full_attention_interval
        t["architectures"] = ["Qwen3_5ForCausalLM"]
        t["dtype"] = "bfloat16"
        return t
    moe = kind == "moe"
    t = cfg.hf_text_config("qwen3_5_moe_text" if moe else "qwen3_5_text")
    v = dict(VISION, model_type="qwen3_5_moe_vision" if moe else "qwen3_5_vision",
             out_hidden_size=cfg.hidden_size)
    return {"architectures": ["Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"],
            "model_type": "qwen3_5_moe" if moe else "qwen3_5", "text_config": t, "vision_config": v,
            "tie_word_embeddings": cfg.tie_word_embeddings, "dtype": "bfloat16"}


# ----------------------------------------------------------------------------- weights
def sharp_weights(cfg, seed):
    """Random weights that make every layer matter and the output distribution sharp:
    matrices ~ N(0, 1/fan_in), embeddings ~ N(0, 1), zero-centred norms w ~ N(0, 0.1) (so the
    +1 convention is visible), final norm 1 + w ~ FINAL_NORM_GAIN, gated norm 1 + N(0, 0.1),
    A_log = log U(0.5, 8), dt_bias ~ N(0, 0.5), router scaled x6 (clear top-k gaps).
    Returns an ordered dict name -> float32 tensor rounded to bf16 (A_log kept float32)."""
    g = torch.Generator().manual_seed(seed)
    model = Qwen35(cfg)
    out = {}
    for name, p in model.state_dict().items():
        shp = tuple(p.shape)
        if name.endswith("A_log"):
            v = torch.empty(shp).uniform_(0.5, 8.0, generator=g).log()
        elif name.endswith("dt_bias"):
            v = torch.randn(shp, generator=g) * 0.5
        elif name.endswith("linear_attn.norm.weight"):
            v = 1.0 + torch.randn(shp, generator=g) * 0.1
        elif name == "model.language_model.norm.weight":
            # tied heads use the N(0, 0.5^2) embeddings: scale the gain to the same logit spread
            gain = FINAL_NORM_GAIN / (0.5 * cfg.hidden_size ** 0.5 if cfg.tie_word_embeddings else 1.0)
            v = (gain - 1.0) + torch.randn(shp, generator=g) * 0.1 * gain / FINAL_NORM_GAIN
        elif len(shp) == 1:
            v = torch.randn(shp, generator=g) * 0.1
        elif name.endswith("embed_tokens.weight"):
            # tied: smaller, so the current token's own embedding does not dominate the logits
            v = torch.randn(shp, generator=g) * (0.5 if cfg.tie_word_embeddings else 1.0)
        elif name.endswith("conv1d.weight"):
            v = torch.randn(shp, generator=g) / shp[-1] ** 0.5
        elif name.endswith("mlp.gate.weight"):
            v = torch.randn(shp, generator=g) * 6.0 / shp[-1] ** 0.5
        else:  # [out, in] or experts [E, out, in]
            v = torch.randn(shp, generator=g) / shp[-1] ** 0.5
        out[name] = v.float() if name.endswith("A_log") else v.to(torch.bfloat16).float()
    return out


def file_tensors(weights):
    """What goes on disk: bf16 except A_log (F32)."""
    return {k: (v.float() if k.endswith("A_log") else v.to(torch.bfloat16)) for k, v in weights.items()}


def fabricated_visual(hidden):
    """model.visual.* names of the Qwen3.5 vision tower (used only when transformers cannot
    build the tiny tower): the loader must skip all of them."""
    g = torch.Generator().manual_seed(7)
    d, i, p, t = VISION["hidden_size"], VISION["intermediate_size"], VISION["patch_size"], VISION["temporal_patch_size"]
    m = d * VISION["spatial_merge_size"] ** 2
    shapes = {"patch_embed.proj.weight": (d, 3, t, p, p), "patch_embed.proj.bias": (d,),
              "pos_embed.weight": (VISION["num_position_embeddings"], d),
              "blocks.0.norm1.weight": (d,), "blocks.0.norm1.bias": (d,),
              "blocks.0.norm2.weight": (d,), "blocks.0.norm2.bias": (d,),
              "blocks.0.attn.qkv.weight": (3 * d, d), "blocks.0.attn.qkv.bias": (3 * d,),
              "blocks.0.attn.proj.weight": (d, d), "blocks.0.attn.proj.bias": (d,),
              "blocks.0.mlp.linear_fc1.weight": (i, d), "blocks.0.mlp.linear_fc1.bias": (i,),
              "blocks.0.mlp.linear_fc2.weight": (d, i), "blocks.0.mlp.linear_fc2.bias": (d,),
              "merger.norm.weight": (d,), "merger.norm.bias": (d,),
              "merger.linear_fc1.weight": (m, m), "merger.linear_fc1.bias": (m,),
              "merger.linear_fc2.weight": (hidden, m), "merger.linear_fc2.bias": (hidden,)}
    return {"model.visual." + k: (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16).float()
            for k, s in shapes.items()}


# ----------------------------------------------------------------------------- references
def top_info(logits_row):
    lp = torch.log_softmax(logits_row.double(), -1)
    top2 = torch.topk(logits_row.double(), 2)
    return lp, int(top2.indices[0]), float(lp[top2.indices[0]]), float(top2.values[0] - top2.values[1])


def reference(fwd, vocab, seed, with_ids=None):
    """fwd(ids [1,T] long) -> logits [1,T,V]. Returns the reference dict."""
    rng = np.random.default_rng(seed)
    seqs = with_ids or [rng.integers(2, vocab, size=n).tolist() for n in SEQ_LENGTHS]
    out = {"sequences": [], "greedy": []}
    with torch.no_grad():
        for ids in seqs:
            logits = fwd(torch.tensor([ids]))[0]
            rec = {"ids": ids, "next_logprobs": [], "top1": [], "top1_logprob": [], "margin": []}
            for t in range(len(ids)):
                lp, t1, t1lp, mg = top_info(logits[t])
                if t + 1 < len(ids):
                    rec["next_logprobs"].append(float(lp[ids[t + 1]]))
                rec["top1"].append(t1)
                rec["top1_logprob"].append(t1lp)
                rec["margin"].append(mg)
            out["sequences"].append(rec)
        prng = np.random.default_rng(seed + 1)
        for n in GREEDY_PROMPT_LENGTHS:
            prompt = prng.integers(2, vocab, size=n).tolist()
            ids = list(prompt)
            toks, lps, margins = [], [], []
            for _ in range(GREEDY_STEPS):
                logits = fwd(torch.tensor([ids]))[0, -1]
                lp, t1, t1lp, mg = top_info(logits)
                toks.append(t1)
                lps.append(t1lp)
                margins.append(mg)
                ids.append(t1)
            out["greedy"].append({"prompt": prompt, "tokens": toks, "logprobs": lps, "margins": margins})
    return out


def max_diff(a, b):
    d = 0.0
    for sa, sb in zip(a["sequences"], b["sequences"]):
        d = max(d, max([abs(x - y) for x, y in zip(sa["next_logprobs"], sb["next_logprobs"])] or [0.0]))
        d = max(d, max(abs(x - y) for x, y in zip(sa["top1_logprob"], sb["top1_logprob"])))
    return d


def greedy_agree(a, b):
    return all(ga["tokens"] == gb["tokens"] for ga, gb in zip(a["greedy"], b["greedy"]))


def mine_fwd(cfg, weights):
    m = Qwen35(cfg).double().eval()
    sd = {k: v.double() for k, v in weights.items() if k in m.state_dict()}
    missing, unexpected = m.load_state_dict(sd, strict=False)
    assert not unexpected, unexpected
    missing = [k for k in missing if not k.startswith("mtp.")]
    assert not missing, missing
    return m, (lambda ids: m(ids))


def mtp_reference(model, ids):
    """Teacher-forced MTP drafts over one sequence: at p, draft for x_{p+2} from (h_p, x_{p+1})."""
    with torch.no_grad():
        x = torch.tensor([ids])
        h = model.hidden(x)
        m = model.mtp_hidden(h[:, :-1], x[:, 1:])
        lp = torch.log_softmax(model.logits(m)[0].double(), -1)
        top = lp.argmax(-1)
    return {"ids": ids, "source": "tools/qwen35_torch.py float64 (transformers has no MTP module)",
            "draft_top1": top.tolist(),
            "draft_top1_logprob": [float(lp[p, top[p]]) for p in range(len(ids) - 1)],
            "actual_next2_logprob": [float(lp[p, ids[p + 2]]) for p in range(len(ids) - 2)]}


# ----------------------------------------------------------------------------- transformers
class HF:
    """Everything that touches transformers (GPU machine only)."""

    def __init__(self):
        import transformers
        self.tf = transformers
        self.version = transformers.__version__
        self.notes = []

    def build_visual(self, cfg_json, moe):
        """Tiny vision tower weights from transformers' own class (real names and shapes)."""
        tf = self.tf
        torch.manual_seed(1234)
        if moe:
            conf = tf.Qwen3_5MoeConfig(**{k: v for k, v in cfg_json.items() if k not in ("architectures", "model_type", "dtype")})
            model = tf.Qwen3_5MoeForConditionalGeneration(conf)
        else:
            conf = tf.Qwen3_5Config(**{k: v for k, v in cfg_json.items() if k not in ("architectures", "model_type", "dtype")})
            model = tf.Qwen3_5ForConditionalGeneration(conf)
        sd = model.state_dict()
        vis = {k: v.detach().float().to(torch.bfloat16).float() for k, v in sd.items() if k.startswith("model.visual.")}
        text_names = sorted(k for k in sd if not k.startswith("model.visual."))
        return vis, text_names

    def _from_pretrained(self, cls, path, kw):
        attempts = [dict(dtype=torch.float64, output_loading_info=True), dict(dtype=torch.float64),
                    dict(torch_dtype=torch.float64, output_loading_info=True), dict(torch_dtype=torch.float64)]
        err = None
        for a in attempts:
            try:
                r = cls.from_pretrained(path, **a, **kw)
                if isinstance(r, tuple):
                    return r
                return r, {"note": "no loading info"}
            except TypeError as e:
                err = e
                self.notes.append("from_pretrained(%s) raised %r" % (sorted(a), e))
        raise err

    def load(self, path, kind, text_cfg=None, tensors=None):
        """-> (model, loading info, attn implementation, rename) where rename maps our
        conditional-layout names to the loaded model's parameter names. Tries the real class
        with from_pretrained first; if that fails for a conditional checkpoint, builds the
        text-only *ForCausalLM from the text config and loads the text tensors by name."""
        tf = self.tf
        cls = {"dense": tf.Qwen3_5ForConditionalGeneration, "moe": tf.Qwen3_5MoeForConditionalGeneration,
               "causal": tf.Qwen3_5ForCausalLM}[kind]
        kw = {"attn_implementation": "sdpa"}
        if kind == "moe":
            kw["experts_implementation"] = "eager"
        try:
            model, info = self._from_pretrained(cls, path, kw)
            model.eval()
            self._force_impls(model, kind)
            return model, _info(info), self._impls(model), None
        except Exception as e:
            if kind == "causal":
                raise
            self.notes.append("%s.from_pretrained failed (%r); using the text-only CausalLM" % (cls.__name__, e))
        # fallback: text-only class, weights loaded by name (strict)
        if kind == "moe":
            tcls, ccls = getattr(tf, "Qwen3_5MoeForCausalLM"), tf.Qwen3_5MoeTextConfig
        else:
            tcls, ccls = tf.Qwen3_5ForCausalLM, tf.Qwen3_5TextConfig
        conf = ccls(**{k: v for k, v in text_cfg.items() if k != "model_type"})
        try:
            model = tcls._from_config(conf, dtype=torch.float64, **kw)
        except TypeError:
            model = tcls._from_config(conf, torch_dtype=torch.float64, attn_implementation="sdpa")
        model = model.to(torch.float64).eval()
        self._force_impls(model, kind)
        rename = lambda k: ("model." + k[len("model.language_model."):]) if k.startswith("model.language_model.") else k
        sd = {rename(k): v.double() for k, v in tensors.items()
              if not k.startswith(("mtp.", "model.visual."))}
        if "lm_head.weight" not in sd:
            sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
        result = model.load_state_dict(sd, strict=True)
        return model, {"fallback": "text-only %s, load_state_dict strict" % tcls.__name__, "result": str(result)}, \
            self._impls(model), rename

    def _force_impls(self, model, kind):
        """float64 needs SDPA (eager attention does its softmax in float32) and eager experts
        (grouped_mm has no float64); set them again after loading in case a kwarg was ignored."""
        for fn, val in (("set_attn_implementation", "sdpa"), ("set_experts_implementation", "eager")):
            if fn == "set_experts_implementation" and kind != "moe":
                continue
            if hasattr(model, fn):
                try:
                    getattr(model, fn)(val)
                except Exception as e:
                    self.notes.append("%s(%r) failed: %r" % (fn, val, e))

    @staticmethod
    def _impls(model):
        c = model.config
        return {"attn": getattr(c, "_attn_implementation", None),
                "experts": getattr(c, "_experts_implementation", None)}

    @staticmethod
    def fwd(model):
        return lambda ids: model(input_ids=ids, use_cache=False).logits

    @staticmethod
    def check_params(model, tensors, rename=None):
        """Every tensor we wrote must arrive unchanged in the transformers model."""
        sd = model.state_dict()
        bad, missing = [], []
        for k, v in tensors.items():
            if k.startswith("mtp.") or k.startswith("model.visual."):
                continue
            name = rename(k) if rename else k
            if name not in sd:
                missing.append(name)
                continue
            if not torch.equal(sd[name].double().cpu(), v.double()):
                bad.append(name)
        return missing, bad

    def set_weights(self, model, hf64, rename=None):
        """Overwrite the text parameters of a loaded model with float64 tensors (by name)."""
        params = dict(model.named_parameters())
        params.update(dict(model.named_buffers()))
        missing = []
        with torch.no_grad():
            for k, v in hf64.items():
                k = rename(k) if rename else k
                if k not in params:
                    missing.append(k)
                    continue
                params[k].copy_(torch.as_tensor(v, dtype=torch.float64).reshape(params[k].shape))
        return missing

    def saved_expert_layout(self, model, tmp):
        """What save_pretrained writes for MoE experts in this transformers version."""
        try:
            model.save_pretrained(tmp)
            names = []
            for fn in os.listdir(tmp):
                if fn.endswith(".safetensors"):
                    names += [k for k in st_io.read_header(os.path.join(tmp, fn))[0] if ".experts." in k]
            return "fused" if any(n.endswith("gate_up_proj") for n in names) else \
                ("per-expert" if names else "none"), sorted(names)[:4]
        except Exception as e:  # informational only
            return "save_pretrained failed: %s" % e, []
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------- writing
def rounded(x):
    """Floats to 12 significant digits (references are float64; tests need ~1e-4)."""
    if isinstance(x, float):
        return float("%.12g" % x)
    if isinstance(x, dict):
        return {k: rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [rounded(v) for v in x]
    return x


def write_ref(path, ref):
    with open(path, "w") as f:
        json.dump(rounded(ref), f, separators=(",", ":"))
        f.write("\n")


def write_ckpt(out_dir, config, tensors, ref, metadata=None):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    st_io.save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata or {"format": "pt"})
    write_ref(os.path.join(out_dir, "reference.json"), ref)


def mlx_copy(name, cfg_json, weights, bits, group, tie, router_bits=None):
    np_w = {k: v.numpy().astype(np.float32) for k, v in weights.items()}
    t, dtypes, quant = mlx_quant.to_mlx(np_w, bits, group, moe_router_bits=router_bits,
                                        tie_word_embeddings=tie)
    files = {}
    for k, v in t.items():
        if dtypes[k] == "U32":
            files[k] = v.astype(np.uint32)
        elif dtypes[k] == "F32":
            files[k] = v.astype(np.float32)
        else:
            files[k] = torch.from_numpy(v.astype(np.float32)).to(torch.bfloat16)
    conf = json.loads(json.dumps(cfg_json))
    conf["quantization"] = quant
    conf["quantization_config"] = quant
    hf64 = mlx_quant.from_mlx(t, quant)
    return conf, files, hf64


def _info(info):
    return {k: sorted(map(str, v)) if isinstance(v, (list, set, tuple)) else str(v) for k, v in dict(info).items()}


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(path) for f in fs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="no transformers: references from qwen35_torch")
    ap.add_argument("--max-bytes", type=int, default=4 * 1000 * 1000)
    ap.add_argument("--only", default="", help="comma-separated base checkpoints (dense,moe,causal_tied)")
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))  # tiny ops: more threads only add overhead
    os.makedirs(args.out, exist_ok=True)
    hf = None
    if not args.smoke:
        hf = HF()
        log("transformers", hf.version, "torch", torch.__version__)
    manifest = {"generator": "tools/gen_golden.py", "torch": torch.__version__,
                "transformers": hf.version if hf else None,
                "reference": "smoke (qwen35_torch)" if args.smoke else
                "transformers float64 CPU, attn_implementation=sdpa, experts_implementation=eager",
                "checkpoints": {}, "warnings": []}

    def record(name, **kw):
        manifest["checkpoints"].setdefault(name, {}).update(kw)
        with open(os.path.join(args.out, "manifest.json"), "w") as f:  # progressive: survives a time-out
            json.dump(manifest, f, indent=2)

    # ---------------------------------------------------------------- dense / moe / causal
    plans = [("dense", dense_cfg(), 11), ("moe", moe_cfg(), 22), ("causal_tied", causal_cfg(), 33)]
    if args.only:
        plans = [p for p in plans if p[0] in args.only.split(",")]
    made, renames = {}, {}
    for name, cfg, seed in plans:
        try:
            kind = {"dense": "dense", "moe": "moe", "causal_tied": "causal"}[name]
            log("building", name)
            conf = hf_config(cfg, kind)
            weights = sharp_weights(cfg, seed)
            if kind == "causal":
                weights = causal_names(weights)
            visual_source = None
            if kind != "causal":
                vis = None
                if hf:
                    try:
                        vis, hf_text_names = hf.build_visual(conf, kind == "moe")
                        visual_source = "transformers %s vision tower" % ("Qwen3_5Moe" if kind == "moe" else "Qwen3_5")
                        ours = sorted(k for k in weights if not k.startswith("mtp."))
                        if ours != hf_text_names:
                            manifest["warnings"].append("%s: text tensor names differ from transformers: ours-only %s, hf-only %s" % (
                                name, sorted(set(ours) - set(hf_text_names))[:8], sorted(set(hf_text_names) - set(ours))[:8]))
                    except Exception as e:
                        manifest["warnings"].append("%s: could not build the tiny vision tower with transformers (%r); "
                                                    "fabricated model.visual.* tensors instead" % (name, e))
                if vis is None:
                    vis = fabricated_visual(cfg.hidden_size)
                    visual_source = visual_source or "fabricated (names of Qwen3_5VisionModel)"
                weights.update(vis)
            tensors = file_tensors(weights)
            ckpt_dir = os.path.join(args.out, name)
            os.makedirs(ckpt_dir, exist_ok=True)
            with open(os.path.join(ckpt_dir, "config.json"), "w") as f:
                json.dump(conf, f, indent=2)
            st_io.save_file(tensors, os.path.join(ckpt_dir, "model.safetensors"))
            # my implementation on the same (bf16-rounded) weights
            mine_w = {k: v for k, v in weights.items() if not k.startswith("model.visual.")}
            if kind == "causal":
                mine_w = {("model.language_model." + k[len("model."):]) if k.startswith("model.") else k: v
                          for k, v in mine_w.items()}
            my_model, my_fwd = mine_fwd(cfg, mine_w)
            ref_mine = reference(my_fwd, cfg.vocab_size, seed)
            ref, info = ref_mine, {"reference_source": "qwen35_torch float64 (smoke)"}
            if hf:
                model, loading, impl, rename = hf.load(ckpt_dir, kind, conf.get("text_config"), weights)
                missing, bad = hf.check_params(model, weights, rename)
                renames[name] = rename
                ref = reference(hf.fwd(model), cfg.vocab_size, seed)
                d = max_diff(ref, ref_mine)
                info = {"reference_source": "transformers %s %s float64 CPU" % (hf.version, type(model).__name__),
                        "attn_implementation": impl, "loading_info": loading,
                        "params_missing_in_hf": missing, "params_changed_in_hf": bad,
                        "qwen35_torch_max_abs_logprob_diff": d, "greedy_equal_qwen35_torch": greedy_agree(ref, ref_mine)}
                if missing or bad:
                    manifest["warnings"].append("%s: weights did not arrive in transformers unchanged: missing %s changed %s"
                                                % (name, missing[:5], bad[:5]))
                if kind == "causal" and not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight):
                    manifest["warnings"].append("causal_tied: transformers did not tie lm_head to embed_tokens")
                if d > 1e-3:
                    manifest["warnings"].append("%s: qwen35_torch differs from transformers by %.3g" % (name, d))
                if kind == "moe":
                    info["transformers_save_pretrained_expert_layout"] = hf.saved_expert_layout(
                        model, os.path.join(args.out, ".tmp_save"))
                made[name] = model
                if hf.notes:
                    info["notes"] = list(hf.notes)
                    hf.notes.clear()
            log("%s: max |logprob(ours) - logprob(ref)| = %.3g" % (name, max_diff(ref, ref_mine)))
            ref["checkpoint"] = name
            ref.update(info)
            ref["visual_source"] = visual_source
            if cfg.mtp_num_hidden_layers:
                ref["mtp"] = mtp_reference(my_model, ref["sequences"][2]["ids"])
            ref["stats"] = stats(ref)
            if cfg.is_moe:
                ref["stats"]["min_router_logit_gap"] = router_gap(my_model, ref)
            write_ref(os.path.join(ckpt_dir, "reference.json"), ref)
            record(name, bytes=dir_bytes(ckpt_dir), **{k: v for k, v in info.items() if k != "loading_info"},
                   stats=ref["stats"], visual=visual_source)
            # ------------------------------------------------------------ MLX copies
            variants = []
            if name == "dense":
                variants = [(2, 64), (3, 64), (4, 64), (8, 64), (4, 32)]
            elif name == "moe":
                variants = [(4, 32)]  # expert down_proj has 32 inputs: group 32 quantizes every matrix
        except Exception:  # one broken checkpoint must not cost the others
            import traceback
            manifest["warnings"].append("%s: FAILED\n%s" % (name, traceback.format_exc()))
            log("FAILED", name, traceback.format_exc())
            continue
        for bits, group in variants:
            try:
                mname = "%s_mlx_q%dg%d" % (name, bits, group)
                log("building", mname)
                mconf, mfiles, hf64 = mlx_copy(mname, conf, weights, bits, group, cfg.tie_word_embeddings,
                                               router_bits=8 if kind == "moe" else None)
                mdir = os.path.join(args.out, mname)
                # reference: the same architecture on the dequantized weights
                deq = {k: torch.from_numpy(np.asarray(v, dtype=np.float64)) for k, v in hf64.items()}
                mm, mfwd = mine_fwd(cfg, deq)
                mref_mine = reference(mfwd, cfg.vocab_size, seed)
                minfo = {"reference_source": "qwen35_torch float64 on dequantized weights (smoke)"}
                mref = mref_mine
                if hf:
                    model = made[name]
                    missing = hf.set_weights(model, deq, renames[name])
                    if missing:
                        manifest["warnings"].append("%s: dequantized tensors without a transformers parameter: %s" % (mname, missing[:5]))
                    mref = reference(hf.fwd(model), cfg.vocab_size, seed)
                    minfo = {"reference_source": "transformers %s float64 CPU on the dequantized weights" % hf.version,
                             "qwen35_torch_max_abs_logprob_diff": max_diff(mref, mref_mine)}
                minfo["max_abs_logprob_diff_vs_bf16_reference"] = max_diff(mref, ref)
                mref.update(minfo)
                mref["checkpoint"] = mname
                mref["quantization"] = mconf["quantization"]
                mref["stats"] = stats(mref)
                write_ckpt(mdir, mconf, mfiles, mref, metadata={"format": "mlx"})
                record(mname, bytes=dir_bytes(mdir), **minfo, stats=mref["stats"])
                log("%s: vs bf16 reference %.3g" % (mname, minfo["max_abs_logprob_diff_vs_bf16_reference"]))
            except Exception:
                import traceback
                manifest["warnings"].append("%s_mlx_q%dg%d: FAILED\n%s" % (name, bits, group, traceback.format_exc()))
                log("FAILED", name, bits, group, traceback.format_exc())
    total = sum(c["bytes"] for c in manifest["checkpoints"].values())
    manifest["total_bytes"] = total
    if total > args.max_bytes:
        manifest["warnings"].append("fixtures total %d bytes > %d" % (total, args.max_bytes))
    manifest["seconds"] = round(time.time() - T0, 1)
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    log("total fixture bytes %d; warnings: %d" % (total, len(manifest["warnings"])))
    for w in manifest["warnings"]:
        log("WARNING", w)


def router_gap(model, ref):
    """Smallest logit gap between the k-th and (k+1)-th expert over every token of the reference
    (float64, qwen35_torch): a tiny gap means a routing near-tie that float32 could flip."""
    from qwen35_torch import SparseMoe
    gaps = []

    def hook(mod, inp, out):
        x = inp[0].reshape(-1, inp[0].shape[-1])
        lg = torch.sort(torch.nn.functional.linear(x, mod.gate.weight).double(), -1, descending=True).values
        k = mod.cfg.num_experts_per_tok
        gaps.append(float((lg[:, k - 1] - lg[:, k]).min()))
    hs = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, SparseMoe)]
    with torch.no_grad():
        for sq in ref["sequences"]:
            model(torch.tensor([sq["ids"]]))
        for gr in ref["greedy"]:
            model(torch.tensor([gr["prompt"] + gr["tokens"]]))
    for h in hs:
        h.remove()
    return min(gaps)


def stats(ref):
    """How sharp the reference is: median top-1 probability and the smallest greedy margin."""
    p = [float(np.exp(x)) for s in ref["sequences"] for x in s["top1_logprob"]]
    m = [x for s in ref["sequences"] for x in s["margin"]]
    gm = [x for g in ref["greedy"] for x in g["margins"]]
    return {"median_top1_prob": float(np.median(p)), "min_margin": float(min(m)),
            "median_margin": float(np.median(m)), "min_greedy_margin": float(min(gm))}


if __name__ == "__main__":
    main()
