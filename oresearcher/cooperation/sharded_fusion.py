"""Attention-weighted fusion over *sharded* agents, shard by shard (no full copies).

When every agent is an FSDP group of S ranks (agents x S = world; rank a*S + s holds
shard s of agent a, the layout of :func:`oresearcher.models.sharding.shard_groups`), a fusion
round (:mod:`oresearcher.cooperation.fusion`) needs every agent's whole parameter vector only for
the squared distances of the RBF similarity, and those add up over shards:

    ||theta_i - theta_j||^2 = sum_s ||theta_i^s - theta_j^s||^2.

So each rank gathers shard s of every agent (an all-gather over the ranks holding shard
s, the *replicate group*), computes its part of the [n, n] distance matrix, and the
parts are summed within the agent (an all-reduce of n*n numbers over its *shard group*).
Every rank then holds the same distances, hence the same fusion weights as
:func:`oresearcher.cooperation.fusion.group_weights` computes from full vectors, and fuses its own
shard: theta_a^s <- sum_j a_aj theta_j^s. A rank moves (n - 1) * P/S parameters instead
of (n - 1) * P. Reliabilities and exclusions are per agent and known to every rank (the
validators publish them), as in the unsharded round.

:func:`fuse_sharded` is that round as ops (the simulator prices it, the backends run
it); the pure functions below are what the tests hold to the unsharded definition.
"""
from __future__ import annotations

import torch

from .fusion import weights_from_similarity
from ..ops import AllGather, AllReduce, Compute


def partial_sq_distances(shards: list[torch.Tensor]) -> torch.Tensor:
    """[n, n] squared distances between the agents' shards (float64)."""
    x = torch.stack([s.reshape(-1).to(torch.float64) for s in shards])
    return torch.cdist(x, x).pow(2)


def rbf_from_sq_distances(d2: torch.Tensor) -> torch.Tensor:
    """The RBF similarity of :func:`oresearcher.cooperation.fusion.rbf_similarity` from its squared
    distances: exp(-d2 / (2 sigma^2)), sigma^2 the mean off-diagonal d2."""
    n = d2.shape[0]
    if n < 2:
        return torch.ones(n, n, dtype=torch.float64)
    sigma2 = d2[~torch.eye(n, dtype=torch.bool)].mean()
    if not torch.isfinite(sigma2) or sigma2 <= 0:
        return torch.ones(n, n, dtype=torch.float64)
    return torch.exp(-d2 / (2.0 * sigma2))


def weights_from_sq_distances(d2: torch.Tensor, reliability, excluded, *, method: str = "attention",
                              temperature: float = 0.1, similarity_weight: float = 0.5) -> torch.Tensor:
    """The [n, n] fusion weights :func:`oresearcher.cooperation.fusion.group_weights` gives, from the
    agents' squared distances instead of their parameters."""
    return weights_from_similarity(d2.shape[0], lambda idx: rbf_from_sq_distances(d2[idx][:, idx]), reliability,
                                   excluded, method=method, temperature=temperature,
                                   similarity_weight=similarity_weight)


def fuse_shard(shards: list[torch.Tensor], row: torch.Tensor) -> torch.Tensor:
    """sum_j row_j shards_j; agents with weight 0 are never read (a NaN stays out)."""
    out = torch.zeros_like(shards[0], dtype=torch.float64)
    for j in torch.nonzero(row > 0).reshape(-1).tolist():
        out.add_(shards[j].to(torch.float64), alpha=float(row[j]))
    return out.to(shards[0].dtype)


def fuse_sharded(shard: torch.Tensor, agent: int, reliability, excluded, *, shard_group, replicate_group,
                 method: str = "attention", temperature: float = 0.1, similarity_weight: float = 0.5):
    """One fusion round for the rank holding ``shard`` of agent ``agent`` (ops; yields).

    ``replicate_group``: the ranks holding the same shard of every agent, in agent order;
    ``shard_group``: this agent's ranks. Returns the fused shard. In shape mode (meta
    tensors) only sizes flow: the distances and the weighted sum are charged by their FLOPs
    (the weights, n x n numbers, cost nothing) and the shard comes back unchanged.
    """
    shards = yield AllGather(shard, group=replicate_group, name="fusion_shard_gather")
    meta = shard.device.type == "meta"
    n, p = len(shards), shard.numel()
    gram = 2.0 * n * n * p  # cdist of n long vectors is a Gram matrix (matmul): 2 n^2 p FLOPs
    if meta:
        yield Compute(flops=gram, name="fusion_distances")
        part = torch.empty(n, n, dtype=torch.float64, device="meta")
    else:
        part = yield Compute(partial_sq_distances, shards, flops=gram, name="fusion_distances")
    d2 = part if len(shard_group) == 1 else (
        yield AllReduce(part, group=shard_group, op="sum", name="fusion_distance_sum"))
    if meta:  # sum_j a_j theta_j^s: a multiply-add per element and agent
        yield Compute(flops=2.0 * n * p, name="fusion_apply")
        return shard
    w = yield Compute(weights_from_sq_distances, d2, reliability, excluded, method=method,
                      temperature=temperature, similarity_weight=similarity_weight, name="fusion_weights")
    return (yield Compute(fuse_shard, shards, w[agent], flops=2.0 * n * p, name="fusion_apply"))
