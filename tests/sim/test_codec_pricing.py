"""The simulator prices compressed collectives with the bytes the codec library promises,
and shows the trade-off of compressed exchanges: at 8 ranks an all-gather of 4x-compressed payloads
moves as many bytes as a plain ring all-reduce; the two-phase scheme keeps the saving."""
import pytest
import torch

from oresearcher import ops as O
from oresearcher.codecs import build
from oresearcher.codecs.collectives import allgather_exchange, collective_wire_bytes_per_rank, two_phase_allreduce
from oresearcher.sim.engine import Engine

from simkit import DEVICE, topo

N, NUMEL = 8, 2_000_000


def sent_per_rank(scheme, spec="int8"):
    def prog(rank):
        x = torch.empty(NUMEL, device="meta")
        codec = build(spec)
        if scheme == "allreduce":
            yield O.AllReduce(x, algorithm="ring")
        elif scheme == "allgather":
            yield from allgather_exchange(codec, x, world_size=N)
        else:
            yield from two_phase_allreduce(codec, x, rank=rank, world_size=N)
        yield O.StepDone(0)
    tl = Engine(topo(N), DEVICE, "fp32", "ring").run([prog(r) for r in range(N)])
    return tl.wire


@pytest.mark.parametrize("scheme", ["allreduce", "allgather", "two_phase"])
def test_simulated_bytes_equal_the_codec_library_formula(scheme):
    wire = sent_per_rank(scheme)
    expect = collective_wire_bytes_per_rank(scheme, build("int8"), NUMEL, N)
    assert all(w == pytest.approx(expect, rel=1e-9) for w in wire)


def test_allgather_of_compressed_payloads_saves_nothing_at_8_ranks_two_phase_keeps_it():
    plain = sent_per_rank("allreduce")[0]
    gathered = sent_per_rank("allgather")[0]
    two_phase = sent_per_rank("two_phase")[0]
    assert gathered == pytest.approx(plain, rel=0.01)
    assert two_phase == pytest.approx(plain / 4, rel=0.01)
