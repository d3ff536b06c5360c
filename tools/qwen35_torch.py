#!/usr/bin/env python3
"""A plain PyTorch implementation of the Qwen3.5 text model (dense or MoE) and its MTP head.

Written from shared/reference/MODEL-SPEC.md (sections B and C) and checked against transformers'
Qwen3_5 modeling code (tools/gen_golden.py and tools/train_demo.py compare the two on the GPU
machine). Parameter names are exactly the Hugging Face checkpoint names of
Qwen3_5ForConditionalGeneration's text part plus the mtp.* names vLLM / SGLang load:
  model.language_model.embed_tokens.weight, model.language_model.layers.{i}.*,
  model.language_model.norm.weight, lm_head.weight (absent when tied),
  mtp.fc.weight, mtp.pre_fc_norm_embedding.weight, mtp.pre_fc_norm_hidden.weight,
  mtp.layers.0.* (one full-attention decoder layer), mtp.norm.weight.

Runs on torch >= 1.13 (CPU) and torch 2.x (CUDA). Self-test: python3 tools/qwen35_torch.py
"""

import math
from dataclasses import asdict, dataclass, field
from typing import List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

LINEAR = "linear_attention"
FULL = "full_attention"


@dataclass
class TextConfig:
    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 32
    linear_value_head_dim: int = 32
    linear_conv_kernel_dim: int = 4
    layer_types: List[str] = field(default_factory=list)
    full_attention_interval: int = 4
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000000.0
    partial_rotary_factor: float = 0.25
    mrope_section: List[int] = field(default_factory=list)
    tie_word_embeddings: bool = False
    mtp_num_hidden_layers: int = 0
    # MoE (num_experts > 0 makes every layer's MLP a sparse MoE block, as in Qwen3.5-MoE)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    bos_token_id: Optional[int] = None
    eos_token_id: Optional[int] = None
    pad_token_id: Optional[int] = None

    def __post_init__(self):
        if not self.layer_types:
            self.layer_types = [FULL if (i + 1) % self.full_attention_interval == 0 else LINEAR
                                for i in range(self.num_hidden_layers)]
        assert len(self.layer_types) == self.num_hidden_layers
        assert all(t in (LINEAR, FULL) for t in self.layer_types)
        assert self.linear_num_value_heads % self.linear_num_key_heads == 0
        assert self.num_attention_heads % self.num_key_value_heads == 0
        rd = self.rotary_dim
        if not self.mrope_section:
            # any split of rd/2 frequencies; text tokens use equal t/h/w positions, so the
            # split does not change the result (MODEL-SPEC B)
            half = rd // 2
            a = (half + 1) // 2
            b = (half - a + 1) // 2
            self.mrope_section = [a, b, half - a - b]

    @property
    def rotary_dim(self):
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def is_moe(self):
        return self.num_experts > 0

    def hf_text_config(self, model_type):
        """The text_config dict in transformers 5 form (model_type qwen3_5_text or
        qwen3_5_moe_text)."""
        d = {
            "model_type": model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": 32768,
            "initializer_range": 0.02,
            "rms_norm_eps": self.rms_norm_eps,
            "use_cache": True,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
            "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim,
            "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads,
            "layer_types": list(self.layer_types),
            "full_attention_interval": self.full_attention_interval,
            "mtp_num_hidden_layers": self.mtp_num_hidden_layers,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
                "mrope_section": list(self.mrope_section),
                "mrope_interleaved": True,
            },
        }
        if self.is_moe:
            d.update(num_experts=self.num_experts, num_experts_per_tok=self.num_experts_per_tok,
                     moe_intermediate_size=self.moe_intermediate_size,
                     shared_expert_intermediate_size=self.shared_expert_intermediate_size,
                     router_aux_loss_coef=0.001, output_router_logits=False)
        else:
            d["intermediate_size"] = self.intermediate_size
        for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        return d

    @classmethod
    def from_hf(cls, cfg):
        """From a config.json dict (nested text_config or flat)."""
        t = dict(cfg.get("text_config", cfg))
        rope = t.get("rope_parameters") or {}
        kw = {}
        for f in cls.__dataclass_fields__:
            if f in t:
                kw[f] = t[f]
        kw["rope_theta"] = rope.get("rope_theta", t.get("rope_theta", 10000000.0))
        kw["partial_rotary_factor"] = rope.get("partial_rotary_factor",
                                               t.get("partial_rotary_factor", 0.25))
        kw["mrope_section"] = list(rope.get("mrope_section", []))
        kw["layer_types"] = list(t.get("layer_types") or [])
        kw["tie_word_embeddings"] = bool(t.get("tie_word_embeddings",
                                               cfg.get("tie_word_embeddings", False)))
        if "intermediate_size" not in t:
            kw["intermediate_size"] = 0
        return cls(**kw)

    def to_dict(self):
        return asdict(self)


def _up(x):
    """Compute dtype for norms and gates: float64 stays float64, everything else float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


class ZeroCenteredRMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * (1 + w), computed in float32 (float64 for float64 input),
    cast back to the input dtype. HF initialises w to 0."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x):
        dt = _up(x)
        xf = x.to(dt)
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.to(dt))).to(x.dtype)


class GatedRMSNorm(nn.Module):
    """y = w * rmsnorm(o) * silu(z) over the last dim (one value head); plain weight, init 1."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, o, z):
        dt = _up(o)
        of = o.to(dt)
        y = of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + self.eps)
        y = self.weight.to(dt) * y * F.silu(z.to(dt))
        return y.to(o.dtype)


def rope_cos_sin(cfg, positions, dtype):
    """cos/sin [T, rd] for NeoX rotation of the first rd dims. As transformers does, the inverse
    frequencies and angles are computed in float32 and then cast."""
    rd = cfg.rotary_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, rd, 2, dtype=torch.int64).float() / rd))
    ang = positions.float()[:, None] * inv.to(positions.device)[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x, cos, sin):
    """x [B, H, T, D]; rotates x[..., :rd] (NeoX halves), leaves the rest."""
    rd = cos.shape[-1]
    xr, xp = x[..., :rd], x[..., rd:]
    x1, x2 = xr[..., : rd // 2], xr[..., rd // 2:]
    rot = torch.cat([-x2, x1], dim=-1)
    return torch.cat([xr * cos + rot * sin, xp], dim=-1)


def causal_attention(q, k, v):
    """q [B,H,T,D], k/v [B,H,T,D] (already GQA-expanded); causal softmax(q k^T / sqrt(D)) v."""
    if hasattr(F, "scaled_dot_product_attention") and q.dtype != torch.float64:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)  # scale 1/sqrt(D)
    t = q.shape[-2]
    s = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    s = s.masked_fill(mask, float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v)


class Attention(nn.Module):
    """Gated full attention: q_proj -> per head [query D | gate D], q/k zero-centred norms,
    partial NeoX RoPE, GQA causal attention, output * sigmoid(gate), o_proj."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        h, hkv, d, hid = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        self.q_proj = nn.Linear(hid, h * d * 2, bias=False)
        self.k_proj = nn.Linear(hid, hkv * d, bias=False)
        self.v_proj = nn.Linear(hid, hkv * d, bias=False)
        self.o_proj = nn.Linear(h * d, hid, bias=False)
        self.q_norm = ZeroCenteredRMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(d, cfg.rms_norm_eps)

    def forward(self, x, cos, sin):
        cfg = self.cfg
        b, t, _ = x.shape
        h, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        qg = self.q_proj(x).view(b, t, h, 2 * d)
        q, gate = qg[..., :d], qg[..., d:]
        gate = gate.reshape(b, t, h * d)
        q = self.q_norm(q).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, hkv, d)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, hkv, d).transpose(1, 2)
        # RoPE tables are float32; keep q, k in v's dtype (bf16 under autocast) for SDPA
        q, k = apply_rope(q, cos, sin).to(v.dtype), apply_rope(k, cos, sin).to(v.dtype)
        if hkv != h:  # query head j uses KV head j // (h / hkv)
            k = k.repeat_interleave(h // hkv, dim=1)
            v = v.repeat_interleave(h // hkv, dim=1)
        o = causal_attention(q, k, v)
        o = o.transpose(1, 2).reshape(b, t, h * d)
        return self.o_proj(o * torch.sigmoid(gate))


# ----------------------------------------------------------------------------- gated delta rule
def gdn_recurrent(q, k, v, g, beta, state=None):
    """Reference recurrence. q,k [B,T,H,Dk] (normalised, q already scaled), v [B,T,H,Dv],
    g (log decay) and beta [B,T,H]; state [B,H,Dk,Dv]. Returns o [B,T,H,Dv], final state.
    S = e^g S; delta = beta (v - S^T k); S = S + k delta^T; o = S^T q."""
    b, t, h, dk = k.shape
    dv = v.shape[-1]
    s = q.new_zeros(b, h, dk, dv) if state is None else state.clone()
    out = []
    for i in range(t):
        s = s * g[:, i].exp()[..., None, None]
        kv = torch.einsum("bhkv,bhk->bhv", s, k[:, i])
        delta = beta[:, i][..., None] * (v[:, i] - kv)
        s = s + k[:, i][..., :, None] * delta[..., None, :]
        out.append(torch.einsum("bhkv,bhk->bhv", s, q[:, i]))
    return torch.stack(out, dim=1), s


def gdn_chunked(q, k, v, g, beta, chunk=64, state=None):
    """Chunked parallel form of gdn_recurrent (same arguments, same results). Within a chunk
    with G = cumsum(g): A = strictly_lower((beta_r k_r . k_s) e^{G_r - G_s}); U = (I+A)^-1 beta V;
    W = (I+A)^-1 (beta e^G K); per chunk in order: V' = U - W S; O = (e^G Q) S +
    tril_incl((Q K^T) e^{G_r - G_s}) V'; S = e^{G_C} S + (e^{G_C - G} K)^T V'."""
    b, t, h, dk = k.shape
    dv = v.shape[-1]
    pad = (chunk - t % chunk) % chunk
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, 0, 0, pad)) for x in (g, beta))
    n = (t + pad) // chunk
    # [B, H, N, C, D]
    q, k, v = (x.transpose(1, 2).reshape(b, h, n, chunk, x.shape[-1]) for x in (q, k, v))
    g, beta = (x.transpose(1, 2).reshape(b, h, n, chunk) for x in (g, beta))
    gc = g.cumsum(-1)
    diff = gc[..., :, None] - gc[..., None, :]  # G_r - G_s
    lower_incl = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = torch.where(lower_incl, diff, torch.full_like(diff, float("-inf"))).exp()
    kk = torch.matmul(k, k.transpose(-1, -2))
    a = (beta[..., :, None] * kk * decay).tril(-1)
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    m = eye + a
    u = torch.linalg.solve_triangular(m, beta[..., None] * v, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(m, (beta * gc.exp())[..., None] * k, upper=False,
                                      unitriangular=True)
    qk = torch.matmul(q, k.transpose(-1, -2)) * decay
    qd = q * gc.exp()[..., None]
    kd = k * (gc[..., -1:] - gc).exp()[..., None]
    cd = gc[..., -1].exp()[..., None, None]
    s = q.new_zeros(b, h, dk, dv) if state is None else state
    outs = []
    for i in range(n):
        vp = u[:, :, i] - torch.matmul(w[:, :, i], s)
        outs.append(torch.matmul(qd[:, :, i], s) + torch.matmul(qk[:, :, i], vp))
        s = s * cd[:, :, i] + torch.matmul(kd[:, :, i].transpose(-1, -2), vp)
    o = torch.stack(outs, dim=2).reshape(b, h, n * chunk, dv)[:, :, :t]
    return o.transpose(1, 2), s


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        hid = cfg.hidden_size
        self.key_dim = cfg.linear_num_key_heads * cfg.linear_key_head_dim
        self.value_dim = cfg.linear_num_value_heads * cfg.linear_value_head_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.in_proj_qkv = nn.Linear(hid, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(hid, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(hid, cfg.linear_num_value_heads, bias=False)
        self.in_proj_a = nn.Linear(hid, cfg.linear_num_value_heads, bias=False)
        # weight [C, 1, K], depthwise, no bias (the checkpoint layout)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, cfg.linear_conv_kernel_dim,
                                groups=self.conv_dim, bias=False,
                                padding=cfg.linear_conv_kernel_dim - 1)
        self.dt_bias = nn.Parameter(torch.ones(cfg.linear_num_value_heads))
        self.A_log = nn.Parameter(torch.empty(cfg.linear_num_value_heads).uniform_(0.01, 16).log())
        self.norm = GatedRMSNorm(cfg.linear_value_head_dim, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, hid, bias=False)
        self.recurrent = False  # True: use the per-token recurrence (reference)

    def forward(self, x):
        cfg = self.cfg
        b, t, _ = x.shape
        hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        qkv = self.in_proj_qkv(x).transpose(1, 2)
        qkv = F.silu(F.conv1d(qkv, self.conv1d.weight.to(qkv.dtype), None,
                              padding=cfg.linear_conv_kernel_dim - 1, groups=self.conv_dim)[..., :t])
        qkv = qkv.transpose(1, 2)
        q, k, v = torch.split(qkv, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        z = self.in_proj_z(x).view(b, t, hv, dv)
        beta = torch.sigmoid(self.in_proj_b(x))
        dt = _up(x)
        g = -self.A_log.to(dt).exp() * F.softplus(self.in_proj_a(x).to(dt) + self.dt_bias.to(dt))
        # the recurrence runs in float32 (float64 when the model is float64), outside autocast
        with _no_autocast(x):
            q = q.reshape(b, t, hk, dk).to(dt)
            k = k.reshape(b, t, hk, dk).to(dt)
            v = v.reshape(b, t, hv, dv).to(dt)
            q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * dk ** -0.5
            k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
            if hv != hk:  # value head j uses key head j // (hv / hk)
                q = q.repeat_interleave(hv // hk, dim=2)
                k = k.repeat_interleave(hv // hk, dim=2)
            fn = gdn_recurrent if self.recurrent else gdn_chunked
            o, _ = fn(q, k, v, g.to(dt), beta.to(dt))
        o = self.norm(o.to(x.dtype if x.dtype == torch.float64 else dt), z)
        return self.out_proj(o.reshape(b, t, hv * dv).to(x.dtype))


class _no_autocast:
    def __init__(self, x):
        self.ctx = None
        if x.is_cuda and hasattr(torch, "autocast"):
            self.ctx = torch.autocast(device_type="cuda", enabled=False)

    def __enter__(self):
        if self.ctx is not None:
            self.ctx.__enter__()

    def __exit__(self, *a):
        if self.ctx is not None:
            self.ctx.__exit__(*a)


class MLP(nn.Module):
    def __init__(self, hid, inter):
        super().__init__()
        self.gate_proj = nn.Linear(hid, inter, bias=False)
        self.up_proj = nn.Linear(hid, inter, bias=False)
        self.down_proj = nn.Linear(inter, hid, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    def __init__(self, e, hid):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(e, hid))


class Experts(nn.Module):
    """Fused expert weights as transformers keeps them: gate_up_proj [E, 2I, H] (gate rows
    first), down_proj [E, H, I]."""

    def __init__(self, e, hid, inter):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * inter, hid))
        self.down_proj = nn.Parameter(torch.empty(e, hid, inter))


class SparseMoe(nn.Module):
    """softmax router (float32, float64 for float64 models) -> top-k, renormalised; experts;
    plus sigmoid(shared_expert_gate x) * shared_expert(x)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.gate = Router(cfg.num_experts, cfg.hidden_size)
        self.experts = Experts(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size)
        self.shared_expert = MLP(cfg.hidden_size, cfg.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def forward(self, x):
        cfg = self.cfg
        shp = x.shape
        xf = x.reshape(-1, shp[-1])
        logits = F.linear(xf, self.gate.weight)
        p = torch.softmax(logits.to(_up(x)), dim=-1)
        top_p, top_i = torch.topk(p, cfg.num_experts_per_tok, dim=-1)
        top_p = (top_p / top_p.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(xf)
        inter = cfg.moe_intermediate_size
        for e in range(cfg.num_experts):
            rows, slot = torch.where(top_i == e)
            if rows.numel() == 0:
                continue
            gu = F.linear(xf[rows], self.experts.gate_up_proj[e])
            hcur = F.silu(gu[:, :inter]) * gu[:, inter:]
            y = F.linear(hcur, self.experts.down_proj[e]) * top_p[rows, slot][:, None]
            out.index_add_(0, rows, y.to(out.dtype))
        out = out + torch.sigmoid(self.shared_expert_gate(xf)) * self.shared_expert(xf)
        return out.reshape(shp)


class DecoderLayer(nn.Module):
    def __init__(self, cfg, layer_type):
        super().__init__()
        self.layer_type = layer_type
        if layer_type == LINEAR:
            self.linear_attn = GatedDeltaNet(cfg)
        else:
            self.self_attn = Attention(cfg)
        self.mlp = SparseMoe(cfg) if cfg.is_moe else MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = ZeroCenteredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin):
        hn = self.input_layernorm(x)
        if self.layer_type == LINEAR:
            x = x + self.linear_attn(hn)
        else:
            x = x + self.self_attn(hn, cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class TextModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, lt) for lt in cfg.layer_types])
        self.norm = ZeroCenteredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class _Holder(nn.Module):
    """model.language_model.* (the conditional-generation layout)."""

    def __init__(self, cfg):
        super().__init__()
        self.language_model = TextModel(cfg)


class MTP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        hid = cfg.hidden_size
        self.fc = nn.Linear(2 * hid, hid, bias=False)
        self.pre_fc_norm_embedding = ZeroCenteredRMSNorm(hid, cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = ZeroCenteredRMSNorm(hid, cfg.rms_norm_eps)
        self.layers = nn.ModuleList([DecoderLayer(cfg, FULL) for _ in range(cfg.mtp_num_hidden_layers)])
        self.norm = ZeroCenteredRMSNorm(hid, cfg.rms_norm_eps)


class Qwen35(nn.Module):
    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.cfg = cfg
        self.model = _Holder(cfg)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.mtp_num_hidden_layers > 0:
            self.mtp = MTP(cfg)

    @property
    def lm(self):
        return self.model.language_model

    def head_weight(self):
        return self.lm.embed_tokens.weight if self.cfg.tie_word_embeddings else self.lm_head.weight

    def logits(self, h):
        return F.linear(h, self.head_weight())

    def hidden(self, ids):
        """ids [B, T] -> final-normed hidden [B, T, H] (the tensor fed to lm_head)."""
        x = self.lm.embed_tokens(ids)
        pos = torch.arange(ids.shape[1], device=ids.device)
        cos, sin = rope_cos_sin(self.cfg, pos, x.dtype)
        for layer in self.lm.layers:
            x = layer(x, cos, sin)
        return self.lm.norm(x)

    def forward(self, ids):
        return self.logits(self.hidden(ids))

    def mtp_hidden(self, h, next_ids, step=0, start_pos=0):
        """One MTP step over a whole sequence: h [B, T, H] final-normed target hidden at
        positions p, next_ids [B, T] the tokens x_{p+1}; returns the post-mtp.norm hidden whose
        logits predict x_{p+2}. Positions start at start_pos (RoPE position p)."""
        mtp = self.mtp
        e = mtp.pre_fc_norm_embedding(self.lm.embed_tokens(next_ids))
        hh = mtp.pre_fc_norm_hidden(h)
        u = mtp.fc(torch.cat([e, hh], dim=-1))
        pos = torch.arange(start_pos, start_pos + h.shape[1], device=h.device)
        cos, sin = rope_cos_sin(self.cfg, pos, u.dtype)
        u = mtp.layers[step % len(mtp.layers)](u, cos, sin)
        return mtp.norm(u)

    def set_recurrent(self, on):
        for m in self.modules():
            if isinstance(m, GatedDeltaNet):
                m.recurrent = on


# ----------------------------------------------------------------------------- init and names
def init_hf_like(model, std=0.02, generator=None):
    """Initialisation as transformers does it: Linear/Embedding/experts/router normal(0, std),
    zero-centred norms 0, gated norms 1, dt_bias 1, A_log = log(uniform(0.01, 16))."""
    for name, p in model.named_parameters():
        with torch.no_grad():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.01, 16, generator=generator).log())
            elif name.endswith("dt_bias") or name.endswith("linear_attn.norm.weight"):
                p.fill_(1.0)
            elif p.dim() == 1:  # zero-centred norms
                p.zero_()
            else:
                p.copy_(torch.empty(p.shape).normal_(0.0, std, generator=generator))


def causal_names(sd):
    """model.language_model.* -> model.* (the Qwen3_5ForCausalLM layout); mtp.* and lm_head
    keep their names."""
    return {("model." + k[len("model.language_model."):]) if k.startswith("model.language_model.")
            else k: v for k, v in sd.items()}


def param_bytes(model, dtype_bytes=2):
    return sum(p.numel() for p in model.parameters()) * dtype_bytes


# ----------------------------------------------------------------------------- self-test
def _selftest():
    torch.manual_seed(0)
    # 1. chunked == recurrent in float64, with and without padding, with an initial state
    for t in (1, 5, 64, 100, 130):
        b, h, dk, dv = 2, 3, 8, 6
        q = F.normalize(torch.randn(b, t, h, dk, dtype=torch.float64), dim=-1) * dk ** -0.5
        k = F.normalize(torch.randn(b, t, h, dk, dtype=torch.float64), dim=-1)
        v = torch.randn(b, t, h, dv, dtype=torch.float64)
        g = -torch.rand(b, t, h, dtype=torch.float64) * 2
        beta = torch.rand(b, t, h, dtype=torch.float64)
        s0 = torch.randn(b, h, dk, dv, dtype=torch.float64)
        o1, s1 = gdn_recurrent(q, k, v, g, beta, s0)
        o2, s2 = gdn_chunked(q, k, v, g, beta, chunk=64, state=s0)
        o3, s3 = gdn_chunked(q, k, v, g, beta, chunk=16, state=s0)
        err = max((o1 - o2).abs().max().item(), (s1 - s2).abs().max().item(),
                  (o1 - o3).abs().max().item(), (s1 - s3).abs().max().item())
        assert err < 1e-10, ("chunked != recurrent", t, err)
        print("gdn chunked == recurrent, T=%d: max abs diff %.2e" % (t, err))
    # 2. split-sequence continuation equals the whole (state carries across calls)
    t = 90
    q = F.normalize(torch.randn(1, t, 2, 8, dtype=torch.float64), dim=-1)
    k = F.normalize(torch.randn(1, t, 2, 8, dtype=torch.float64), dim=-1)
    v = torch.randn(1, t, 2, 4, dtype=torch.float64)
    g = -torch.rand(1, t, 2, dtype=torch.float64)
    beta = torch.rand(1, t, 2, dtype=torch.float64)
    o_all, s_all = gdn_chunked(q, k, v, g, beta)
    oa, sa = gdn_chunked(q[:, :37], k[:, :37], v[:, :37], g[:, :37], beta[:, :37])
    ob, sb = gdn_chunked(q[:, 37:], k[:, 37:], v[:, 37:], g[:, 37:], beta[:, 37:], state=sa)
    err = max((torch.cat([oa, ob], 1) - o_all).abs().max().item(), (sb - s_all).abs().max().item())
    assert err < 1e-12, err
    print("gdn split continuation: %.2e" % err)
    # 3. tiny dense and MoE models: forward, chunked == recurrent model output, MTP step
    for moe in (False, True):
        cfg = TextConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=8,
                         linear_value_head_dim=8, layer_types=[LINEAR, FULL, LINEAR, FULL],
                         mtp_num_hidden_layers=1, tie_word_embeddings=moe,
                         num_experts=4 if moe else 0, num_experts_per_tok=2,
                         moe_intermediate_size=16, shared_expert_intermediate_size=16)
        m = Qwen35(cfg).double()
        init_hf_like(m, std=0.3)
        ids = torch.randint(0, 96, (2, 70))
        lp1 = torch.log_softmax(m(ids), -1)
        m.set_recurrent(True)
        lp2 = torch.log_softmax(m(ids), -1)
        m.set_recurrent(False)
        err = (lp1 - lp2).abs().max().item()
        assert err < 1e-10, err
        # causality: the prefix's logprobs do not depend on later tokens
        lp3 = torch.log_softmax(m(ids[:, :33]), -1)
        err2 = (lp3 - lp1[:, :33]).abs().max().item()
        assert err2 < 1e-10, err2
        h = m.hidden(ids)
        mh = m.mtp_hidden(h[:, :-1], ids[:, 1:])
        assert mh.shape == (2, 69, 32)
        names = list(m.state_dict().keys())
        assert "model.language_model.embed_tokens.weight" in names
        assert ("lm_head.weight" in names) == (not cfg.tie_word_embeddings)
        assert "mtp.fc.weight" in names and "mtp.layers.0.self_attn.q_proj.weight" in names
        assert "model.language_model.layers.0.linear_attn.conv1d.weight" in names
        print("model (moe=%s): chunked vs recurrent %.2e, causal prefix %.2e, %d tensors"
              % (moe, err, err2, len(names)))
    print("qwen35_torch self-test OK")


if __name__ == "__main__":
    _selftest()
