"""fsdp on gloo: torch's fully_shard trains what one process trains, resumes exactly from
its DCP checkpoints, a checkpoint of 4 ranks loads on 2, and the simulator's memory per
rank is within 10% of the measured peak.

Each gloo run costs ~10 s here (rank start-up dominates): two 20-step runs (2 ranks
ZeRO-3; 4 ranks ZeRO-2 as HSDP 2 x 2), a same-size resume, a 4 -> 2 resume through the
CLI, a 4 -> 2 load-and-save that is compared tensor by tensor, a memory run and an
8-step run of sharded agents with roles (its resume only with ORESEARCHER_SLOW_TESTS=1).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import yaml
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from bk_helpers import HERE, REPO
from oresearcher.backends.checkpoint import per_rank as ckpt
from oresearcher.backends.run.launcher import launch_local
from oresearcher.models import PRESETS, build_model, lm_loss
from oresearcher.tasks.synthetic_lm import TokenStream

SCENARIO = REPO / "scenarios" / "cpu-fsdp.yaml"
RUN = [sys.executable, "-m", "oresearcher.run", "--backend=gloo", "--no-tensorboard", "--no-progress",
       "--timeout=60", "--keep_checkpoints", "0"]
STEPS = 20


def _scenario(path, count, **fsdp):
    data = yaml.safe_load(SCENARIO.read_text())
    data["agents"]["count"] = count
    data["training"] = {**data["training"], "steps": STEPS, "checkpoint_every": 10}
    data["fsdp"] = {**data["fsdp"], **fsdp}
    path.write_text(yaml.safe_dump(data))
    return path


def _run(args, env):
    p = subprocess.run([*RUN, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]


def _losses(out, world):
    rep = json.loads((out / "report.json").read_text())
    return rep, [[m["loss"] for m in rep["metrics"][str(r)]] for r in range(world)]


def reference_losses(world, steps=STEPS):
    """One process, the same model, the same per-rank batches: the loss each rank sees,
    and one AdamW step on the mean loss (= the gradient FSDP averages)."""
    data = yaml.safe_load(SCENARIO.read_text())
    w, t = data["workload"], data["training"]
    torch.manual_seed(data["seed"])
    model = build_model(w["model"], device="cpu", dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=t["lr"])
    streams = [TokenStream(PRESETS[w["model"]].vocab_size, w["global_batch"] // world, w["seq_len"], data["seed"], r)
               for r in range(world)]
    out = [[] for _ in range(world)]
    for _ in range(steps):
        opt.zero_grad()
        losses = [lm_loss(model(b[:, :-1]), b[:, 1:]) for b in (next(s) for s in streams)]
        for r, loss in enumerate(losses):
            out[r].append(loss.item())
        (sum(losses) / world).backward()
        opt.step()
    return out


def _flat(tree, prefix=""):
    if isinstance(tree, torch.Tensor):
        yield prefix, tree
    elif isinstance(tree, dict):
        for k in sorted(tree, key=str):
            yield from _flat(tree[k], f"{prefix}/{k}")


def _dcp_tensors(step_dir, tmp, folder="dcp"):
    path = tmp / f"{abs(hash(str(step_dir / folder)))}.pt"
    dcp_to_torch_save(step_dir / folder, path)
    return dict(_flat(torch.load(path, weights_only=False)))


def _assert_losses_match(out, world):
    rep, got = _losses(out, world)
    want = reference_losses(world)
    worst = max(abs(a - b) / b for g, w in zip(got, want) for a, b in zip(g, w))
    print(f"fsdp {world} ranks vs one process, {STEPS} steps: worst relative loss difference {worst:.2e}")
    assert all(len(g) == STEPS for g in got)
    assert worst < 1e-4
    assert got[0][-1] < 0.7 * got[0][0]  # it trains
    return rep


def _assert_fsdp_collectives_reported(out, scenario_path):
    """FSDP2's own collectives are in the report (backends/fsdp/comm.py): per step and rank
    gpt-tiny's 4 blocks and root are gathered for forward and blocks 0-2 again for backward
    (ZeRO-3; the last block keeps its parameters), and each of the 5 units reduce-scatters
    once; the all-gathers' wire bytes are the simulator's, by the one formula."""
    from oresearcher.scenario import load_scenario
    from oresearcher.sim.simulate import simulate

    rep = json.loads((out / "report.json").read_text())
    per = rep["steps"] * rep["world_size"]
    calls = {b["name"]: b["count"] / per for b in rep["breakdown"]}
    assert calls == {"fsdp_all_gather": 8, "fsdp_reduce_scatter": 5}, calls
    assert 0 < rep["exposed_comm_time_s"] <= rep["comm_time_s"] + 1e-9 and rep["comm_overhead"] > 0
    assert rep["compute_time_s"] + rep["exposed_comm_time_s"] <= rep["step_time_s"] * 1.01
    predicted, _ = simulate(load_scenario(scenario_path, ["training.steps=2"]))
    wire = {b["name"]: b["wire_bytes"] / (b["count"]) for b in rep["breakdown"]}
    sim_wire = {b["name"]: b["wire_bytes"] / b["count"] for b in predicted["breakdown"]}
    assert wire["fsdp_all_gather"] == pytest.approx(sim_wire["fsdp_all_gather"])


def test_two_ranks_match_one_process_and_resume_exactly(tmp_path, child_env):
    sc = _scenario(tmp_path / "s.yaml", 2)
    full, cut = tmp_path / "full", tmp_path / "cut"
    _run(["--scenario", str(sc), "--out", str(full)], child_env)
    _assert_losses_match(full, 2)
    assert ckpt.steps_held(full, 0) == [9, 19] and (ckpt.step_dir(full, 9) / "dcp" / ".metadata").is_file()
    _assert_fsdp_collectives_reported(full, sc)

    shutil.copytree(full, cut)
    shutil.rmtree(ckpt.step_dir(cut, 19))
    (cut / "report.json").unlink()
    _run(["--resume", str(cut)], child_env)
    a, b = _dcp_tensors(ckpt.step_dir(full, 19), tmp_path), _dcp_tensors(ckpt.step_dir(cut, 19), tmp_path)
    assert a.keys() == b.keys() and any("exp_avg" in k for k in a)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    rep_cut, got = _losses(cut, 2)
    assert rep_cut["start_step"] == 10
    assert got == [ls[10:] for ls in _losses(full, 2)[1]]


def test_four_ranks_hsdp_match_one_process_and_load_on_two(tmp_path, child_env):
    sc = _scenario(tmp_path / "s.yaml", 4, shard_group_size=2, reshard_after_forward=False)
    full = tmp_path / "full"
    _run(["--scenario", str(sc), "--out", str(full)], child_env)
    _assert_losses_match(full, 4)

    # 4 ranks' step-9 shards loaded by 2 ranks and saved again: the same tensors
    src, dst = ckpt.step_dir(full, 9), tmp_path / "two"
    res = launch_local([sys.executable, str(HERE / "bk_fsdp_reshard.py"), str(sc), str(src), str(dst)], 2,
                       timeout_s=60, env=child_env)
    assert res.ok, res.failure
    a, b = _dcp_tensors(src, tmp_path), _dcp_tensors(dst, tmp_path)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k

    # and the CLI resumes the 4-rank run on 2 ranks, one shard group (DCP reshards; the
    # number of ranks and the sharding layout may change on a resume)
    cut = tmp_path / "cut"
    shutil.copytree(full, cut)
    shutil.rmtree(ckpt.step_dir(cut, 19))
    (cut / "report.json").unlink()
    _run(["--resume", str(cut), "--num_agents=2", "--set", "fsdp.shard_group_size=0"], child_env)
    rep, got = _losses(cut, 2)
    assert rep["world_size"] == 2 and rep["start_step"] == 10 and len(got[0]) == STEPS - 10
    before = _losses(full, 4)[1]
    assert got[0][0] < 0.9 * before[0][0]  # it continues from the trained model, not from scratch


def test_simulated_memory_within_10_percent_of_measured_peak(tmp_path, child_env):
    """estimate_fsdp_memory against each rank's measured peak (its learner's whole life:
    built, sharded, 3 steps), ZeRO-3 and ZeRO-2, 2 ranks."""
    from oresearcher.scenario import load_scenario
    from oresearcher.sim.simulate import build_cluster, memory_report

    out = tmp_path / "peaks.json"
    res = launch_local([sys.executable, str(HERE / "bk_fsdp_memory.py"), str(SCENARIO), str(out)], 2,
                       timeout_s=120, env=child_env)
    assert res.ok, res.failure
    held = json.loads(out.read_text())
    for reshard in ("true", "false"):
        sc = load_scenario(SCENARIO, ["agents.count=2", f"fsdp.reshard_after_forward={reshard}"])
        pred = memory_report(sc, build_cluster(sc)[0])["total"]
        errors = [pred / h[reshard] - 1 for h in held]
        print(f"reshard_after_forward={reshard}: predicted {pred / 1e6:.2f} MB, measured "
              f"{[round(h[reshard] / 1e6, 2) for h in held]} MB, errors {[f'{e:+.1%}' for e in errors]}")
        assert all(abs(e) < 0.10 for e in errors)


@pytest.mark.skipif(not (torch.cuda.is_available() and torch.distributed.is_nccl_available()),
                    reason="needs a CUDA GPU and NCCL")
def test_nccl_bf16_run_on_one_gpu(tmp_path, child_env):
    sc = _scenario(tmp_path / "s.yaml", 1)
    out = tmp_path / "run"
    _run(["--backend=nccl", "--scenario", str(sc), "--out", str(out), "--set", "workload.dtype=bf16",
          "--set", "fsdp.reduce_dtype=fp32"], child_env)
    rep, got = _losses(out, 1)
    assert rep["backend"] == "nccl" and rep["device"] != "cpu" and len(got[0]) == STEPS
    assert got[0][-1] < 0.7 * got[0][0]


ROLES = {"explorer_lr_scale": 2.0, "explorer_noise": 0.01, "sam_rho": 0.05}


def _shard(model, size, s):
    """Shard s of ``size`` of every parameter, flat: FSDP2 splits dim 0 as torch.chunk does."""
    parts = [p.detach().chunk(size, dim=0) for p in model.parameters()]
    return torch.cat([c[s].reshape(-1) if s < len(c) else c[0].new_empty(0) for c in parts])


@torch.no_grad()
def _set_shard(model, size, s, flat):
    offset = 0
    for p in model.parameters():
        c = p.chunk(size, dim=0)
        if s < len(c):
            c[s].copy_(flat[offset:offset + c[s].numel()].view_as(c[s]))
            offset += c[s].numel()


def _agent_grad(model, batches, size):
    """Backward of the agent's mean loss over its ranks' batches (= what FSDP2 averages)."""
    for q in model.parameters():
        q.grad = None
    losses = [lm_loss(model(b[:, :-1]), b[:, 1:]) for b in batches]
    (sum(losses) / size).backward()
    return losses


def reference_sharded_agents(world, size, interval, steps, roles, seed_of_noise, dynamic=False):
    """world/size agents, each data parallel over its ranks' batches with its own AdamW,
    fused every ``interval`` steps by oresearcher.cooperation.fusion (attention weights from exp(-the
    agent's mean loss on the held-out batches: the token stream's numbers MAX_WORLD + s,
    s < size)), with ``roles``: the explorer at lr x 2 and, after each round, noised shard
    by shard (each shard's own generator and RMS), the optimizer by SAM over its whole
    gradient; ``dynamic``: after each round the roles move as roles.difficulty and
    roles.assign_roles say (scores exp(-held-out loss), the best held-out loss per round as
    the history, default plateau settings). Returns the per-rank training losses, each
    round's held-out loss per agent and each step's roles, which an fsdp run with
    ``fsdp.replicas: fusion`` and ``agents.roles`` must reproduce."""
    from oresearcher.cooperation.fusion import fuse, group_weights
    from oresearcher.cooperation.roles import assign_roles, difficulty, param_noise
    from oresearcher.scenario.types import MAX_WORLD

    data = yaml.safe_load(SCENARIO.read_text())
    w, t, f = data["workload"], data["training"], {"temperature": 0.1, "similarity_weight": 0.5}
    models, opts, roles, history, held_roles = [], [], list(roles), [], []
    for _ in roles:
        torch.manual_seed(data["seed"])
        models.append(build_model(w["model"], device="cpu", dtype=torch.float32))
        opts.append(torch.optim.AdamW(models[-1].parameters(), lr=t["lr"]))
    streams = [TokenStream(PRESETS[w["model"]].vocab_size, w["global_batch"] // world, w["seq_len"], data["seed"], r)
               for r in range(world)]
    heldout = [next(TokenStream(PRESETS[w["model"]].vocab_size, w["global_batch"] // world, w["seq_len"],
                                data["seed"], MAX_WORLD + s)) for s in range(size)]
    out, rounds = [[] for _ in range(world)], []
    for step in range(steps):
        held_roles.append(list(roles))
        for a, (model, opt) in enumerate(zip(models, opts)):
            for g in opt.param_groups:
                g["lr"] = t["lr"] * (ROLES["explorer_lr_scale"] if roles[a] == "explorer" else 1.0)
            ranks = range(a * size, (a + 1) * size)
            batches = [next(streams[r]) for r in ranks]
            losses = _agent_grad(model, batches, size)
            if roles[a] == "optimizer":  # SAM: ascend along g/||g||, the gradient there, step from w
                params = list(model.parameters())
                norm = torch.sqrt(sum(q.grad.double().pow(2).sum() for q in params))
                saved = [q.detach().clone() for q in params]
                with torch.no_grad():
                    for q in params:
                        q.add_(q.grad, alpha=ROLES["sam_rho"] / (float(norm) + 1e-12))
                _agent_grad(model, batches, size)
                with torch.no_grad():
                    for q, x in zip(params, saved):
                        q.copy_(x)
            opt.step()
            for r, loss in zip(ranks, losses):
                out[r].append(loss.item())
        if (step + 1) % interval == 0:
            with torch.no_grad():
                agent_loss = [sum(lm_loss(m(b[:, :-1]), b[:, 1:]).item() for b in heldout) / size for m in models]
            rounds.append(agent_loss)
            flat = torch.stack([torch.nn.utils.parameters_to_vector(m.parameters()).detach() for m in models])
            weights = group_weights(flat, torch.exp(-torch.tensor(agent_loss, dtype=torch.float64)),
                                    torch.zeros(len(models), dtype=torch.bool), **f)
            for a, m in enumerate(models):
                torch.nn.utils.vector_to_parameters(fuse(flat, weights[a]), m.parameters())
                if roles[a] == "explorer":
                    for s in range(size):
                        noisy = param_noise(_shard(m, size, s), ROLES["explorer_noise"],
                                            seed_of_noise((step + 1) // interval, a * size + s))
                        _set_shard(m, size, s, noisy)
            if dynamic:
                history.append(min(agent_loss))
                scores = torch.exp(-torch.tensor(agent_loss, dtype=torch.float64))
                none = torch.zeros(len(models), dtype=torch.bool)
                roles = assign_roles(roles, scores, none, difficulty(history, scores, none, 2, 0.01)[0], "")[0]
    return out, rounds, held_roles


def test_sharded_agents_with_roles_fuse_shard_by_shard_as_one_process_fuses_whole_models(tmp_path, child_env):
    """2 sharded agents x 2 ranks, an explorer and a SAM optimizer; with
    ORESEARCHER_SLOW_TESTS=1 also an exact resume from their per-agent DCP folders."""
    from oresearcher.cooperation.sharded_roles import noise_generator

    world, size, interval, steps = 4, 2, 3, 8
    data = yaml.safe_load(SCENARIO.read_text())
    data["agents"] = {**data["agents"], "roles": {"explorer": 1, "optimizer": 1, "validator": 0}}
    data["training"] = {**data["training"], "steps": steps, "checkpoint_every": 4}
    data["fsdp"] = {**data["fsdp"], "shard_group_size": size, "replicas": "fusion"}
    data["communication"] = {**data.get("communication", {}), "interval": interval}
    data["cooperation"] = {"fusion": {"method": "attention", "temperature": 0.1, "similarity_weight": 0.5},
                           "roles": {"policy": "dynamic", "optimizer_method": "sam", **ROLES}}
    sc = tmp_path / "s.yaml"
    sc.write_text(yaml.safe_dump(data))
    out = tmp_path / "run"
    _run(["--scenario", str(sc), "--out", str(out)], child_env)
    rep, got = _losses(out, world)
    want, rounds, roles = reference_sharded_agents(world, size, interval, steps, ["explorer", "optimizer"],
                                                   lambda rnd, rank: noise_generator(data["seed"], rnd, rank),
                                                   dynamic=True)
    codes = {"explorer": 0.0, "optimizer": 1.0, "validator": 2.0}  # roles.ROLE_CODES
    for r in range(world):
        assert [m["role"] for m in rep["metrics"][str(r)]] == [codes[ro[r // size]] for ro in roles]
    assert len({tuple(ro) for ro in roles}) > 1  # the roles did switch
    worst = max(abs(a - b) / b for g, w in zip(got, want) for a, b in zip(g, w))
    # each rank's held-out loss on its own batch, averaged over the agent's ranks = the reference's
    for k, step in enumerate(range(interval - 1, steps, interval)):
        for a in range(world // size):
            mine = [rep["metrics"][str(r)][step]["heldout_loss"] for r in range(a * size, (a + 1) * size)]
            assert sum(mine) / size == pytest.approx(rounds[k][a], rel=1e-5)
    print(f"2 sharded agents x 2 ranks (explorer, SAM optimizer), fused every {interval} steps: "
          f"worst relative loss difference {worst:.2e}")
    assert worst < 1e-4
    assert got[0][interval] != got[2][interval]  # the agents stay distinct (attention, not averaging)
    for r in range(world):  # an optimizer's second pass (at w + e) is reported, and only its
        assert [("sam_loss" in m) for m in rep["metrics"][str(r)]] == [ro[r // size] == "optimizer" for ro in roles]
    if os.environ.get("ORESEARCHER_SLOW_TESTS") != "1":
        return  # one more gloo run (~15 s): the same worker path as the exact resume above

    # each agent checkpoints its own DCP folder; a resume from step 3 (mid-period) is exact:
    # the roles keep no state (the explorer's noise is seeded by round and rank)
    cut = tmp_path / "cut"
    shutil.copytree(out, cut)
    shutil.rmtree(ckpt.step_dir(cut, 7))
    (cut / "report.json").unlink()
    _run(["--resume", str(cut)], child_env)
    for agent in (0, 1):
        a, b = (_dcp_tensors(ckpt.step_dir(d, 7), tmp_path, f"dcp-agent{agent}") for d in (out, cut))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _losses(cut, world)[1] == [ls[4:] for ls in got]
