"""The one place ring formulas live (oresearcher/comm/schedules.py): hand values, and the schedules agree with them."""
import pytest
from hypothesis import given, strategies as st

from oresearcher.comm import schedules, wire


def test_ring_formulas_by_hand():
    # 8 ranks, 1 MiB: all-reduce sends 2 x 7/8 MiB in 14 steps; reduce-scatter 7/8 MiB in 7;
    # all-gather of 1 MiB contributions 7 MiB in 7; broadcast forwards 1 MiB along a chain
    S = 2**20
    assert schedules.ring_bytes_per_rank("AllReduce", S, 8) == 1.75 * S and schedules.ring_steps("AllReduce", 8) == 14
    assert schedules.ring_bytes_per_rank("ReduceScatter", S, 8) == 0.875 * S and schedules.ring_steps("ReduceScatter", 8) == 7
    assert schedules.ring_bytes_per_rank("AllGather", S, 8) == 7 * S
    assert schedules.ring_bytes_per_rank("Broadcast", S, 8) == S
    assert schedules.bus_factor("AllReduce", 8) == 1.75 and schedules.bus_factor("AllGather", 8) == 0.875
    assert schedules.bus_factor("Broadcast", 8) == 1.0
    assert schedules.ring_terms("AllReduce", 8) == (14.0, 1.75) and schedules.ring_terms("AllToAll", 4) == (3.0, 0.75)
    assert schedules.ring_terms("AllReduce", 1) == (0.0, 0.0)
    with pytest.raises(ValueError):
        schedules.ring_terms("Barrier", 4)


@given(st.sampled_from(["AllReduce", "ReduceScatter", "AllGather"]), st.integers(2, 16), st.integers(1, 2**30))
def test_ring_schedule_sends_what_the_formula_says(kind, n, nbytes):
    assert wire.wire_bytes_per_rank(kind, "ring", nbytes, n) == pytest.approx(
        schedules.ring_bytes_per_rank(kind, nbytes, n), rel=1e-12)
