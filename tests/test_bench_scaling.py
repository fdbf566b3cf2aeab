"""bench_scaling: the ladder on the two smallest sizes for a dozen steps (trained, stored by
its inputs, not trained again), and --check on a ladder the laws themselves made."""
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_scaling as B  # noqa: E402
import scaling_report as R  # noqa: E402

from oresearcher.models import scaling_laws as S  # noqa: E402


def test_the_two_smallest_sizes_train_are_stored_and_are_not_trained_again(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ORESEARCHER_CACHE", str(tmp_path / "cache"))
    results = tmp_path / "ladder.json"
    argv = ["--run", "--sizes", "text-25k,text-50k", "--steps", "12", "--strategies", "ddp,diloco-h10",
            "--seeds", "2", "--results", str(results)]
    assert B.main(argv) == 0
    ladder = json.loads(results.read_text())
    runs = list(ladder["runs"].values())
    assert {(r["model"], r["strategy"], r["seed"]) for r in runs} == {
        (m, s, seed) for m in ("text-25k", "text-50k") for s in ("ddp", "diloco-h10") for seed in (0, 1)}
    assert all(len(r["curve"]) == 12 and math.isfinite(r["val_loss"]) for r in runs)
    assert ladder["made_by"][0]["command"].endswith(" ".join(argv)) and ladder["made_by"][0]["host"]
    assert sum(r["strategy"] == "ddp" for r in runs) >= 4  # two rates at least, each size
    out = capsys.readouterr().out
    assert "held-out ddp: fewer than 4 sizes 4x below the largest, no check" in out

    def refuse(data):
        raise AssertionError(f"trained {data['name']} again")
    monkeypatch.setattr(B, "train", refuse)
    assert B.main(argv) == 0  # every run found by its inputs
    assert json.loads(results.read_text())["runs"].keys() == ladder["runs"].keys()


def test_an_unknown_size_is_one_line_and_exit_2(capsys):
    assert B.main(["--check", "--sizes", "text-9b"]) == 2
    assert "unknown strategy or size text-9b" in capsys.readouterr().err


def test_the_budget_is_tokens_per_non_embedding_parameter():
    assert B.non_embedding("text-25k") == 25_472 and B.non_embedding("text-450k") == 447_552
    assert B.budget_steps("text-25k", 20) == math.ceil(20 * 25_472 / 1024)


LAW = {"E": 2.0, "A": 40.0, "alpha": 0.3, "B": 0.9, "beta": 0.5, "C": 1.0}
SLOWER = {**LAW, "B": 1.0}  # the other strategy: a larger data term, the same size term


def synthetic_run(model, strategy, lr, steps, law):
    n = B.non_embedding(model)
    run = {"model": model, "strategy": strategy, "lr": lr, "steps": steps, "seed": 0, "n": n,
           "tokens_per_step": 1024}
    s1, s2 = S.areas(R.schedule(run))
    curve = [float(x) for x in S.curve_law(n, np.concatenate([[1e-9], s1[:-1]]), np.concatenate([[0], s2[:-1]]),
                                           **law)]
    curve[0] = 6.9  # before any update
    return {**run, "curve": curve, "val_loss": curve[-1]}


def test_check_recovers_a_ladder_the_laws_made(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(S, "RATE_EXPONENTS", (0.0, 1.0))  # the profile's grid's ends: 2 fits, not 11
    runs = {}
    for model in B.SIZES:
        steps = B.budget_steps(model, 2)
        for lr, strategy, law, st in ((3e-3, "ddp", LAW, steps), (6e-3, "ddp", {**LAW, "E": 4.0}, steps),
                                      (3e-3, "ddp", LAW, steps // 2), (3e-3, "diloco-h10", SLOWER, steps)):
            runs[f"{model}-{strategy}-{lr}-{st}"] = synthetic_run(model, strategy, lr, st, law)
    largest = B.SIZES[-1]
    steps = B.budget_steps(largest, 2)
    for seed, law in ((1, {**LAW, "E": 2.02}), (2, {**LAW, "E": 1.99})):  # the held-out size's other seeds
        runs[f"seed{seed}"] = {**synthetic_run(largest, "ddp", 3e-3, steps, law), "seed": seed}
    path = tmp_path / "scaling-ladder.json"
    path.write_text(json.dumps({"runs": runs, "made_by": []}))
    assert R.check(path, tmp_path / "fits.png") == 0
    out = capsys.readouterr().out
    fits = json.loads((tmp_path / "scaling-fits.json").read_text())
    assert fits["tuned_lr"] == {m: 3e-3 for m in B.SIZES}  # the lower loss wins the grid
    for strategy in ("ddp", "diloco-h10"):
        h = fits["held_out"][strategy]
        assert h["model"] == largest and abs(h["steps_error"]) < 0.05
        assert f"held-out {strategy}: final loss error" in out
    assert all(r["loss_ratio"] > 1 for r in fits["multipliers"]["diloco-h10"])
    quarter = [m for m in B.SIZES if 4 * B.non_embedding(m) <= B.non_embedding(largest)]  # the fitted sizes
    assert len(quarter) < len(B.SIZES) - 1 and fits["held_out"]["ddp"]["largest_fitted_n"] == B.non_embedding(quarter[-1])
    smaller = fits["held_out_smaller"]  # every size with 4 sizes a quarter of it or less: a check of its own
    assert smaller and largest not in smaller
    for at, rows in smaller.items():
        fitted = [m for m in B.SIZES if 4 * B.non_embedding(m) <= B.non_embedding(at)]
        assert len(fitted) >= 4 and rows["ddp"]["largest_fitted_n"] == B.non_embedding(fitted[-1])
        assert abs(rows["diloco-h10"]["steps_error"]) < 0.05 and f"held-out at {at}, a smaller check, ddp:" in out
    h = fits["held_out"]["ddp"]  # the median over the held-out size's three seeds, the median seed's run first
    assert sorted(h["seeds"]) == [0, 1, 2] and h["final_loss"] == sorted(h["final_losses"])[1] == h["final_losses"][0]
    assert h["seeds"][0] == 0  # E 2.0 lies between the other seeds' 1.99 and 2.02
    assert fits["held_out"]["diloco-h10"]["seeds"] == [0]
    assert (tmp_path / "fits.png").stat().st_size > 0


def test_check_without_results_is_one_line_and_exit_2(tmp_path, capsys):
    assert B.main(["--check", "--results", str(tmp_path / "none.json")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'none.json'}: no ladder results (train them with --run)"


def test_a_size_run_at_three_seeds_is_stood_for_by_its_median_seed():
    model, steps = B.SIZES[0], B.budget_steps(B.SIZES[0], 20)
    runs = [{**synthetic_run(model, "ddp", 3e-3, steps, {**LAW, "E": e}), "seed": seed}
            for seed, e in ((0, 2.5), (1, 2.0), (2, 2.2))]
    runs.append({**synthetic_run(model, "ddp", 6e-3, steps, {**LAW, "E": 4.0}), "seed": 0})  # tuning: loses at seed 0
    chosen, tuned, _, extra = R.pick(runs)
    assert tuned == {model: 3e-3}
    assert chosen["ddp"][model]["seed"] == 2  # E 2.2 lies between 2.0 and 2.5, though seed 0 tuned the rate
    assert sorted(r["seed"] for r in extra["ddp"][model]) == [0, 1]


def test_the_curve_laws_rate_exponent_is_profiled_on_the_tuning_grid_and_carries_to_another_peak(monkeypatch):
    monkeypatch.setattr(S, "RATE_EXPONENTS", (0.0, 0.5, 1.0))  # 3 fits, not 11
    # curves that do not depend on the peak rate (the law read at gamma 0): every fitted size at
    # two rates, the held-out size at a third, half the fitted sizes' tuned rate
    def made(model, lr, seed=0):
        run = synthetic_run(model, "ddp", 3e-3, B.budget_steps(model, 2), LAW)
        return {**run, "lr": lr, "seed": seed}
    runs = [made(m, lr) for m in B.SIZES[:-1] for lr in (3e-3, 6e-3)]
    runs += [made(B.SIZES[-1], 1.5e-3, seed) for seed in (0, 1, 2)]
    chosen, tuned, _, extra = R.pick(runs)
    rate = R.rate_exponent(runs, chosen["ddp"])
    assert rate["gamma"] == 0.0 and rate["ref"] == 3e-3 and rate["rates"] == [3e-3, 6e-3]
    h = R.held_out(chosen["ddp"], extra["ddp"], rate)
    assert h["gamma"] == 0.0 and abs(h["steps_error"]) < 0.05
    paper = R.held_out(chosen["ddp"], extra["ddp"])  # progress in summed rate: half as far at half the rate
    assert paper["steps_error"] is None or abs(paper["steps_error"]) > 0.15
