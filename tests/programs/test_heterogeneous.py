"""Heterogeneous agents (scenarios/digits-hetero.yaml: two Transformers, an LSTM, an MLP).

Gradient sharing and parameter fusion stay inside an architecture group -- the
simulator's and the reference interpreter's group is the op's ``group=``, the real
backend's a process subgroup of the same ranks -- and a gloo run reproduces the
reference interpreter, distils one student over the 4 ranks and exports it.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from oresearcher import ops as O
from oresearcher.export import load_model
from oresearcher.programs import AgentContext, get_program
from oresearcher.scenario import load_scenario
from oresearcher.tasks import make_learner
from oresearcher.tasks.digits import load_splits
from oresearcher.testing import run_programs, tap

ROOT = Path(__file__).resolve().parents[2]
HETERO = ROOT / "scenarios" / "digits-hetero.yaml"
SMALL = ["training.steps=12", "communication.interval=6"]
NO_DISTILL = ["distill.student=null"]


def _run(sc, wrap=None):
    n = sc.world_size
    learners = [make_learner(sc, r, mode="numeric") for r in range(n)]
    prog = get_program(sc.training.strategy)
    gens = [prog(AgentContext(r, n, sc, mode="numeric"), l) for r, l in enumerate(learners)]
    if wrap:
        gens = [wrap(r, g) for r, g in enumerate(gens)]
    return run_programs(gens), learners


def test_sharing_and_fusion_stay_inside_architecture_groups():
    sc = load_scenario(HETERO, SMALL + NO_DISTILL)
    seen = []

    def wrap(rank, gen):
        return (yield from tap(gen, lambda op: seen.append((rank, op)) if isinstance(op, O.Collective) else None))

    steps, learners = _run(sc, wrap)
    assert [l.arch for l in learners] == ["transformer", "transformer", "lstm", "mlp"]
    assert len({l.numel for l in learners}) == 3
    shares = [(r, op.group) for r, op in seen if op.name == "grad_share"]
    assert shares and {r for r, _ in shares} == {0, 1}  # the LSTM and the MLP have nobody to share with
    assert all(tuple(g) == (0, 1) for _, g in shares)
    rounds = [[s.metrics for s in per if "reward" in s.metrics] for per in steps]
    for r in (2, 3):  # a group of one fuses with nobody and copies nobody (PBT stays in the group)
        assert all(m["fusion_self_weight"] == 1.0 and "exploit_from" not in m for m in rounds[r])
    for r in (0, 1):
        assert all(m.get("exploit_from", r ^ 1) == r ^ 1 for m in rounds[r])
    assert all(0.0 <= per[-1].metrics["test_accuracy"] <= 1.0 for per in steps)


def test_gloo_heterogeneous_distils_and_exports(tmp_path):
    """One gloo run: architecture subgroups, the trained ensemble, distillation (the data
    split over 4 ranks) and --export; it reproduces the reference interpreter."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    small = SMALL + ["distill.steps=20", "cooperation.ensemble.epochs=5"]
    cmd = [sys.executable, "-m", "oresearcher.run", "--backend=gloo", "--scenario", str(HETERO), "--steps=12",
           "--communication_interval=6", "--set", "distill.steps=20", "--set", "cooperation.ensemble.epochs=5",
           "--out", str(tmp_path / "run"), "--export", str(tmp_path / "model"), "--no-tensorboard",
           "--no-progress", "--timeout=60"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "student mlp (distilled)" in proc.stdout and "alone, same compute" in proc.stdout
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    names = {b["name"] for b in report["breakdown"]}
    assert {"grad_share", "ensemble_broadcast", "distill_grad"} <= names  # subgroup sharing really happened
    ref, learners = _run(load_scenario(HETERO, small))
    training = [[m for m in report["metrics"][str(r)] if "phase_distill" not in m] for r in range(4)]
    for r in range(4):
        # two-member sums are exact in any order: gloo reproduces the reference up to rounding
        want = [s.metrics for s in ref[r] if "phase_distill" not in s.metrics][-1]
        assert training[r][-1]["role"] == want["role"]
        assert training[r][-1]["test_accuracy"] == pytest.approx(want["test_accuracy"], abs=0.02)
    section = report["distill"]
    ref_m = ref[0][-1].metrics
    for k in ("student_test_accuracy", "ensemble_test_accuracy", "best_agent_test_accuracy"):
        assert section[k] == pytest.approx(ref_m[k], abs=0.03), k
    assert section["alone_steps"] >= 1 and 0 <= section["alone_test_accuracy"] <= 1
    assert 0 <= section["alone_same_steps_test_accuracy"] <= 1
    # the export: loads with the one function, and reproduces the student's figure exactly
    model, meta = load_model(tmp_path / "model")
    X, y = load_splits()["test"]
    with torch.no_grad():
        acc = float((model(X).argmax(-1) == y).float().mean())
    assert acc == section["student_test_accuracy"] and meta["architecture"] == "mlp"
