"""The ablation (oresearcher.experiments.ablation): every variant is a valid scenario that
changes what it says, the verdicts and the table by hand; its command line,
benchmarks/bench_ablation.py, refuses bad arguments in one line."""
import subprocess
import sys
from pathlib import Path

import pytest

from oresearcher.experiments import ablation as A
from oresearcher.experiments import methods as M


def _bench(*argv):
    return subprocess.run([sys.executable, "benchmarks/bench_ablation.py", *argv], capture_output=True, text=True)


@pytest.mark.parametrize("task", ["digits", "finance", "synthetic-lm", "text"])
def test_every_variant_loads_and_changes_its_mechanism(task):
    full = M.scenario(task, "oresearcher", 100, 1.0, "quick")
    for v in A.variants_for(task):
        sc = A.variant_scenario(task, v, 100, 1.0, "quick")
        assert (sc == full) == (v == "full"), v  # each variant is another scenario; the full one is the default
    assert ("+ fresh student" in A.variants_for(task)) == ("+ distillation" in A.variants_for(task)) == (task == "digits")
    assert ("+ agreement term" in A.variants_for(task)) == ("+ diversity term" in A.variants_for(task)) \
        == (task == "digits")


def test_peer_term_rows_only_where_a_learner_takes_a_peer_term():
    """A task whose learner has no set_peer_term ignores cooperation.rewards.peer_term: no row for it."""
    tasks = Path(__file__).resolve().parents[2] / "oresearcher" / "tasks"
    for task in M.TASKS:
        files = [*tasks.glob(task.replace("-", "_") + "*.py"), *(tasks / task).glob("*.py")]  # a module or a folder
        source = "".join(f.read_text() for f in files)
        assert source, task
        assert ("def set_peer_term" in source) == (task in A.PEER_TERM), task
    assert _bench("--variants", "no such thing").returncode == 2


def test_pbt_off_really_turns_every_piece_off():
    c = M.scenario("digits", "oresearcher", 100, 1.0, "quick").cooperation.roles
    assert c.lr_range[1] / c.lr_range[0] >= 10  # the default population spans at least 10x in lr
    r = A.variant_scenario("digits", "no PBT", 100, 1.0, "quick").cooperation.roles
    assert r.lr_range == (1.0, 1.0) and r.knob_range == (1.0, 1.0) and r.exploit_fraction == 0 and r.perturb_factor == 1


def _runs(xs):
    return [{"model": x, "flops": 100.0} for x in xs]


def test_verdicts_and_table_by_hand():
    full, better, worse = [0.5, 0.6, 0.7], [0.6, 0.7, 0.8], [0.4, 0.5, 0.55]
    d = A.paired_diff(_runs(better), _runs(full))
    assert d[0] == pytest.approx(0.1) and A.verdict_word(d) == "variant better"
    assert A.verdict_word(A.paired_diff(_runs(worse), _runs(full))) == "full better"
    assert A.verdict_word((0.0, -0.1, 0.1)) == "tie" and A.verdict_word(None) == "n/a"
    res = {"target_flops": 100.0, "steps": {"full": None, "no PBT": 31},
           "runs": {1.0: {"full": _runs(full), "no PBT": _runs(better)}}}
    lines = []
    A.table("digits", res, [100, 101, 102], out=lines.append)
    row = next(x for x in lines if x.startswith("| no PBT"))
    assert "0.700; +0.100 [+0.100, +0.100] variant better" in row and "x1.00 (31 steps)" in row
    assert any(x.startswith("| full |") and "0.600" in x for x in lines)


def test_bad_arguments_are_one_line():
    runs = [_bench("--tasks", "nope"), _bench("--lrs", "0.1,10"), _bench("--table", "/nonexistent.json")]
    assert [p.returncode for p in runs] == [2, 2, 2]
    err = "".join(p.stderr for p in runs)
    assert err.count("\n") == 3 and "bench_ablation:" in err


def test_a_variant_that_runs_the_full_methods_runs_is_same_not_tie():
    """A setting that changes nothing on a task (identical metrics, FLOPs and curve on every
    seed) is "same" in the summary, not a tie; one differing curve makes it a tie again."""
    from oresearcher.experiments.ablation import cell

    full = [{"model": 0.7, "agents": 0.6, "flops": 1e9, "curve": [[0.1, 0.7]]} for _ in range(3)]
    assert cell("lean validators", [dict(r) for r in full], full) == "same"
    moved = [dict(r) for r in full]
    moved[1] = dict(moved[1], curve=[[0.2, 0.7]])
    assert cell("lean validators", moved, full) == "tie"
