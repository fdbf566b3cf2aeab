"""Roles of sharded agents (oresearcher.cooperation.sharded_roles): what loads and what is
refused (one line, exit 2), SAM on shards against the unsharded SAM step, and the
simulator's price of a SAM agent's step (two passes), by hand on the golden fabric.
The gloo run against a one-process reference is in tests/backends/test_bk_fsdp.py."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oresearcher import ops as O
from oresearcher.cooperation import roles as R
from oresearcher.cooperation.sharded_roles import OnBatch, RoleStep, agent_roles, noise_generator
from oresearcher.errors import UserError, cli_main
from oresearcher.programs.fsdp import FusionRound, Schedule
from oresearcher.models.learner import TorchLearner
from oresearcher.scenario import load_scenario
from oresearcher.models.sharding import ShardPlan, Unit, shard_groups
from oresearcher.sim.__main__ import main as sim_main
from oresearcher.sim.engine import Engine
from oresearcher.testing import run_programs
from simkit import DEVICE, topo  # tests/sim is on the pytest pythonpath

CPU = "scenarios/cpu-fsdp.yaml"
AGENTS = ["fsdp.shard_group_size=2", "fsdp.replicas=fusion", "cooperation.roles.policy=static"]
MIX = "agents.roles={explorer: 1, optimizer: 1, validator: 0}"


def test_the_mix_counts_sharded_agents_in_order():
    sc = load_scenario(CPU, [*AGENTS, MIX])
    assert agent_roles(sc) == ["explorer", "optimizer"]
    assert agent_roles(load_scenario(CPU, AGENTS)) is None  # no mix: every agent trains plainly
    assert agent_roles(load_scenario(CPU, [*AGENTS, MIX, "cooperation.roles.policy=plain"])) is None


@settings(max_examples=25, deadline=None)
@given(size=st.sampled_from([1, 2]), e=st.integers(0, 4), o=st.integers(0, 4), v=st.integers(0, 4))
def test_a_mix_loads_exactly_when_it_adds_up_to_the_shard_groups(size, e, o, v):
    over = [f"fsdp.shard_group_size={size}", "fsdp.replicas=fusion", "cooperation.roles.policy=static",
            f"agents.roles={{explorer: {e}, optimizer: {o}, validator: {v}}}"]
    if e + o + v == 4 // size:
        assert len(agent_roles(load_scenario(CPU, over))) == 4 // size
    else:
        with pytest.raises(UserError, match=f"agents.roles add up to {e + o + v}; there are {4 // size} sharded"):
            load_scenario(CPU, over)


@pytest.mark.parametrize("override,words", [
    (["fsdp.replicas=allreduce"], "needs sharded agents (fsdp.replicas: fusion)"),
    (["cooperation.roles.optimizer_method=swa"], "sharded optimizers take SAM steps"),
    (["agents.roles={explorer: 2}", "cooperation.roles.policy=dynamic", "cooperation.roles.optimizer_method=swa"],
     "sharded optimizers take SAM steps"),  # dynamic roles may make optimizers
    (["cooperation.fusion.outer=nesterov"], "cooperation.fusion.outer is not built for sharded agents"),
])
def test_what_sharded_roles_do_not_run_is_refused_in_one_line(override, words, tmp_path, capsys):
    code = cli_main(sim_main, [CPU, "--out", str(tmp_path / "o"), *sum((["--set", x] for x in
                                                                         [*AGENTS, MIX, *override]), [])])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and words in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


class Spec:
    explorer_lr_scale, explorer_noise, optimizer_method, sam_rho = 2.0, 0.01, "sam", 0.05


def _learner(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    g = torch.Generator().manual_seed(seed + 1)
    data = [(torch.randn(8, 6, generator=g), torch.randint(3, (8,), generator=g)) for _ in range(3)]

    def loss_fn(m, batch):
        return torch.nn.functional.cross_entropy(m(batch[0]), batch[1])
    return TorchLearner(model, torch.optim.SGD(model.parameters(), lr=0.1), iter(data), loss_fn,
                        fwd_flops=1.0, bwd_flops=2.0)


def test_sam_on_a_shard_group_of_one_is_the_unsharded_sam_step():
    """RoleStep's ops (norm, ascend, second pass, restore) on one rank leave the gradient
    and parameters roles.sam_forward_backward leaves (that one sums the norm in fp32)."""
    mine, ref = _learner(), _learner()
    step = RoleStep("optimizer", 0, (0,), Spec, seed=0)
    got = {}

    def prog():
        fixed = OnBatch(mine, (yield O.Compute(next, mine.batches)))  # both passes on one batch

        def one_pass():
            return (yield O.Compute(fixed.forward_backward))
        got["m"] = yield from step.train(one_pass, mine.numel, mine)
        yield O.StepDone(0)

    run_programs([prog()])
    want = R.sam_forward_backward(ref, Spec.sam_rho)
    assert got["m"]["loss"] == pytest.approx(want["loss"]) and got["m"]["sam_loss"] == pytest.approx(want["sam_loss"])
    for p, q in zip(mine.params, ref.params):
        torch.testing.assert_close(p, q, rtol=0, atol=0)  # w restored exactly
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7)  # the gradient at w + e


def test_explorer_noise_is_drawn_per_round_and_rank_and_only_explorers_draw():
    flat = torch.linspace(-1, 1, 50)

    def after(role, rnd, rank):
        out = {}

        def prog():
            out["x"] = yield from RoleStep(role, rank, (rank,), Spec, seed=7).after_fusion(flat, rnd)
            yield O.StepDone(0)
        run_programs([prog()])
        return out["x"]

    torch.testing.assert_close(after("explorer", 2, 1), R.param_noise(flat, 0.01, noise_generator(7, 2, 1)))
    assert not torch.equal(after("explorer", 2, 1), after("explorer", 2, 0))
    assert not torch.equal(after("explorer", 2, 1), after("explorer", 3, 1))
    assert torch.equal(after("optimizer", 2, 1), flat) and torch.equal(after("validator", 2, 1), flat)


# ---- the simulator's price, by hand (golden fabric and device of tests/sim/simkit.py) -------

BLOCK = 2 * 10**7  # fp32 elements per block
STEP = 60.816e-3  # one step of two such blocks on 2 ranks with streams (tests/sim/test_fsdp.py)


def _simulate(roles):
    block = Unit("block", ((BLOCK,),), 10e9, 20e9)
    plan = ShardPlan(Unit("root", (), 0.0, 0.0), (block, block))

    class Fusion:
        method, temperature, similarity_weight = "attention", 0.1, 0.5

    def prog(rank):
        shard, _ = shard_groups(rank, 4, 2)
        sched = Schedule(plan, shard, (rank,), True, torch.float32, torch.float32)
        fusion = FusionRound(rank, 4, 2, 1, Fusion)
        role = None if roles is None else RoleStep(roles[rank // 2], rank, shard, Spec, seed=0)
        numel = sched.local_shard().numel()
        if role is None:
            yield from sched.step()
        else:
            yield from role.train(sched.step, numel)
        fused = yield from fusion.run(sched.local_shard(), None)
        if role is not None:
            yield from role.after_fusion(fused, 1)
        yield O.StepDone(0)
    return Engine(topo(4), DEVICE, "fp32", "ring").run([prog(r) for r in range(4)])


def test_a_sam_agent_step_is_two_passes_and_the_other_agent_waits_at_the_round():
    # Without roles a step is one pass and a fusion round F, nobody waiting. The SAM agent
    # adds a second pass (60.816 ms), the all-reduce of its squared gradient norm (8 B on
    # 2 ranks: 2 + 5 us, 2 hops of 1 us, 8 B at 100 GB/s) and the ascent w + s g (2 FLOPs
    # on each of its 2e7 local parameters: 40 us at 1 TFLOP/s); the explorer agent waits
    # for it in the round, then adds its noise (2 FLOPs a parameter: 40 us).
    plain, roles = _simulate(None), _simulate(["explorer", "optimizer"])
    end = {r: roles.step_ends[r][0] for r in range(4)}
    assert plain.step_ends[0][0] == plain.step_ends[2][0]
    for r in (2, 3):
        assert end[r] == pytest.approx(plain.step_ends[r][0] + STEP + 9e-6 + 8e-11 + 40e-6, rel=1e-9)
    for r in (0, 1):
        assert end[r] == pytest.approx(end[2] + 40e-6, rel=1e-9)
    assert roles.collectives["sam_grad_norm"][0] == 2


def test_the_simulator_prices_the_roles_of_a_scenario():
    from oresearcher.sim.simulate import simulate

    over = ["training.steps=4", "communication.interval=2", *AGENTS]
    plain, _ = simulate(load_scenario(CPU, over))
    roles, _ = simulate(load_scenario(CPU, [*over, MIX]))
    count = [{b["name"]: b["count"] for b in r["breakdown"]} for r in (plain, roles)]
    # llama-tiny: 5 units (root + 4 blocks). A ZeRO-3 pass on CPU ranks gathers 5 units in
    # forward and re-gathers 3 blocks in backward (the last stays gathered), reduce-scatters
    # 5; each of the 2 rounds first gathers the 5 units for the held-out forward. Plain:
    # 4 ranks x (4 steps x 8 + 2 x 5) = 168 gathers, 4 x 4 x 5 = 80 reduce-scatters. The
    # SAM agent's 2 ranks make two passes a step: 2 x (4 x 16 + 10) + 2 x 42 = 232, and
    # 2 x 40 + 2 x 20 = 120; its norm all-reduce runs 4 times on each of its 2 ranks.
    assert (count[0]["fsdp_all_gather"], count[0]["fsdp_reduce_scatter"]) == (168, 80)
    assert (count[1]["fsdp_all_gather"], count[1]["fsdp_reduce_scatter"]) == (232, 120)
    assert "sam_grad_norm" not in count[0] and count[1]["sam_grad_norm"] == 2 * 4
    assert roles["compute_time_s"] > 1.3 * plain["compute_time_s"]


def test_the_fusion_round_charges_its_distances_and_weighted_sum():
    # 2 agents, shards of p = 2e7 fp32 elements: the Gram matrix 2 n^2 p = 1.6e8 FLOPs and
    # the weighted sum 2 n p = 8e7 FLOPs, 240 us on the 1 TFLOP/s golden device
    from oresearcher.cooperation.sharded_fusion import fuse_sharded

    p = 2 * 10**7

    def prog(rank, charge):
        shard, replicate = shard_groups(rank, 2, 1)
        if charge:
            yield from fuse_sharded(torch.empty(p, device="meta"), rank, None, None, shard_group=shard,
                                    replicate_group=replicate)
        else:  # the same collectives alone
            yield O.AllGather(torch.empty(p, device="meta"), group=replicate, name="fusion_shard_gather")
        yield O.StepDone(0)
    with_compute, alone = (Engine(topo(2), DEVICE, "fp32", "ring").run([prog(r, c) for r in range(2)])
                           for c in (True, False))
    assert with_compute.step_ends[0][0] == pytest.approx(alone.step_ends[0][0] + 240e-6, rel=1e-9)


@pytest.mark.parametrize("streams,want", [(False, 8e-6 + 2 * (408e-6 + 10e-3)), (True, 408e-6 + 20e-3)])
def test_the_heldout_forward_by_hand(streams, want):
    # two 80 MB blocks on 2 ranks: without streams each gather (root 0 B: 8 us; a block:
    # 8 + 400 us) is waited for before its 10 ms forward; with streams the root's and block
    # 1's gathers run together (408 us, as in tests/sim/test_fsdp.py) and block 2's hides
    # under block 1's forward (Schedule.forward, FSDP2's prefetch)
    from oresearcher.cooperation.sharded_validation import eval_forward

    block = Unit("block", ((BLOCK,),), 10e9, 20e9)
    plan = ShardPlan(Unit("root", (), 0.0, 0.0), (block, block))

    def prog(rank):
        shard, _ = shard_groups(rank, 2, 2)
        yield from eval_forward(Schedule(plan, shard, (rank,), True, torch.float32, torch.float32, streams))
        yield O.StepDone(0)
    tl = Engine(topo(2), DEVICE, "fp32", "ring").run([prog(r) for r in range(2)])
    assert tl.step_ends[0][0] == pytest.approx(want, rel=1e-9)


def test_heldout_batches_are_one_fixed_set_apart_from_every_training_stream():
    from oresearcher.cooperation.sharded_validation import heldout_batch
    from oresearcher.tasks.synthetic_lm import TokenStream

    sc = load_scenario("scenarios/cpu-fsdp-agents.yaml")
    held = [heldout_batch(sc, s) for s in range(2)]
    assert torch.equal(held[0], heldout_batch(sc, 0))  # the same set at every round (no state)
    assert not torch.equal(held[0], held[1])  # disjoint streams for an agent's ranks
    w = sc.workload
    for rank in range(sc.world_size):  # no training rank sees them
        train = TokenStream(256, held[0].shape[0], w.seq_len, sc.seed, rank)
        assert all(not torch.equal(next(train), h) for _ in range(3) for h in held)
    assert held[0].shape == (2, w.seq_len + 1) and int(held[0].max()) < 256


def test_dynamic_roles_move_by_difficulty_and_keep_a_validator():
    # held-out losses 5 and 3: no plateau yet (one round of history), scores exp(-5) and
    # exp(-3), spread std/mean = 0.761, difficulty 0.38: of the one agent left after the
    # validator assign_roles keeps, round(0.38) = 0 explore, so the better one optimizes
    from oresearcher.cooperation.sharded_roles import RoleState, switch_roles

    class Dyn(Spec):
        policy, plateau_rounds, plateau_tol = "dynamic", 2, 0.01

    state = RoleState(["explorer", "optimizer"])
    switches = switch_roles(state, torch.tensor([5.0, 3.0]), Dyn, 1)
    assert state.roles == ["validator", "optimizer"] and state.history == [3.0]
    assert [(s.rank, s.old, s.new) for s in switches] == [(0, "explorer", "validator")]
    assert "difficulty 0.38" in switches[0].reason
    # a non-finite loss is excluded: it ranks last and stays out of the history
    state = RoleState(["explorer", "optimizer", "validator"])
    switch_roles(state, torch.tensor([float("nan"), 3.0, 4.0]), Dyn, 1)
    assert state.history == [3.0] and state.roles[1] == "optimizer" and state.roles[2] == "validator"
    restored = RoleState([])
    restored.load_state_dict(state.state_dict())
    assert restored == state
    step = RoleStep(None, 2, (2, 3), Dyn, 0, state=RoleState(["explorer", "optimizer"]), agent=1)
    assert step.sam and step.code == 1.0
    step.switch(None, 1)  # shape mode: no losses, the roles stay
    assert step.role == "optimizer"
