"""Decoder-only transformer language models, from a 1M-parameter toy to Llama-2 70B.

One compact module covers the two families the simulator needs:

- ``style="gpt"``: GPT-2/GPT-3 (Radford et al. 2019; Brown et al. 2020): learned
  positions, pre-norm LayerNorm with biases, fused QKV projection, GELU MLP of width
  4*d_model, LM head tied to the token embedding.
- ``style="llama"``: LLaMA (Touvron et al. 2023, "LLaMA: Open and Efficient Foundation
  Language Models"; Llama 2, Touvron et al. 2023b): RMSNorm (fused-kernel style, see
  RMSNorm below), rotary position embedding
  (Su et al. 2021, RoFormer), SwiGLU MLP (Shazeer 2020), no biases, untied LM head,
  optional grouped-query attention (Ainslie et al. 2023) with ``n_kv_head < n_head``.

Build a preset with ``build_model(name, device="meta")``: on the meta device even the 70B
model costs no memory, and ``oresearcher.models.workloads`` measures its FLOPs and saved
activations with torch. ``model(tokens[B, T]) -> logits[B, T, V]``;
``lm_loss(logits, targets)`` is the next-token cross-entropy.

Attention: on real devices the model calls ``F.scaled_dot_product_attention(...,
is_causal=True)``. On the meta device that call falls back to the math kernel, which
saves the [B, H, T, T] softmax probabilities for backward; GPUs run FlashAttention (Dao
et al. 2022), which saves only q, k, v, the output and the row log-sum-exp. So on meta
the model dispatches the flash kernel op itself: the activation bytes measured are those
a GPU would hold, and FlopCounterMode counts it with its flash formulas (forward: the
same 4*B*H*T*T*D as the math path; backward: 2.5x forward, since flash recomputes the
scores).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

STYLES = ("gpt", "llama")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a decoder-only transformer. ``ffn_hidden=None`` means 4*d_model."""

    style: str
    n_layer: int
    n_head: int
    d_model: int
    vocab_size: int
    max_seq_len: int  # size of the learned position table (gpt); rotary has no table
    n_kv_head: Optional[int] = None  # None: n_head (no grouped-query attention)
    ffn_hidden: Optional[int] = None
    norm_eps: float = 1e-5

    def __post_init__(self):
        if self.style not in STYLES:
            raise ValueError(f"style must be one of {STYLES}, got {self.style!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model {self.d_model} not divisible by n_head {self.n_head}")
        if self.n_head % self.kv_heads:
            raise ValueError(f"n_head {self.n_head} not a multiple of n_kv_head {self.kv_heads}")

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.d_model


def _gpt(n_layer, n_head, d_model, vocab=50257, ctx=2048) -> ModelConfig:
    return ModelConfig("gpt", n_layer, n_head, d_model, vocab, ctx)


def _llama(n_layer, n_head, d_model, ffn, n_kv_head=None, vocab=32000, ctx=4096):
    return ModelConfig("llama", n_layer, n_head, d_model, vocab, ctx, n_kv_head, ffn)


# Published sizes the tests hold the parameter counts to (within 10%):
#   gpt-125m .. gpt-2.7b: GPT-3 paper (Brown et al. 2020), Table 2.1 (n_layers, d_model,
#     n_heads; 50257-token GPT-2 vocabulary, 2048-token context). GPT-3 XL lists 24 heads
#     of 128 with d_model 2048, which does not multiply out; we use 16 heads of 128.
#   llama-7b, llama-13b: LLaMA paper (Touvron et al. 2023), Table 2 (6.7B, 13.0B); FFN
#     width 11008 / 13824 = 2/3*4d rounded up to a multiple of 256, from the paper's code.
#   llama-70b: Llama 2 paper (Touvron et al. 2023b): 80 layers, d 8192, 64 heads, 8 KV
#     heads (GQA), FFN 28672 (as released). Context 4096 for all llama presets.
PUBLISHED_PARAMS = {
    "gpt-125m": 125e6, "gpt-350m": 350e6, "gpt-1.3b": 1.3e9, "gpt-2.7b": 2.7e9,
    "llama-7b": 6.7e9, "llama-13b": 13.0e9, "llama-70b": 70e9,
}

PRESETS: dict[str, ModelConfig] = {
    # Toy sizes for CPU training: byte-level vocabulary, short context.
    "gpt-nano": _gpt(1, 1, 32, vocab=256, ctx=256),         # ~0.03M: the proxy's smaller neighbour (bench_convergence --sizes)
    "gpt-proxy": _gpt(2, 2, 64, vocab=256, ctx=256),        # ~0.13M: the convergence proxy (sim/convergence.py)
    "gpt-tiny": _gpt(4, 4, 128, vocab=256, ctx=256),        # ~0.8M params
    "gpt-small-cpu": _gpt(4, 4, 256, vocab=1024, ctx=256),  # ~3.5M params
    "llama-tiny": _llama(4, 4, 128, 352, n_kv_head=2, vocab=256, ctx=256),  # ~0.8M, GQA
    # The text task's GPT-2 family (oresearcher.tasks.text): 1024-token BPE vocabulary, 128-token
    # context; named by non-embedding parameters (12 d^2 per layer plus biases and norms), the
    # count Kaplan et al. (2020) fit scaling laws to. Heads of 16-32 dimensions.
    "text-6k": _gpt(2, 1, 15, vocab=1024, ctx=128),   # the scaling ladder's smallest rungs (bench_scaling)
    "text-12k": _gpt(2, 1, 22, vocab=1024, ctx=128),
    "text-25k": _gpt(2, 2, 32, vocab=1024, ctx=128),
    "text-50k": _gpt(2, 3, 45, vocab=1024, ctx=128),  # the scaling ladder's second rung (bench_scaling)
    "text-100k": _gpt(2, 4, 64, vocab=1024, ctx=128),
    "text-230k": _gpt(3, 5, 80, vocab=1024, ctx=128),
    "text-450k": _gpt(4, 6, 96, vocab=1024, ctx=128),
    "text-800k": _gpt(4, 8, 128, vocab=1024, ctx=128),
    "text-1.5m": _gpt(6, 6, 144, vocab=1024, ctx=128),
    "gpt-125m": _gpt(12, 12, 768),
    "gpt-350m": _gpt(24, 16, 1024),
    "gpt-1.3b": _gpt(24, 16, 2048),
    "gpt-2.7b": _gpt(32, 32, 2560),
    "llama-7b": _llama(32, 32, 4096, 11008),
    "llama-13b": _llama(40, 40, 5120, 13824),
    "llama-70b": _llama(80, 64, 8192, 28672, n_kv_head=8),
}


def _rotary_tables(seq_len: int, head_dim: int, device, dtype, base: float = 10000.0):
    """cos, sin of shape [T, head_dim] (RoFormer, Su et al. 2021, eq. 34)."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, device=device,
                                           dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _apply_rotary(x, cos, sin):
    """x: [B, H, T, D]; rotates pairs (i, i + D/2), the half-split layout of GPT-NeoX/Llama."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def _causal_attention(q, k, v):
    """q: [B, H, T, D]; k, v: [B, Hkv, T, D] -> [B, H, T, D]. See the module docstring."""
    if q.device.type == "meta":
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)[0]
    return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                          enable_gqa=k.shape[1] != q.shape[1])


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, **factory):
        super().__init__()
        self.cfg = cfg
        bias = cfg.style == "gpt"
        kv_dim = cfg.kv_heads * cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, cfg.d_model + 2 * kv_dim, bias=bias, **factory)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=bias, **factory)

    def forward(self, x, cos=None, sin=None):
        B, T, _ = x.shape
        c = self.cfg
        q, k, v = self.qkv(x).split([c.d_model, c.kv_heads * c.head_dim,
                                     c.kv_heads * c.head_dim], dim=-1)
        q = q.view(B, T, c.n_head, c.head_dim).transpose(1, 2)
        k = k.view(B, T, c.kv_heads, c.head_dim).transpose(1, 2)
        v = v.view(B, T, c.kv_heads, c.head_dim).transpose(1, 2)
        if cos is not None:
            q, k = _apply_rotary(q, cos, sin), _apply_rotary(k, cos, sin)
        y = _causal_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(B, T, c.d_model))


class MLP(nn.Module):
    """GELU MLP (gpt) or SwiGLU (llama): down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig, **factory):
        super().__init__()
        self.swiglu = cfg.style == "llama"
        bias = not self.swiglu
        self.up = nn.Linear(cfg.d_model, cfg.ffn, bias=bias, **factory)
        self.gate = nn.Linear(cfg.d_model, cfg.ffn, bias=False, **factory) if self.swiglu else None
        self.down = nn.Linear(cfg.ffn, cfg.d_model, bias=bias, **factory)

    def forward(self, x):
        if self.swiglu:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x), approximate="tanh"))


class _RMSNormFn(torch.autograd.Function):
    """RMSNorm (Zhang & Sennrich 2019) that saves x and the fp32 row rstd, as CUDA's fused
    kernel (aten::_fused_rms_norm) does. On CPU and meta, nn.RMSNorm decomposes into
    fp32 ops that save two fp32 copies of x, 4x what a GPU holds; the activation
    bytes measured on meta would then overstate a GPU run."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        xf = x.to(torch.promote_types(x.dtype, torch.float32))  # fp32 math for bf16/fp16
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)  # [..., 1]
        ctx.save_for_backward(x, weight, rstd)
        return (xf * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        xhat = x.to(rstd.dtype) * rstd
        gw = grad.to(rstd.dtype) * weight.to(rstd.dtype)
        # d/dx of x*rstd(x): rstd * (g - xhat * mean(g * xhat)) along the normalized dim
        dx = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
        dw = (grad.to(rstd.dtype) * xhat).flatten(0, -2).sum(0)
        return dx.to(x.dtype), dw.to(weight.dtype), None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x):
        return _RMSNormFn.apply(x, self.weight, self.eps)


def _norm(cfg: ModelConfig, **factory) -> nn.Module:
    if cfg.style == "gpt":
        return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, **factory)
    return RMSNorm(cfg.d_model, eps=cfg.norm_eps, **factory)


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig, **factory):
        super().__init__()
        self.norm1, self.attn = _norm(cfg, **factory), Attention(cfg, **factory)
        self.norm2, self.mlp = _norm(cfg, **factory), MLP(cfg, **factory)

    def forward(self, x, cos=None, sin=None):
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.mlp(self.norm2(x))


class DecoderLM(nn.Module):
    """tokens [B, T] (int64) -> logits [B, T, vocab_size].

    Set ``activation_checkpointing = True`` to recompute each block in backward
    (torch.utils.checkpoint, non-reentrant): only block inputs stay saved.
    """

    def __init__(self, cfg: ModelConfig, **factory):
        super().__init__()
        self.cfg = cfg
        self.activation_checkpointing = False
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model, **factory)
        self.pos_emb = (nn.Embedding(cfg.max_seq_len, cfg.d_model, **factory)
                        if cfg.style == "gpt" else None)
        self.blocks = nn.ModuleList(Block(cfg, **factory) for _ in range(cfg.n_layer))
        self.norm_f = _norm(cfg, **factory)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False, **factory)
        if cfg.style == "gpt":
            self.lm_head.weight = self.tok_emb.weight  # weight tying (Press & Wolf 2017)
        self._init_weights()

    def _init_weights(self):
        # GPT-2 init: N(0, 0.02), zero biases, residual projections scaled by
        # 1/sqrt(2*n_layer) (Radford et al. 2019, section 2.3). No-op cost on meta.
        if self.tok_emb.weight.device.type == "meta":
            return
        for name, p in self.named_parameters():
            if p.dim() < 2:
                nn.init.zeros_(p) if name.endswith("bias") else nn.init.ones_(p)
            else:
                std = 0.02 / math.sqrt(2 * self.cfg.n_layer) if name.endswith(
                    ("proj.weight", "down.weight")) else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        B, T = tokens.shape
        x = self.tok_emb(tokens)  # [B, T, d]
        rope = (None, None)  # cos, sin [T, head_dim] for rotary
        if self.pos_emb is not None:
            if T > self.cfg.max_seq_len:
                raise ValueError(f"sequence length {T} > max_seq_len {self.cfg.max_seq_len}")
            x = x + self.pos_emb(torch.arange(T, device=tokens.device))
        else:
            rope = _rotary_tables(T, self.cfg.head_dim, x.device, x.dtype)
        for block in self.blocks:
            if self.activation_checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, *rope, use_reentrant=False, preserve_rng_state=False)
            else:
                x = block(x, *rope)
        return self.lm_head(self.norm_f(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy; logits [B, T, V], targets [B, T] (int64).

    Computed in fp32, as autocast does for cross_entropy: with a 32k-50k vocabulary a
    bf16 log-softmax loses too much precision.
    """
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def build_model(name: str, device="meta", dtype=torch.float32) -> DecoderLM:
    """Build preset ``name`` (see PRESETS) on ``device`` in ``dtype``."""
    if name not in PRESETS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(PRESETS)}")
    return DecoderLM(PRESETS[name], device=device, dtype=dtype)


def n_params(name: str) -> int:
    """Every parameter of preset ``name``, embeddings included (the Chinchilla convention)."""
    return sum(p.numel() for p in build_model(name, device="meta").parameters())


def n_non_embedding(name: str) -> int:
    """Parameters of preset ``name`` less its token and position tables and an untied output
    layer: the N Kaplan et al. (2020) fit size laws to, and the size ladder's."""
    m = build_model(name, device="meta")
    tables = [m.tok_emb, m.pos_emb] + ([m.lm_head] if m.lm_head.weight is not m.tok_emb.weight else [])
    return sum(p.numel() for p in m.parameters()) - sum(t.weight.numel() for t in tables if t is not None)
