"""Attention-weighted parameter fusion and the attention ensemble over model outputs.

Fusion round (policy parameter passing). Within one architecture group of n agents with
flat parameters theta[n, P], agent i takes

    theta_i <- sum_j a_ij theta_j,      a_ij = softmax_j(score_ij / tau),
    score_ij = r_j + lambda * s_ij,

where r_j in [0, 1] is agent j's reliability as published by the validators (held-out
accuracy, normalised return), s_ij in (0, 1] the similarity of i and j, and agents the
validators flagged get a_ij = 0. The similarity is an RBF kernel on parameter distance,

    s_ij = exp(-||theta_i - theta_j||^2 / (2 sigma^2)),   sigma^2 = mean_{k != l} ||theta_k - theta_l||^2,

so it is 1 for i = j, scale-free (sigma^2 is the median-style heuristic of kernel
methods) and makes each agent lean towards neighbours in weight space, which keeps the
group from collapsing into one point while reliable agents still pull hardest. This is
attention with agent i as the query and agents j as keys (Vaswani et al. 2017), scored
on reliability as in reputation-weighted aggregation. A uniform score matrix gives plain
averaging (a_ij = 1/n), the local-SGD / DiLoCo baseline; an outer Nesterov step on the
pseudo-gradient (oresearcher.cooperation.outer) can follow either.

:class:`HeterogeneousEnsemble` combines the *outputs* of agents of different
architectures: each agent's output [B, w_k] is projected to a common width, the agents
attend to each other (multi-head attention over the agent axis, one token per agent per
sample) and the results are averaged. With ``init="average"`` it starts out exactly equal
to the plain mean of the (projected) outputs, so an untrained ensemble is the classic
averaging ensemble, and training it (distillation) can only move away from that.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


def rbf_similarity(flat: torch.Tensor) -> torch.Tensor:
    """[n, P] -> [n, n] similarities in (0, 1], 1 on the diagonal; all ones if all equal."""
    x = flat.to(torch.float64)
    d2 = torch.cdist(x, x).pow(2)
    n = x.shape[0]
    if n < 2:
        return torch.ones(n, n, dtype=torch.float64)
    off = d2[~torch.eye(n, dtype=torch.bool)]
    sigma2 = off.mean()
    if not torch.isfinite(sigma2) or sigma2 <= 0:
        return torch.ones(n, n, dtype=torch.float64)
    return torch.exp(-d2 / (2.0 * sigma2))


def attention_scores(reliability: torch.Tensor, similarity: torch.Tensor, similarity_weight: float) -> torch.Tensor:
    """score_ij = r_j + lambda * s_ij, [n, n]; non-finite reliabilities count as 0."""
    r = torch.nan_to_num(torch.as_tensor(reliability, dtype=torch.float64), nan=0.0, posinf=0.0, neginf=0.0)
    return r.unsqueeze(0) + similarity_weight * similarity.to(torch.float64)


def fusion_weights(scores: torch.Tensor, excluded: torch.Tensor | None = None, temperature: float = 1.0) -> torch.Tensor:
    """Row-wise softmax(scores / tau) with excluded columns set to 0; rows sum to 1.

    If every agent is excluded there is nothing trustworthy to fuse: each agent keeps its
    own parameters (identity weights).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    s = torch.as_tensor(scores, dtype=torch.float64)
    n = s.shape[0]
    ex = torch.zeros(n, dtype=torch.bool) if excluded is None else torch.as_tensor(excluded, dtype=torch.bool)
    if bool(ex.all()):
        return torch.eye(n, dtype=torch.float64)
    logits = (s / temperature).masked_fill(ex.unsqueeze(0), float("-inf"))
    logits = torch.nan_to_num(logits, nan=float("-inf"), posinf=float("inf"))
    return torch.softmax(logits, dim=1)


def average_weights(n: int, excluded: torch.Tensor | None = None) -> torch.Tensor:
    """Plain averaging over the agents not excluded (the baseline), [n, n]."""
    return fusion_weights(torch.zeros(n, n, dtype=torch.float64), excluded, 1.0)


def fuse(flat: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_j w_j flat_j for one row of weights; members with weight 0 are skipped, so a
    NaN in an excluded agent's parameters cannot leak into the result."""
    w = torch.as_tensor(weights, dtype=torch.float64)
    out = torch.zeros(flat.shape[1:], dtype=torch.float64, device=flat.device)
    for j in torch.nonzero(w > 0).reshape(-1).tolist():
        out.add_(flat[j].to(torch.float64), alpha=float(w[j]))
    return out.to(flat.dtype)


def group_weights(flat: torch.Tensor, reliability: torch.Tensor, excluded: torch.Tensor, *,
                  method: str = "attention", temperature: float = 0.1,
                  similarity_weight: float = 0.5) -> torch.Tensor:
    """The [n, n] fusion weights of one architecture group, by ``method``."""
    return weights_from_similarity(flat.shape[0], lambda idx: rbf_similarity(flat[idx]), reliability, excluded,
                                   method=method, temperature=temperature, similarity_weight=similarity_weight)


def weights_from_similarity(n: int, similarity_of, reliability, excluded, *, method: str = "attention",
                            temperature: float = 0.1, similarity_weight: float = 0.5) -> torch.Tensor:
    """[n, n] fusion weights, given ``similarity_of(idx)``: the [k, k] similarity of the
    healthy agents ``idx`` (whole parameters, or shard-wise distances summed)."""
    if method == "average":
        return average_weights(n, excluded)
    if method != "attention":
        raise ValueError(f"unknown fusion method {method!r}")
    ok = ~torch.as_tensor(excluded, dtype=torch.bool)
    sim = torch.ones(n, n, dtype=torch.float64)
    if int(ok.sum()) >= 2:  # similarity among the healthy agents only (NaNs stay out)
        idx = torch.nonzero(ok).reshape(-1)
        sim[idx.unsqueeze(1), idx.unsqueeze(0)] = similarity_of(idx)
    return fusion_weights(attention_scores(reliability, sim, similarity_weight), excluded, temperature)


class HeterogeneousEnsemble(nn.Module):
    """Attention ensemble over the outputs of agents with different output widths.

    forward(outputs: list of [B, w_k], present=None) -> [B, d_model] (or [B, out_width]
    with ``out_width``: a linear head after the mean). Projections to ``d_model``, one
    multi-head attention over the agent axis, then the mean over agents. ``present``
    ([n] bool) leaves agents out: they are masked as keys and left out of the mean, and
    their outputs (NaN for a diverged agent) are never read. Training it is
    :mod:`oresearcher.cooperation.ensemble`'s job.
    """

    def __init__(self, in_widths: Sequence[int], d_model: int, n_heads: int = 1, init: str = "average",
                 out_width: int | None = None):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} not divisible by n_heads {n_heads}")
        self.proj = nn.ModuleList(nn.Linear(w, d_model) for w in in_widths)
        self.attn = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
        self.head = None if out_width is None else nn.Linear(d_model, out_width)
        if init == "average":
            self._init_average()
        elif init != "random":
            raise ValueError(f"init must be 'average' or 'random', got {init!r}")

    @torch.no_grad()
    def _init_average(self) -> None:
        d = self.attn.embed_dim
        for p in self.proj:
            p.weight.zero_()
            k = min(p.in_features, d)
            p.weight[:k, :k] = torch.eye(k)  # identity where widths allow, zero-padded
            p.bias.zero_()
        w = self.attn.in_proj_weight  # [3d, d]: q, k, v stacked
        w.zero_()  # q = k = 0: every attention score equal, softmax uniform
        w[2 * d:] = torch.eye(d)
        self.attn.in_proj_bias.zero_()
        self.attn.out_proj.weight.copy_(torch.eye(d))
        self.attn.out_proj.bias.zero_()
        if self.head is not None:  # the first out_width of the d_model columns, unchanged
            self.head.weight.zero_()
            k = min(self.head.out_features, d)
            self.head.weight[:k, :k] = torch.eye(k)
            self.head.bias.zero_()

    def forward(self, outputs: Sequence[torch.Tensor], present: torch.Tensor | None = None) -> torch.Tensor:
        if len(outputs) != len(self.proj):
            raise ValueError(f"{len(outputs)} outputs for an ensemble of {len(self.proj)} agents")
        if present is None:
            tokens = torch.stack([p(o) for p, o in zip(self.proj, outputs)], dim=1)  # [B, n, d]
            mixed, _ = self.attn(tokens, tokens, tokens, need_weights=False)
            pooled = mixed.mean(dim=1)
        else:
            keep = torch.as_tensor(present, dtype=torch.bool)
            tokens = torch.stack([p(o if bool(k) else torch.zeros_like(o)) for p, o, k in
                                  zip(self.proj, outputs, keep)], dim=1)  # [B, n, d]
            pad = (~keep).unsqueeze(0).expand(tokens.shape[0], -1)  # [B, n], True: not a key
            mixed, _ = self.attn(tokens, tokens, tokens, key_padding_mask=pad, need_weights=False)
            w = keep.to(mixed.dtype) / keep.sum().clamp(min=1)
            pooled = (mixed * w.view(1, -1, 1)).sum(dim=1)
        return pooled if self.head is None else self.head(pooled)
