#!/usr/bin/env python3
"""MLX "affine" quantization and the mlx-lm Qwen3.5 sanitize rules, in numpy (MODEL-SPEC A).

quantize(w, bits, group) -> (wq uint32 [..., in*bits/32], scales, biases) as MLX stores them;
dequantize() inverts it. to_mlx(hf_tensors, text_cfg, bits, group, overrides) turns a Hugging
Face Qwen3.5 / Qwen3.5-MoE state dict into an MLX checkpoint dict:
  * drops model.visual.* / vision_tower.* and mtp.*; renames model.language_model.* (or model.*)
    to language_model.model.*, lm_head.* to language_model.lm_head.*;
  * adds 1.0 to the 1-D input_layernorm, post_attention_layernorm, model.norm, q_norm, k_norm
    weights (in bf16, as mlx-lm does); the gated linear_attn.norm.weight is not shifted;
  * conv1d.weight [C, 1, K] -> [C, K, 1];
  * fused experts.gate_up_proj [E, 2I, H] -> switch_mlp.gate_proj [E, I, H] + up_proj, and
    experts.down_proj -> switch_mlp.down_proj (per-expert experts.{e}.* are stacked);
  * quantizes every Linear / Embedding / switch_mlp weight whose input dim divides the group
    (embed_tokens and lm_head included); norms, conv1d, A_log (F32), dt_bias stay in float.
from_mlx() inverts all of this into HF names with dequantized float64 weights (the reference
transformers is run on).
Self-test: python3 tools/mlx_quant.py
"""

import re

import numpy as np

NORM_SUFFIXES = (".input_layernorm.weight", ".post_attention_layernorm.weight",
                 "model.norm.weight", ".q_norm.weight", ".k_norm.weight")


def bf16_round(a):
    """Round-to-nearest-even to bfloat16, returned as float32 values."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def pack_bits(q, bits):
    """q uint [..., n] with values < 2^bits -> uint32 [..., n*bits/32]: each row is one
    little-endian bit stream, element j at bits [j*bits, (j+1)*bits)."""
    n = q.shape[-1]
    assert (n * bits) % 32 == 0, (n, bits)
    words = np.zeros(q.shape[:-1] + (n * bits // 32,), dtype=np.uint64)
    q = q.astype(np.uint64)
    for j in range(n):
        off = j * bits
        w, sh = off >> 5, off & 31
        words[..., w] |= (q[..., j] << np.uint64(sh)) & np.uint64(0xFFFFFFFF)
        if sh + bits > 32:
            words[..., w + 1] |= q[..., j] >> np.uint64(32 - sh)
    return words.astype(np.uint32)


def unpack_bits(words, bits, n):
    w = words.astype(np.uint64)
    out = np.zeros(words.shape[:-1] + (n,), dtype=np.uint32)
    mask = np.uint64((1 << bits) - 1)
    nw = words.shape[-1]
    for j in range(n):
        off = j * bits
        i, sh = off >> 5, off & 31
        lo = w[..., i]
        hi = w[..., i + 1] if i + 1 < nw else np.zeros_like(lo)
        out[..., j] = (((hi << np.uint64(32)) | lo) >> np.uint64(sh)) & mask
    return out


def quantize(w, bits, group):
    """MLX affine quantization of float weights w [..., n] (n % group == 0). Scales and biases
    are rounded to bf16 (the checkpoint dtype) BEFORE the codes are chosen, as MLX computes them
    in the weight dtype. Returns (wq uint32, scales f32 (bf16 values), biases f32 (bf16 values))."""
    w = np.asarray(w, dtype=np.float32)
    shp = w.shape
    assert shp[-1] % group == 0, (shp, group)
    g = w.reshape(shp[:-1] + (shp[-1] // group, group)).astype(np.float32)
    n_bins = float((1 << bits) - 1)
    wmax = g.max(-1)
    wmin = g.min(-1)
    s = np.maximum((wmax - wmin) / n_bins, 1e-7)
    neg = np.abs(wmin) > np.abs(wmax)
    s = np.where(neg, s, -s)
    edge = np.where(neg, wmin, wmax)
    q0 = np.rint(edge / s)
    nz = q0 != 0
    s = np.where(nz, edge / np.where(nz, q0, 1.0), s)
    bias = np.where(nz, edge, 0.0)
    s = bf16_round(s)
    bias = bf16_round(bias)
    q = np.clip(np.rint((g - bias[..., None]) / s[..., None]), 0, n_bins).astype(np.uint32)
    wq = pack_bits(q.reshape(shp), bits)
    return wq, s.astype(np.float32), bias.astype(np.float32)


def dequantize(wq, scales, biases, bits, group):
    n = wq.shape[-1] * 32 // bits
    q = unpack_bits(wq, bits, n).astype(np.float64)
    q = q.reshape(q.shape[:-1] + (n // group, group))
    w = scales.astype(np.float64)[..., None] * q + biases.astype(np.float64)[..., None]
    return w.reshape(w.shape[:-2] + (n,))


# ----------------------------------------------------------------------------- names
def _strip_prefix(name):
    """HF name -> text-relative name ('layers.0....', 'embed_tokens.weight', 'norm.weight',
    'lm_head.weight'), or None for tensors MLX drops."""
    if name.startswith(("model.visual", "vision_tower", "visual.", "mtp.")):
        return None
    for p in ("model.language_model.", "language_model.model.", "model."):
        if name.startswith(p):
            return name[len(p):]
    if name.startswith("lm_head."):
        return name
    return name


def _quantizable(rel, arr, group):
    if arr.ndim < 2 or arr.shape[-1] % group != 0:
        return False
    if rel.endswith(("conv1d.weight",)):
        return False
    return rel.endswith(("_proj.weight", "embed_tokens.weight", "lm_head.weight", "mlp.gate.weight",
                         "shared_expert_gate.weight", "fc.weight")) or ".switch_mlp." in rel


def to_mlx(hf, bits, group, moe_router_bits=8, tie_word_embeddings=False):
    """hf: dict HF name -> numpy float array (F32 A_log stays F32; others are bf16 values).
    Returns (tensors dict MLX name -> numpy (uint32 codes, float32 'bf16' values or F32 A_log),
    dtypes dict name -> 'BF16'|'F32'|'U32', quantization dict for config.json)."""
    rel = {}
    for k, v in hf.items():
        r = _strip_prefix(k)
        if r is None:
            continue
        if tie_word_embeddings and r == "lm_head.weight":
            continue
        rel[r] = np.asarray(v)
    # experts -> switch_mlp
    layers = sorted({int(m.group(1)) for k in rel for m in [re.match(r"layers\.(\d+)\.", k)] if m})
    for i in layers:
        p = "layers.%d.mlp." % i
        if p + "experts.gate_up_proj" in rel:
            gu = rel.pop(p + "experts.gate_up_proj")
            inter = gu.shape[1] // 2
            rel[p + "switch_mlp.gate_proj.weight"] = gu[:, :inter, :]
            rel[p + "switch_mlp.up_proj.weight"] = gu[:, inter:, :]
            rel[p + "switch_mlp.down_proj.weight"] = rel.pop(p + "experts.down_proj")
        elif p + "experts.0.gate_proj.weight" in rel:
            for proj in ("gate_proj", "up_proj", "down_proj"):
                es = []
                e = 0
                while "%sexperts.%d.%s.weight" % (p, e, proj) in rel:
                    es.append(rel.pop("%sexperts.%d.%s.weight" % (p, e, proj)))
                    e += 1
                rel[p + "switch_mlp.%s.weight" % proj] = np.stack(es)
    out, dtypes = {}, {}
    quant = {"group_size": group, "bits": bits, "mode": "affine"}
    for r in sorted(rel, key=_order_key):
        v = rel[r]
        name = ("language_model." + r) if r.startswith("lm_head") else ("language_model.model." + r)
        if r.endswith("conv1d.weight") and v.ndim == 3 and v.shape[-1] != 1:
            v = np.ascontiguousarray(np.moveaxis(v, 2, 1))  # [C,1,K] -> [C,K,1]
        if v.ndim == 1 and any(name.endswith(s) for s in NORM_SUFFIXES):
            v = bf16_round(bf16_round(v) + np.float32(1.0))
        if r.endswith("A_log"):
            out[name] = v.astype(np.float32)
            dtypes[name] = "F32"
            continue
        b, gs = bits, group
        base = name[: -len(".weight")] if name.endswith(".weight") else name
        if r.endswith(("mlp.gate.weight", "shared_expert_gate.weight")) and moe_router_bits:
            b, gs = moe_router_bits, 64
            quant[base] = {"group_size": gs, "bits": b}
        if _quantizable(r, v, gs):
            wq, s, bi = quantize(bf16_round(v), b, gs)
            out[base + ".weight"], dtypes[base + ".weight"] = wq, "U32"
            out[base + ".scales"], dtypes[base + ".scales"] = s, "BF16"
            out[base + ".biases"], dtypes[base + ".biases"] = bi, "BF16"
        else:
            quant.pop(base, None)
            out[name] = bf16_round(v)
            dtypes[name] = "BF16"
    return out, dtypes, quant


def _order_key(r):
    m = re.match(r"layers\.(\d+)\.(.*)", r)
    return (1, int(m.group(1)), m.group(2)) if m else (0 if "embed" in r else 2, 0, r)


def from_mlx(mlx, quant, hf_prefix="model.language_model.", moe_fused=True):
    """Inverse of to_mlx: MLX tensors -> HF names with float64 weights (dequantized, norms minus
    1, conv back to [C,1,K], switch_mlp back to fused experts)."""
    top_bits, top_group = quant["bits"], quant["group_size"]
    out = {}
    for name in list(mlx):
        if name.endswith((".scales", ".biases")):
            continue
        v = mlx[name]
        base = name[: -len(".weight")] if name.endswith(".weight") else name
        if base + ".scales" in mlx:
            spec = quant.get(base, {"bits": top_bits, "group_size": top_group})
            v = dequantize(v, mlx[base + ".scales"], mlx[base + ".biases"], spec["bits"], spec["group_size"])
        else:
            v = np.asarray(v, dtype=np.float64)
        if name.startswith("language_model.model."):
            r = name[len("language_model.model."):]
        else:
            r = name[len("language_model."):]
        if r.endswith("conv1d.weight") and v.ndim == 3:
            v = np.ascontiguousarray(np.moveaxis(v, 1, 2))
        if v.ndim == 1 and any(name.endswith(s) for s in NORM_SUFFIXES):
            v = v - 1.0
        out[r] = v
    hf = {}
    for r, v in out.items():
        m = re.match(r"(layers\.\d+\.mlp\.)switch_mlp\.(gate_proj|up_proj|down_proj)\.weight", r)
        if m:
            p = m.group(1)
            if m.group(2) == "gate_proj":
                gu = np.concatenate([v, out[p + "switch_mlp.up_proj.weight"]], axis=1)
                hf[hf_prefix + p + "experts.gate_up_proj"] = gu
            elif m.group(2) == "down_proj":
                hf[hf_prefix + p + "experts.down_proj"] = v
            continue
        hf[(r if r.startswith("lm_head") else hf_prefix + r)] = v
    return hf


def _selftest():
    rng = np.random.default_rng(0)
    # bit packing round trip, including 3/5/6-bit values straddling words
    for bits in (2, 3, 4, 5, 6, 8):
        q = rng.integers(0, 1 << bits, size=(3, 64)).astype(np.uint32)
        wq = pack_bits(q, bits)
        assert wq.shape == (3, 64 * bits // 32)
        assert np.array_equal(unpack_bits(wq, bits, 64), q)
    # documented layout: 3-bit element 10 uses bits 30-31 of word 0 and bit 0 of word 1
    q = np.zeros((1, 32), dtype=np.uint32)
    q[0, 10] = 0b101
    wq = pack_bits(q, 3)
    assert wq[0, 0] == (0b01 << 30) and wq[0, 1] == 0b1, (hex(wq[0, 0]), hex(wq[0, 1]))
    # 4-bit: element k of a word at bits 4k
    q = np.arange(8, dtype=np.uint32)[None, :].repeat(1, 0)
    q = np.concatenate([q, q, q, q], axis=1)
    assert pack_bits(q, 4)[0, 0] == 0x76543210
    # quantization error within about one step (the edge-anchored scale can clip the far end);
    # negative scales occur
    w = rng.normal(size=(16, 128)).astype(np.float32)
    saw_negative = False
    for bits in (2, 3, 4, 5, 6, 8):
        for group in (32, 64, 128):
            wq, s, b = quantize(w, bits, group)
            saw_negative |= bool((s < 0).any())
            d = dequantize(wq, s, b, bits, group)
            step = np.abs(s).repeat(group, axis=-1).reshape(w.shape)
            err = np.abs(d - bf16_round(w))
            # bf16 scales/biases add up to ~2^-9 relative error per term: only 8 bits notices
            bound = step * (1.05 if bits <= 6 else 2.0) + 1e-6
            assert (err <= bound).all(), (bits, group, float((err / step).max()))
            rel = float(np.sqrt((err ** 2).mean() / (w ** 2).mean()))
            assert rel < {2: 0.6, 3: 0.3, 4: 0.15, 5: 0.08, 6: 0.04, 8: 0.02}[bits], (bits, rel)
    assert saw_negative
    print("mlx_quant self-test OK")


if __name__ == "__main__":
    _selftest()
