"""The simulator's shortcuts (sim/symmetry.py) change how a run is computed, never what
it reports: every shipped scenario, and the symmetric cases on purpose, give the same
report.json byte for byte with and without them (``--exact``)."""
import json
from pathlib import Path

import pytest

from oresearcher import ops as O
from oresearcher.reporting.report import _clean
from oresearcher.scenario import load_scenario
from oresearcher.sim.engine import Engine
from oresearcher.sim.simulate import build_cluster, resolve_mode, simulate
from oresearcher.sim.symmetry import SymmetryBroken, symmetry_classes
from simkit import DEVICE, meta, topo

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))


def _bytes(report: dict) -> str:
    """report.json's text without the engine section (which says how it was computed)."""
    return json.dumps(_clean({k: v for k, v in report.items() if k != "engine"}), indent=1, sort_keys=True)


def _both(path, sets):
    fast, _ = simulate(load_scenario(path, sets), keep_spans=0)
    if fast["engine"]["symmetry"] == "per-rank":
        return fast, None  # no shortcut taken: the exact run is this one
    exact, _ = simulate(load_scenario(path, sets), keep_spans=0, exact=True)
    assert exact["engine"] == {**exact["engine"], "symmetry": "per-rank", "why": "--exact"}
    return fast, exact


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_every_scenario_same_report_with_and_without_shortcuts(path):
    sc = load_scenario(path, ["training.steps=2"])
    device, _ = build_cluster(sc)
    classes, why = symmetry_classes(sc, resolve_mode(sc), device, sc.faults.active or sc.faults.price_checkpoints)
    if classes is None:  # the default run is the exact run: one process per rank
        assert why and "--exact" not in why
        return
    fast, exact = _both(path, ["training.steps=2"])
    assert _bytes(fast) == _bytes(exact)
    assert fast["engine"]["processes"] == len(classes) < exact["engine"]["processes"]


@pytest.mark.parametrize("sets", [
    ["training.strategy=ddp"],
    ["training.strategy=ddp", "communication.overlap=false", "communication.algorithm=tree"],
    ["training.strategy=ddp", "communication.algorithm=direct", "communication.bucket_size_MB=100"],
    ["training.strategy=local_sgd", "training.local_steps=2"],
    ["training.strategy=diloco", "training.local_steps=2"],
    ["training.strategy=single"],
], ids=lambda s: " ".join(x.split(".")[-1] for x in s))
def test_symmetric_runs_match_exact_runs(sets):
    fast, exact = _both(ROOT / "scenarios/2x8xA100.yaml", ["training.steps=4", *sets])
    assert fast["engine"]["processes"] == 1 and exact["engine"]["processes"] == 16
    assert fast["ops_interpreted"] == exact["ops_interpreted"] == 16 * fast["engine"]["ops_run"]
    assert _bytes(fast) == _bytes(exact)


def test_numeric_mode_runs_every_rank():
    r, _ = simulate(load_scenario(ROOT / "scenarios/cpu-tiny.yaml", ["training.steps=1", "simulation.mode=numeric"]))
    assert r["engine"]["symmetry"] == "per-rank" and "numeric" in r["engine"]["why"]


@pytest.mark.parametrize("sets,mode,jitter,faults,needle", [
    ([], "shape", 0.0, None, None),
    ([], "numeric", 0.0, None, "numeric"),
    (["training.strategy=fsdp"], "shape", 0.0, None, "fsdp"),
    (["training.strategy=oresearcher"], "shape", 0.0, None, "oresearcher"),
    (["communication.codec=int8"], "shape", 0.0, None, "codec"),
    ([], "shape", 0.05, None, "jitter"),
    ([], "shape", 0.0, object(), "faults"),
])
def test_what_tells_ranks_apart(sets, mode, jitter, faults, needle):
    from types import SimpleNamespace

    sc = load_scenario(ROOT / "scenarios/2x8xA100.yaml", ["training.steps=1", *sets])
    classes, why = symmetry_classes(sc, mode, SimpleNamespace(compute_jitter_cv=jitter), faults)
    if needle is None:
        assert classes == [tuple(range(16))]
    else:
        assert classes is None and needle in why


def _subgroup_program(rank):
    yield O.AllReduce(meta(1 << 20), group=(0, 1))  # ranks 2, 3 of the class are not in it
    yield O.StepDone(0)


def test_a_class_that_splits_across_groups_is_caught():
    eng = Engine(topo(4), DEVICE, "fp32", "ring")
    with pytest.raises(SymmetryBroken, match="class of 4"):
        eng.run([_subgroup_program(0)], classes=[(0, 1, 2, 3)])


def _p2p_program(rank):
    yield O.Send(meta(1024), dst=1)
    yield O.StepDone(0)


def test_point_to_point_breaks_symmetry():
    eng = Engine(topo(2), DEVICE, "fp32", "ring")
    with pytest.raises(SymmetryBroken, match="SendRecv"):
        eng.run([_p2p_program(0)], classes=[(0, 1)])


def test_symmetric_trace_and_figure_draw_one_lane_per_class(tmp_path, capsys):
    from oresearcher.errors import cli_main
    from oresearcher.sim.__main__ import main

    assert cli_main(main, ["scenarios/2x8xA100.yaml", "--set", "training.steps=2", "--out", str(tmp_path)]) == 0
    assert "engine: one process per class (1 for 16 ranks)" in capsys.readouterr().out
    trace = json.loads((tmp_path / "trace.json").read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert names == {f"ranks 0-15 (16, one class) {c}" for c in ("compute", "blocked", "comm", "peer_wait")}
    assert (tmp_path / "timeline.png").stat().st_size > 1000
