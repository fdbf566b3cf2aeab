"""The deployed model of a cooperative run without a student (oresearcher.cooperation.deploy):
the fused model per architecture, exported and loaded back through oresearcher.export with
the same predictions; ``run --export`` refuses what it cannot save in one line."""
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

from oresearcher.cooperation import deploy
from oresearcher.errors import cli_main
from oresearcher.export import load_model, main as export_main
from oresearcher.programs import AgentContext, get_program
from oresearcher.scenario import load_scenario
from oresearcher.tasks import make_learner
from oresearcher.tasks.digits import build_model
from oresearcher.testing import run_programs

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
DIGITS4 = SCENARIOS / "digits-4.yaml"
TINY = ["training.steps=4", "communication.interval=2"]


def _cooperate(path, overrides):
    sc = load_scenario(path, overrides)
    learners = [make_learner(sc, r, mode="numeric") for r in range(sc.world_size)]
    prog = get_program(sc.training.strategy)
    run_programs([prog(AgentContext(r, sc.world_size, sc, mode="numeric"), lr) for r, lr in enumerate(learners)])
    return sc, learners


def _flat(module):
    return torch.nn.utils.parameters_to_vector(module.parameters())


def test_the_export_without_a_student_is_the_fused_model_and_predicts_like_it(tmp_path, capsys):
    sc, learners = _cooperate(DIGITS4, TINY)
    res = learners[0].cooperative_result
    fused = deploy.fused_modules(sc, res)["mlp"]
    healthy = [lr.flat_params().double() for lr, x in zip(learners, res["excluded"]) if not x]
    assert torch.allclose(_flat(fused).double(), torch.stack(healthy).mean(0), atol=1e-6)
    (out,) = deploy.export_fused(sc, res, tmp_path / "model", {"mlp": {"test_accuracy": 0.5}})
    assert out == tmp_path / "model"  # one architecture: the directory itself
    loaded, meta = load_model(out)
    X, _ = learners[0].task_data("test")
    with torch.no_grad():
        assert torch.equal(loaded(X), fused(X))  # bit for bit
    assert meta["architecture"] == "mlp" and meta["n_classes"] == 10 and meta["preprocessing"]["shape"] == [64]
    assert export_main([str(out)]) == 0 and "test accuracy 0.5000" in capsys.readouterr().out


@settings(max_examples=25, deadline=None)
@given(st.lists(st.booleans(), min_size=3, max_size=3), st.integers(0, 2**31 - 1))
def test_the_fused_model_is_the_mean_of_the_healthy_agents_of_its_architecture(excluded, seed):
    """Three mlp agents and one cnn, any of the mlp agents excluded: the mlp model holds the
    mean of the included ones (none: no mlp model); the cnn model is the cnn agent."""
    sc = load_scenario(DIGITS4, ["agents.architectures=[mlp, mlp, mlp, cnn]"])
    g = torch.Generator().manual_seed(seed)
    sizes = {a: _flat(build_model(a)).numel() for a in ("mlp", "cnn")}
    pad = max(sizes.values())
    flats = [torch.randn(pad, generator=g) for _ in range(4)]
    res = {"ids": ["mlp", "mlp", "mlp", "cnn"], "excluded": [*excluded, False], "flats": flats}
    modules = deploy.fused_modules(sc, res)
    kept = [f[:sizes["mlp"]].double() for f, x in zip(flats, excluded) if not x]
    if kept:
        assert torch.allclose(_flat(modules["mlp"]).double(), torch.stack(kept).mean(0), atol=1e-6)
    else:
        assert "mlp" not in modules
    assert torch.equal(_flat(modules["cnn"]), flats[3][:sizes["cnn"]])


def test_a_heterogeneous_export_writes_one_loadable_model_per_architecture(tmp_path, capsys):
    sc = load_scenario(DIGITS4, ["agents.architectures=[mlp, mlp, cnn, cnn]"])
    g = torch.Generator().manual_seed(0)
    pad = max(_flat(build_model(a)).numel() for a in ("mlp", "cnn"))
    res = {"ids": ["mlp", "mlp", "cnn", "cnn"], "excluded": [False] * 4,
           "flats": [torch.randn(pad, generator=g) * 0.1 for _ in range(4)]}
    dirs = deploy.export_fused(sc, res, tmp_path / "m")
    assert dirs == [tmp_path / "m" / "mlp", tmp_path / "m" / "cnn"]
    modules, X = deploy.fused_modules(sc, res), torch.rand(5, 64)
    for d in dirs:
        loaded, meta = load_model(d)
        with torch.no_grad():
            assert torch.equal(loaded(X), modules[meta["architecture"]](X))
    assert export_main([str(tmp_path / "m")]) == 0
    assert capsys.readouterr().out.count("weights verified") == 2
    assert cli_main(export_main, [str(tmp_path / "m")]) == 0
    from oresearcher.errors import UserError

    with pytest.raises(UserError, match="one model per architecture"):
        load_model(tmp_path / "m")


@pytest.mark.parametrize("scenario,sets,why", [
    (DIGITS4, ["training.strategy=ddp"], "this run's strategy is ddp"),
    (SCENARIOS / "cartpole-4.yaml", [], "task cartpole has no exportable model"),
])
def test_export_refused_in_one_line_before_any_rank_starts(tmp_path, capsys, scenario, sets, why):
    from oresearcher import run

    args = ["--scenario", str(scenario), "--out", str(tmp_path / "r"), "--export", str(tmp_path / "m")]
    code = cli_main(run.main, args + [a for s in sets for a in ("--set", s)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and why in err, err
    assert not (tmp_path / "r").exists() and not (tmp_path / "m").exists()
