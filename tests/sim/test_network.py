"""Max-min fair flow network: golden cases by hand and hypothesis properties."""
import simpy
from hypothesis import given, settings, strategies as st

from oresearcher.comm.maxmin import maxmin_rates
from oresearcher.sim.network import FlowNetwork


def run_flows(capacity, batches):
    """batches: [(start_time, [(route, bytes)])] -> finish time of each batch."""
    env = simpy.Environment()
    net = FlowNetwork(env, capacity)
    done = {}

    def starter(i, t0, flows):
        yield env.timeout(t0)
        yield net.transfer(flows)
        done[i] = env.now

    for i, (t0, flows) in enumerate(batches):
        env.process(starter(i, t0, flows))
    env.run()
    return [done[i] for i in range(len(batches))]


def test_one_flow_takes_bytes_over_bandwidth():
    assert run_flows([100.0], [(0, [((0,), 1000.0)])]) == [10.0]


def test_two_concurrent_flows_on_one_link_take_twice_as_long():
    alone = run_flows([100.0], [(0, [((0,), 1000.0)])])[0]
    both = run_flows([100.0], [(0, [((0,), 1000.0)]), (0, [((0,), 1000.0)])])
    assert both == [2 * alone, 2 * alone]


def test_late_flow_shares_only_the_overlap():
    # A starts alone at rate 100; at t=5 B joins (500 bytes left each side): both at 50
    # -> A's remaining 500 B take 10 s -> A ends at 15; B has 500 left at 15 -> +5 s
    a, b = run_flows([100.0], [(0, [((0,), 1000.0)]), (5, [((0,), 1000.0)])])
    assert abs(a - 15.0) < 1e-9 and abs(b - 20.0) < 1e-9


def test_bottleneck_golden():
    # link 0 cap 10 shared by f0,f1; f1 also crosses link 1 cap 2 -> f1 = 2, f0 = 8
    assert maxmin_rates([(0,), (0, 1)], [10.0, 2.0]) == [8.0, 2.0]


routes_st = st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True), min_size=1, max_size=8)
caps_st = st.lists(st.floats(1.0, 100.0), min_size=6, max_size=6)


@settings(max_examples=200, deadline=None)
@given(routes_st, caps_st)
def test_maxmin_is_feasible_and_every_flow_has_a_bottleneck(routes, caps):
    rates = maxmin_rates(routes, caps)
    load = [0.0] * 6
    for r, x in zip(routes, rates):
        for link in r:
            load[link] += x
    assert all(load[l] <= caps[l] * (1 + 1e-9) for l in range(6))
    for r, x in zip(routes, rates):
        # max-min optimality: some link on the route is saturated and x is the largest rate on it
        assert any(load[l] >= caps[l] * (1 - 1e-9) and all(
            x >= y * (1 - 1e-9) for rr, y in zip(routes, rates) if l in rr) for l in r)


def test_maxmin_is_not_monotone_on_arbitrary_graphs():
    """Why the monotonicity property is checked on the simulator's own topologies
    (tests/sim/test_engine.py), not on arbitrary graphs: hypothesis found this case.
    A new flow on link 0 slows the two flows there, which frees link 5 for the others,
    and the batch ends earlier."""
    base = [(0.0, [((0, 5), 100.0), ((0, 2), 200.0), ((5, 1), 300.0), ((5,), 400.0), ((1, 2), 500.0)])]
    alone = run_flows([1.0] * 6, base)[0]
    with_extra = run_flows([1.0] * 6, base + [(0.0, [((0,), 1.0)])])[0]
    assert with_extra < alone
