"""The fsdp program's schedule and memory, against numbers derived by hand.

Golden fabric (simkit): 100 GB/s per rank, 8 us per collective call (2 us call overhead +
5 us base + 1 us hop); an all-gather or reduce-scatter of a unit of S bytes on n ranks
takes 8 us + (n-1)/n * S / 100 GB/s. Golden device: 1 TFLOP/s, no host overhead.
"""
import pytest
import torch

from oresearcher import ops as O
from oresearcher.programs.fsdp import FusionRound, Schedule
from oresearcher.models.sharding import ShardPlan, Unit, shard_groups, shard_plan
from oresearcher.sim.engine import Engine
from oresearcher.sim.memory import FsdpSetup, estimate_fsdp_memory
from oresearcher.models.workloads import measure_lm
from simkit import DEVICE, meta, time_one, topo

GB = 10**9
BLOCK = 2 * 10**7  # fp32 elements per block: 80 MB
CF, CB = 10e9, 20e9  # forward / backward FLOPs per block: 10 ms / 20 ms at 1 TFLOP/s


def two_blocks():
    """A root with no parameters and no FLOPs, two blocks of 80 MB each."""
    block = Unit("block", ((BLOCK,),), CF, CB)
    return ShardPlan(Unit("root", (), 0.0, 0.0), (block, block))


def run(plan, world, group_size, reshard, steps=2, streams=True, **fabric):
    def prog(rank):
        shard, rep = shard_groups(rank, world, group_size)
        sched = Schedule(plan, shard, rep, reshard, torch.float32, torch.float32, streams)
        for step in range(steps):
            yield from sched.step()
            yield O.StepDone(step)
    eng = Engine(topo(world, **fabric), DEVICE, "fp32", "ring")
    return eng.run([prog(r) for r in range(world)])


def test_two_block_step_time_by_hand():
    # forward: the gathers of the root (0 B: 8 us) and block 1 (40 MB to move: 8 + 400 us)
    # are exposed; block 2's gather hides under block 1's forward. Backward: block 1's
    # re-gather hides under block 2's backward, block 2's reduce-scatter under block 1's;
    # block 1's reduce-scatter (408 us) is exposed at the end. Step: 0.408 + 60 + 0.408 ms.
    tl = run(two_blocks(), world=2, group_size=2, reshard=True)
    for r in range(2):
        assert tl.step_ends[r][0] == pytest.approx(60.816e-3, rel=1e-9)
        assert tl.step_ends[r][1] == pytest.approx(2 * 60.816e-3, rel=1e-9)
        # 3 gathers + 2 reduce-scatters of blocks per step, each moving half a block
        assert tl.wire[r] == pytest.approx(2 * 5 * 4 * BLOCK / 2)


def test_zero2_skips_the_backward_gather():
    z3, z2 = (run(two_blocks(), 2, 2, reshard) for reshard in (True, False))
    for r in range(2):
        assert z2.wire[r] == pytest.approx(z3.wire[r] * 4 / 5)  # 2 gathers + 2 reduce-scatters
        assert z2.step_ends[r][-1] == pytest.approx(z3.step_ends[r][-1])  # the re-gather was hidden


def test_backward_gather_exposed_when_compute_is_short():
    # blocks of 1 us backward: the re-gather of block 1 (408 us, issued when block 2's
    # backward starts) is waited for, so ZeRO-3 takes longer than ZeRO-2
    block = Unit("block", ((BLOCK,),), CF, 1e6)
    plan = ShardPlan(Unit("root", (), 0.0, 0.0), (block, block))
    z3, z2 = run(plan, 2, 2, True, steps=1), run(plan, 2, 2, False, steps=1)
    assert z3.step_ends[0][0] > z2.step_ends[0][0] + 300e-6


def test_without_streams_collectives_and_compute_take_turns():
    # CPU ranks (DeviceProfile.streams false): FSDP2 waits for every collective. Forward:
    # root gather 8 us, block 1's 408 us, 10 ms, block 2's 408 us, 10 ms; backward: block 2
    # (kept gathered) 20 ms then its reduce-scatter 408 us; block 1 re-gathered 408 us,
    # 20 ms, reduce-scatter 408 us; the root's (0 B) 8 us. 60 ms + 5 x 408 us + 16 us.
    tl = run(two_blocks(), world=2, group_size=2, reshard=True, steps=1, streams=False)
    assert tl.step_ends[0][0] == pytest.approx(62.056e-3, rel=1e-9)
    assert tl.wire[0] == pytest.approx(5 * 4 * BLOCK / 2)  # the same collectives as with streams
    z2 = run(two_blocks(), world=2, group_size=2, reshard=False, steps=1, streams=False)
    assert z2.step_ends[0][0] == pytest.approx(62.056e-3 - 408e-6, rel=1e-9)  # no re-gather
    hsdp = run(two_blocks(), world=4, group_size=2, reshard=True, steps=1, streams=False)
    assert hsdp.wire[0] == pytest.approx(5 * 40e6 + 2 * 40e6)  # as with streams (test_hsdp_groups_and_bytes)


def test_gloo_reduce_scatter_is_an_all_reduce():
    # FabricProfile.reduce_scatter all_reduce (gloo): a reduce-scatter of 80 MB on 2 ranks
    # costs a ring all-reduce of it: 2 + 5 us, 2 hops of 1 us, 2(n-1)/n x 80 MB at 100 GB/s
    t, tl = time_one(topo(2, reduce_scatter="all_reduce"), lambda r: O.ReduceScatter(meta(8 * 10**7)))
    assert t == pytest.approx(9e-6 + 800e-6, rel=1e-9)
    assert tl.wire[0] == pytest.approx(8e7)
    native, _ = time_one(topo(2), lambda r: O.ReduceScatter(meta(8 * 10**7)))
    assert native == pytest.approx(8e-6 + 400e-6, rel=1e-9)  # 1 hop, (n-1)/n x 80 MB


def test_hsdp_groups_and_bytes():
    assert shard_groups(5, 8, 4) == ((4, 5, 6, 7), (1, 5))
    assert shard_groups(2, 4, 4) == ((0, 1, 2, 3), (2,))
    with pytest.raises(ValueError):
        shard_groups(0, 6, 4)
    # 4 ranks, shard groups of 2: per step 3 gathers + 2 reduce-scatters of half a block
    # (40 MB each) and 2 ring all-reduces of a 40 MB shard over 2 replicas (40 MB sent)
    tl = run(two_blocks(), world=4, group_size=2, reshard=True, steps=1)
    for r in range(4):
        assert tl.wire[r] == pytest.approx(5 * 40e6 + 2 * 40e6)
    names = {n for n, (count, _, _) in tl.collectives.items() if count}
    assert {"fsdp_all_gather", "fsdp_reduce_scatter", "hsdp_all_reduce"} <= names


def test_padding_follows_fsdp2():
    u = Unit("u", ((5, 3), (7,)), 0.0, 0.0)
    assert u.numel == 22
    assert u.padded_numel(4) == 2 * 4 * 3 + 2 * 4  # dim 0 rounded up to a multiple of 4
    assert u.padded_numel(1) == 22


@pytest.mark.parametrize("name,ckpt", [("llama-tiny", False), ("gpt-tiny", True)])
def test_units_add_up_to_the_measured_model(name, ckpt):
    plan, cost = shard_plan(name, 2, 32, "bf16", ckpt), measure_lm(name, 2, 32, "bf16", ckpt)
    assert plan.params == cost.params and len(plan.blocks) == 4
    assert plan.fwd_flops == cost.fwd_flops
    assert plan.bwd_flops == pytest.approx(cost.bwd_flops + cost.recompute_flops)
    assert plan.blocks[0].fwd_flops > 0 and plan.root.fwd_flops > 0  # the LM head


def _memory(**kw):
    args = dict(params=GB, root_params=10**8, block_params=9 * 10**7, blocks=10, shard_size=8,
                compute_dtype="bf16", reduce_fp32=False, optimizer="adamw", reshard_after_forward=True,
                activation_bytes=GB, device_memory_bytes=80 * GB)
    args.update(kw)
    run = {k: args.pop(k) for k in ("activation_bytes", "device_memory_bytes", "sam") if k in args}
    return estimate_fsdp_memory(FsdpSetup(**args), **run)


def test_memory_by_hand():
    m = _memory()
    # 1e9 params over 8 ranks: fp32 params 0.5 GB, fp32 grads 0.5 GB, AdamW moments 1 GB
    assert (m.sharded_params, m.sharded_grads, m.optimizer_state) == (GB // 2, GB // 2, GB)
    # bf16 root (0.1e9) + current and prefetched blocks (2 x 0.09e9), gathered
    assert m.gathered_params == 2 * (10**8 + 2 * 9 * 10**7)
    assert m.grad_buffers == 2 * (10**8 + 2 * 9 * 10**7)
    assert m.total == 2 * GB + 2 * 560_000_000 + GB and m.fits
    z2 = _memory(reshard_after_forward=False)  # ZeRO-2: every block stays gathered
    assert z2.gathered_params == 2 * (10**8 + 10 * 9 * 10**7)
    assert _memory(reduce_fp32=True).grad_buffers == 4 * (10**8 + 2 * 9 * 10**7)
    assert _memory(shard_size=1, device_memory_bytes=16 * GB).fits is False  # unsharded: 16 B/param alone


def test_llama7b_fsdp_fits_where_ddp_does_not():
    from oresearcher.scenario import load_scenario
    from oresearcher.sim.simulate import build_cluster, memory_report

    path = "scenarios/8xA100-llama7b-fsdp.yaml"
    sharded = load_scenario(path)
    device, _ = build_cluster(sharded)
    fsdp = memory_report(sharded, device)
    ddp = memory_report(load_scenario(path, ["training.strategy=ddp"]), device)
    assert fsdp["fits"] and not ddp["fits"]
    assert fsdp["sharded_params"] == pytest.approx(4 * 6.74e9 / 8, rel=0.01)


def test_sharded_agents_fuse_one_shard_per_peer_and_share_no_gradients():
    # 4 ranks = 2 agents x 2 shards, fused after every step: each rank gathers the other
    # agent's fp32 shard (2 blocks x BLOCK / 2 elements); no gradient all-reduce
    class Fusion:
        method, temperature, similarity_weight = "attention", 0.1, 0.5

    def prog(rank):
        shard, _ = shard_groups(rank, 4, 2)
        sched = Schedule(two_blocks(), shard, (rank,), True, torch.float32, torch.float32)
        fusion = FusionRound(rank, 4, 2, 1, Fusion)
        for step in range(2):
            yield from sched.step()
            if fusion.due(step):
                yield from fusion.run(sched.local_shard(), None)
            yield O.StepDone(step)
    tl = Engine(topo(4), DEVICE, "fp32", "ring").run([prog(r) for r in range(4)])
    for r in range(4):
        assert tl.wire[r] == pytest.approx(2 * (5 * 4 * BLOCK / 2 + 4 * BLOCK) + 2 * 2 * 8 + 2 * 2 * 8 * 4 / 2,
                                           rel=1e-6)
    assert tl.collectives["fusion_shard_gather"][0] == 2 * 4 and not tl.collectives["hsdp_all_reduce"][0]


def test_cpu_and_gloo_profiles_say_what_fsdp2_and_gloo_do():
    from oresearcher.calibration.fabric_fit import FabricFit
    from oresearcher.calibration.profiles import device_doc, fabric_doc
    from oresearcher.sim.simulate import build_cluster
    from oresearcher.scenario import load_scenario
    from oresearcher.hardware import builtin_profiles

    cat = builtin_profiles()
    assert cat[("device", "cpu-local")].streams is False and cat[("device", "A100-SXM4-80GB")].streams
    assert cat[("fabric", "loopback")].reduce_scatter == "all_reduce"
    assert cat[("fabric", "nvswitch-a100")].reduce_scatter == "native"
    assert not build_cluster(load_scenario("scenarios/cpu-fsdp.yaml"))[0].streams
    assert build_cluster(load_scenario("scenarios/8xA100-llama7b-fsdp.yaml"))[0].streams
    m = {"backend": "gloo", "host_overhead_s": 1e-6, "compute_step_s": 0.1, "flops_per_step": 1e9}
    fit = FabricFit(1e-5, 1e-4, 1e-5, 1e9)
    assert device_doc("d", m, 1e9)["streams"] is False and fabric_doc("f", fit, "gloo")["reduce_scatter"] == "all_reduce"
    assert "streams" not in device_doc("d", dict(m, backend="nccl"), 1e9)
    assert "reduce_scatter" not in fabric_doc("f", fit, "nccl")


def test_cpu_fsdp_scenario_exposes_all_its_communication():
    # cpu-fsdp runs on cpu-local (no streams) over loopback (gloo): nothing overlaps, and
    # each of the 5 reduce-scatters per step moves an all-reduce's bytes
    from oresearcher.scenario import load_scenario
    from oresearcher.sim.simulate import simulate

    report, _ = simulate(load_scenario("scenarios/cpu-fsdp.yaml", ["training.steps=2"]))
    assert report["exposed_comm_time_s"] == pytest.approx(report["comm_time_s"], rel=1e-9)
    gpu, _ = simulate(load_scenario("scenarios/cpu-fsdp.yaml", ["training.steps=2", "cluster.device=A100-SXM4-80GB"]))
    assert gpu["exposed_comm_time_s"] < 0.9 * gpu["comm_time_s"]  # with streams the gathers overlap
    from oresearcher.models.sharding import scenario_plan

    sc = load_scenario("scenarios/cpu-fsdp.yaml")
    units = [4 * u.padded_numel(4) for u in scenario_plan(sc).units]  # fp32 bytes, 4 ranks
    wire = {b["name"]: b["wire_bytes"] / (4 * 2) for b in report["breakdown"]}  # per rank and step
    assert wire["fsdp_reduce_scatter"] == pytest.approx(2 * 3 / 4 * sum(units))  # ring all-reduce of each unit
    assert wire["fsdp_all_gather"] == pytest.approx(3 / 4 * (sum(units) + sum(units[1:-1])))  # + 3 re-gathers


def test_sam_copy_of_the_shard_by_hand():
    # a SAM agent saves its rank's fp32 shard before the ascent: 1e9 params / 8 ranks x 4 bytes
    m, sam = _memory(), _memory(sam=True)
    assert sam.sam_saved == 4 * GB // 8 and m.sam_saved == 0
    assert sam.total == m.total + GB // 2


def test_sharded_agents_report_the_sam_copy():
    from oresearcher.scenario import load_scenario
    from oresearcher.sim.simulate import build_cluster, memory_report

    path = "scenarios/cpu-fsdp-agents.yaml"
    sc = load_scenario(path)
    assert sc.cooperation.roles.optimizer_method == "sam" and sc.agents.roles.optimizer > 0
    device, _ = build_cluster(sc)
    with_sam = memory_report(sc, device)
    plain = memory_report(load_scenario(path, ["agents.roles={explorer: 2, optimizer: 0, validator: 0}"]), device)
    # the SAM copy is the rank's fp32 shard again: as large as its sharded parameters
    assert with_sam["total"] - plain["total"] == with_sam["sharded_params"] > 0
