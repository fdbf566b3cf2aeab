"""A flow always finishes, however large the simulated clock: a link fault that leaves
1e-9 of the bandwidth turns a megabyte into hours of transfer, and a remainder smaller
than the clock's resolution at that hour must still count as done (it can never drain:
``now + dt`` rounds back to ``now``)."""
import math

import simpy
from hypothesis import given, settings, strategies as st

from oresearcher.sim.network import FlowNetwork, done_within


def _finish(start_s: float, nbytes: list, capacity: float):
    env = simpy.Environment(initial_time=start_s)
    net = FlowNetwork(env, [capacity])
    ev = net.transfer([((0,), b) for b in nbytes])
    steps = 0
    while not ev.processed:
        env.step()
        steps += 1
        assert steps < 100, "the clock stopped advancing"
    return env.now, steps


@settings(max_examples=200, deadline=None)
@given(start=st.floats(0, 1e9), nbytes=st.lists(st.floats(1, 1e18), min_size=1, max_size=4),
       capacity=st.floats(1e-3, 1e12))
def test_a_flow_finishes_in_a_bounded_number_of_events_at_the_fair_rate(start, nbytes, capacity):
    end, _ = _finish(start, nbytes, capacity)
    want = start + sum(nbytes) / capacity  # the flows share the link; together they move at its capacity
    slack = done_within(want) + 1e-9 * (want - start) + 8 * math.ulp(want)
    assert abs(end - want) <= slack * max(1.0, len(nbytes))


def test_a_billionfold_slower_megabyte_late_in_a_run_finishes():
    # 1 MB at 1e-9 of 100 GB/s is 1e4 s; started 1e6 s into the run
    end, steps = _finish(1e6, [1e6 / 1e-9], 100e9)
    assert math.isclose(end, 1e6 + 1e4, rel_tol=1e-12) and steps <= 3


def test_the_done_tolerance_is_a_picosecond_early_and_the_clock_resolution_late():
    assert done_within(0.0) == done_within(1.0) == 1e-12
    assert done_within(1e6) == 4 * math.ulp(1e6) > 1e-12
