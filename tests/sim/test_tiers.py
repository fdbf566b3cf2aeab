"""Multi-tier fat trees and rail-optimised networks (oresearcher/comm/tiers.py): uplink capacities,
routes and transfer times derived by hand, bad sections refused in one line."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oresearcher import ops as O
from oresearcher.errors import UserError
from oresearcher.scenario import load_scenario
from oresearcher.sim.simulate import build_cluster
from oresearcher.comm.tiers import Tier, uplink_capacities
from oresearcher.comm import build_topology
from simkit import fabric, meta, time_one

MiB = 2**20
US = 1e-6
B = 100e9  # the golden fabric: 100 GB/s, efficiency 1, call 2 us, base 5 us, hop 1 us


def net(nodes, gpus, nics, kind, tiers):
    return build_topology(nodes * gpus, gpus, fabric(), fabric(), nics, network=(kind, tiers))


def test_uplink_capacities_by_hand():
    # fat tree, 8 NICs a node: leaf 4 nodes = 32 ports down, 2:1 -> 16 up at B; a spine of
    # 2 leaves = 32 ports down, 4:1 -> 8 up at 2B = 16B
    assert uplink_capacities("fat-tree", [Tier(4, 2.0, B), Tier(2, 4.0, 2 * B)], 8) == [16 * B, 16 * B]
    # rail leaf: one NIC of each of its 4 nodes, 2:1 -> 2 ports up; the spine above joins 2
    # groups x 8 rails of leaves, 2 ports each = 32 ports, non-blocking
    assert uplink_capacities("rail-optimised", [Tier(4, 2.0, B), Tier(2, 1.0, B)], 8) == [2 * B, 32 * B]


def test_two_tier_fat_tree_ring_golden():
    # 4 single-GPU nodes, 2 per leaf; leaf uplinks 2 ports / 4 = half a port: 50 GB/s. The
    # ring 0-1-2-3-0 crosses a leaf's uplink twice (1->2, 3->0), one flow each: those
    # flows run at 50 GB/s and set the phase. call 2 + base 5 + 6 hops x 1 us + 2(n-1)/n S / 50 GB/s
    t = net(4, 1, 1, "fat-tree", [Tier(2, 4.0, B)])
    assert t.route(0, 1) == (t.nic_up[0, 0], t.nic_down[1, 0])
    assert len(t.route(1, 2)) == 4 and t.capacity[t.route(1, 2)[1]] == B / 2
    end, _ = time_one(t, lambda r: O.AllReduce(meta(MiB)), "ring")
    assert end == pytest.approx(13 * US + 1.5 * MiB / (B / 2), rel=1e-12)
    # non-blocking leaves (2 ports up at B): the flat network's time
    end, _ = time_one(net(4, 1, 1, "fat-tree", [Tier(2, 1.0, B)]), lambda r: O.AllReduce(meta(MiB)), "ring")
    assert end == pytest.approx(13 * US + 1.5 * MiB / B, rel=1e-12)


def test_rail_optimised_golden():
    # 2 nodes x 2 GPUs, a NIC each (2 rails), one group: rail leaf k holds NIC k of both
    # nodes; 2 ports down / 4 = half a port up: 50 GB/s. Same rail (0 -> 2): NIC to NIC,
    # call 2 + hop 1 us + 1 MiB / 100 GB/s. Across rails (0 -> 3): up rail 0's leaf, down
    # rail 1's: 1 MiB / 50 GB/s.
    t = net(2, 2, 2, "rail-optimised", [Tier(2, 4.0, B)])
    assert t.route(0, 2) == (t.nic_up[0, 0], t.nic_down[1, 0])
    assert [t.names[x] for x in t.route(0, 3)] == ["n0.nic0.up", "t1.(0, 0).up", "t1.(0, 1).down", "n1.nic1.down"]
    for dst, rate in ((2, B), (3, B / 2)):
        end, _ = time_one(t, lambda r: (O.Send(meta(MiB), dst=dst) if r == 0 else
                                        O.Recv(meta(MiB), src=0) if r == dst else O.Barrier(group=(r,))))
        assert end == pytest.approx(3 * US + MiB / rate, rel=1e-12)


@settings(max_examples=20, deadline=None)
@given(nodes=st.sampled_from([2, 4, 8]), group=st.sampled_from([1, 2]), nics=st.sampled_from([1, 2]),
       kind=st.sampled_from(["fat-tree", "rail-optimised"]))
def test_non_blocking_tiers_price_like_the_flat_switch(nodes, group, nics, kind):
    """Tiers with 1:1 uplinks at the NICs' bandwidth never slow a ring (every route's switch
    links have at least the NIC's capacity and carry no more flows than a NIC does)."""
    flat = build_topology(nodes * 2, 2, fabric(), fabric(), nics)
    tiered = net(nodes, 2, nics, kind, [Tier(group, 1.0, B)])
    op = lambda r: O.AllReduce(meta(MiB))  # noqa: E731
    assert time_one(tiered, op, "ring")[0] == pytest.approx(time_one(flat, op, "ring")[0], rel=1e-12)


BAD = ["cluster.nodes=2", "cluster.inter_node=hdr-ib", "agents.count=16"]


@pytest.mark.parametrize("sets,needle", [
    (['cluster.network={"tiers": [{"group": 3}]}'], "tiers[0].group: 2 nodes do not fill switches of 3"),
    (['cluster.network={"tiers": [{"group": 2, "oversubscription": 0.5}]}'], "oversubscription"),
    (['cluster.network={"tiers": [{"group": 2, "fabric": "nope"}]}'], "cluster.network.tiers[0].fabric"),
    (['cluster.network={"kind": "torus", "tiers": [{"group": 2}]}'], "kind"),
])
def test_bad_network_sections_are_one_line(sets, needle):
    with pytest.raises(UserError) as e:
        load_scenario("scenarios/2x8xA100.yaml", BAD + sets)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_scenario_network_section_builds_tiers():
    sc = load_scenario("scenarios/2x8xA100.yaml",
                       ['cluster.network={"kind": "rail-optimised", "tiers": [{"group": 2, "oversubscription": 2}]}'])
    _, t = build_cluster(sc)
    assert len(t.route(0, 9)) == 4 and len(t.route(0, 8)) == 2  # cross-rail via the spine; same rail direct
