"""Shard-wise fusion equals the unsharded fusion round (oresearcher.cooperation.fusion), moving 1/S
of the parameters: pure functions and the ops on the reference interpreter."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oresearcher import ops as O
from oresearcher.cooperation.fusion import fuse, group_weights
from oresearcher.cooperation.sharded_fusion import fuse_sharded, partial_sq_distances, weights_from_sq_distances
from oresearcher.models.sharding import shard_groups
from oresearcher.testing import run_programs


def _agents(n, p, seed):
    g = torch.Generator().manual_seed(seed)
    flat = torch.randn(n, p, generator=g, dtype=torch.float64) * torch.rand(n, 1, generator=g, dtype=torch.float64)
    return flat, torch.rand(n, generator=g, dtype=torch.float64)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 5), shards=st.integers(1, 4), seed=st.integers(0, 10**6),
       method=st.sampled_from(["attention", "average"]), exclude=st.integers(-1, 4))
def test_distances_add_up_over_shards_and_give_the_same_weights(n, shards, seed, method, exclude):
    flat, rel = _agents(n, 12, seed)
    excluded = torch.zeros(n, dtype=torch.bool)
    if 0 <= exclude < n:
        excluded[exclude] = True
    d2 = sum(partial_sq_distances(list(part)) for part in flat.chunk(shards, dim=1))
    got = weights_from_sq_distances(d2, rel, excluded, method=method, temperature=0.3, similarity_weight=0.7)
    want = group_weights(flat, rel, excluded, method=method, temperature=0.3, similarity_weight=0.7)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("agents,size", [(2, 2), (3, 2), (2, 1)])
def test_ops_round_fuses_every_shard_as_the_full_round_would(agents, size):
    world, P = agents * size, 8 * size
    flat, rel = _agents(agents, P, seed=agents * 10 + size)
    flat = flat.to(torch.float32)
    excluded = torch.zeros(agents, dtype=torch.bool)
    want_w = group_weights(flat, rel, excluded, temperature=0.2, similarity_weight=0.5)
    got = {}

    def prog(rank):
        shard_group, replicate = shard_groups(rank, world, size)
        a, s = divmod(rank, size)
        mine = flat[a].chunk(size)[s].clone()
        got[rank] = yield from fuse_sharded(mine, a, rel, excluded, shard_group=shard_group,
                                            replicate_group=replicate, temperature=0.2, similarity_weight=0.5)
        yield O.StepDone(0)

    run_programs([prog(r) for r in range(world)])
    for a in range(agents):
        full = torch.cat([got[a * size + s] for s in range(size)])
        torch.testing.assert_close(full, fuse(flat, want_w[a]), rtol=1e-6, atol=1e-7)


def test_a_rank_moves_one_shard_per_peer_in_shape_mode():
    from oresearcher.sim.engine import Engine

    from simkit import DEVICE, topo  # tests/sim is on the pytest pythonpath

    agents, size, P = 2, 4, 4 * 10**6
    world = agents * size
    rel, excluded = torch.ones(agents), torch.zeros(agents, dtype=torch.bool)

    def prog(rank):
        shard_group, replicate = shard_groups(rank, world, size)
        yield from fuse_sharded(torch.empty(P // size, device="meta"), rank // size, rel, excluded,
                                shard_group=shard_group, replicate_group=replicate)
        yield O.StepDone(0)

    tl = Engine(topo(world), DEVICE, "fp32", "ring").run([prog(r) for r in range(world)])
    gathered = tl.collectives["fusion_shard_gather"][2] / world
    assert gathered == pytest.approx((agents - 1) * 4 * P / size)  # one fp32 shard from each other agent
