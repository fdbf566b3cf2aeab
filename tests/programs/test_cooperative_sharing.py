"""Gradient sharing in the cooperative program when an agent's gradient is non-finite:
it shares zeros, and the average divides by the healthy agents, not all of them (with
and without a codec)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from oresearcher import ops as O
from oresearcher.codecs import build
from oresearcher.programs import AgentContext
from oresearcher.programs.cooperative_local import finite_buckets, healthy_average
from oresearcher.scenario import load_scenario
from oresearcher.testing import run_programs

SC = load_scenario(Path(__file__).resolve().parents[2] / "scenarios" / "digits-4.yaml")  # at collection: anchored


class _Grads:
    def __init__(self, buckets):
        self.buckets = buckets

    def grad_buckets(self):
        return [b.clone() for b in self.buckets]


def _share(grads, codec_spec):
    out = {}

    def prog(rank):
        ctx = AgentContext(rank, len(grads), SC, mode="numeric")
        codec = None if codec_spec is None else build(codec_spec, seed=rank, shared_seed=0)
        buckets = finite_buckets(_Grads(grads[rank]))
        out[rank] = yield from healthy_average(ctx, buckets, None, codec)
        yield O.StepDone(0, {})

    run_programs([prog(r) for r in range(len(grads))])
    return out


def _grads(seed):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(5, generator=g), torch.randn(3, generator=g)] for _ in range(4)]


@pytest.mark.parametrize("codec", [None, "bf16"])
def test_non_finite_agent_is_left_out_of_the_average(codec):
    grads = _grads(0)
    grads[2][1][0] = float("nan")  # agent 2 diverged
    out = _share(grads, codec)
    healthy = [0, 1, 3]
    for k in range(2):
        want = sum(grads[r][k] for r in healthy) / 3  # not / 4
        tol = 1e-6 if codec is None else 2e-2
        for r in range(4):
            assert out[r][k].shape == grads[0][k].shape
            torch.testing.assert_close(out[r][k], want, atol=tol, rtol=tol)


def test_all_healthy_is_the_plain_average_bit_for_bit():
    grads = _grads(1)
    out = _share(grads, None)
    for k in range(2):
        plain = O.reduce_tensors([grads[r][k] for r in range(4)], "avg")
        assert torch.equal(out[0][k], plain)


def test_all_diverged_share_zeros():
    grads = _grads(2)
    for g in grads:
        g[0][0] = float("inf")
    out = _share(grads, None)
    assert all(bool((b == 0).all()) for b in out[0])
