"""The final task metric per agent and the deployable model (oresearcher.reporting.final)."""
import math

from oresearcher.reporting.final import FUSED, deployable_line, final_section, final_table
from oresearcher.reporting.report import Timeline, summarize


def _hist(*entries):
    return [dict(step=i, time_s=float(i), **e) for i, e in enumerate(entries)]


def test_last_task_metric_per_agent_with_role_and_the_validators_pick():
    metrics = {"0": _hist({"role": 0, "loss": 2.0}, {"role": 1, "test_accuracy": 0.90, "final_reliability": 0.2}),
               "1": _hist({"role": 2, "test_accuracy": 0.80}, {"role": 2, "final_reliability": 0.7}),
               "2": _hist({"role": "explorer", "loss": 1.0})}
    s = final_section(metrics, "oresearcher")
    assert s["metric"] == "test_accuracy"
    assert s["agents"] == [{"rank": 0, "role": "optimizer", "value": 0.90},
                           {"rank": 1, "role": "validator", "value": 0.80},  # the last value it recorded
                           {"rank": 2, "role": "explorer", "value": None}]
    assert s["deployable"] == {"what": FUSED, "value": None}  # what --export writes: no agent of them
    hosted = final_section(metrics, "oresearcher", hosted=True)  # agents not fused at the end
    assert hosted["deployable"]["rank"] == 1 and hosted["deployable"]["value"] == 0.80  # most reliable, not best


def test_the_console_names_the_model_deploy_exports():
    """A cooperative run without a student deploys (and --export writes) the fused agents
    (oresearcher.cooperation.deploy); the report and the console say so, and that no figure
    of it was measured, rather than naming one agent."""
    metrics = {"0": _hist({"role": 1, "test_accuracy": 0.9, "final_reliability": 0.9}),
               "1": _hist({"role": 2, "test_accuracy": 0.8, "final_reliability": 0.1})}
    line = deployable_line(final_section(metrics, "oresearcher"))
    assert line.startswith("deployable model: the fused agents") and "agent 0" not in line
    assert line.endswith(", not scored") and len(line) < 100  # one line in the docs' 100-column blocks
    assert final_section(metrics, "oresearcher", student=True)["deployable"] == {"what": "distilled student",
                                                                                 "value": None}


def test_student_shared_model_and_return_or_loss_fallbacks():
    student = {"0": _hist({"test_accuracy": 0.9, "student_test_accuracy": 0.88})}
    assert final_section(student, "oresearcher")["deployable"] == {"what": "distilled student", "value": 0.88}
    ddp = {"0": _hist({"test_accuracy": 0.9}), "1": _hist({"test_accuracy": 0.8})}
    d = final_section(ddp, "ddp")["deployable"]
    assert math.isclose(d["value"], 0.85) and "shared model" in d["what"]
    rl = {"0": _hist({"test_return": 40.0, "role": 0}), "1": _hist({"test_return": 130.0, "role": 1})}
    assert final_section(rl, "single")["deployable"]["value"] == 130.0  # higher return is better
    lm = {"0": _hist({"loss": 3.0}), "1": _hist({"loss": float("nan")}, {"loss": 2.5})}
    s = final_section(lm, "single")
    assert s["metric"] == "loss" and s["deployable"]["value"] == 2.5  # lower loss is better; NaN skipped


def test_no_section_without_values_and_the_table_caps_rows():
    assert final_section({"0": _hist({"role": 0, "lr": 0.1})}, "oresearcher") is None
    assert final_section({}, "ddp") is None
    many = {str(r): _hist({"test_accuracy": r / 100}) for r in range(40)}
    s = final_section(many, "single")
    t = final_table(s, max_rows=16)
    assert t.row_count == 17  # 16 agents and a "24 more" row
    assert "0.3900" in deployable_line(s)  # the best by accuracy without reliabilities


def test_summarize_puts_the_section_in_the_report():
    tl = Timeline(2)
    for r in range(2):
        tl.record(r, "compute", "fwd", 0.0, 1.0)
        tl.step_done(r, 0, 1.0, {"role": r, "test_accuracy": 0.5 + r / 10})
    rep = summarize(tl, {"name": "t", "training": {"strategy": "oresearcher"}}, backend="sim")
    assert [a["value"] for a in rep["final"]["agents"]] == [0.5, 0.6]
    tl2 = Timeline(1)
    tl2.record(0, "compute", "fwd", 0.0, 1.0)
    tl2.step_done(0, 0, 1.0, {})
    assert "final" not in summarize(tl2, {"name": "t"}, backend="sim")


def test_final_bars_mark_the_deployable_model():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from oresearcher.reporting.curves import draw_final

    data = {0: ([1.0], [0.90]), 1: ([1.0], [0.80])}
    report = {"metrics": {}, "final": {"label": "test accuracy", "deployable": {"rank": 1, "value": 0.80}}}
    fig, ax = plt.subplots()
    draw_final(ax, report, "test accuracy", data, ["C0", "C1"])
    widths = [p.get_linewidth() for p in ax.patches]
    assert widths[1] == 2.0 and widths[0] < 2.0 and "deployable" in ax.get_title()
    report["final"]["deployable"] = {"what": "distilled student", "value": 0.95}
    fig2, ax2 = plt.subplots()
    draw_final(ax2, report, "test accuracy", data, ["C0", "C1"])
    assert [line.get_ydata()[0] for line in ax2.get_lines()] == [0.95] and ax2.get_ylim()[1] > 0.95
    plt.close(fig)
    plt.close(fig2)


def test_sharded_agents_deploy_one_agent_not_a_mean_over_ranks():
    # two sharded agents of two ranks: agent 1 (ranks 2-3) has the lower held-out loss
    m = {"0": _hist({"loss": 2.0, "heldout_loss": 3.0}), "1": _hist({"loss": 2.2, "heldout_loss": 3.2}),
         "2": _hist({"loss": 2.6, "heldout_loss": 2.4}), "3": _hist({"loss": 2.8, "heldout_loss": 2.6})}
    s = final_section(m, "fsdp", shard_group=2)
    d = s["deployable"]
    assert d["agent"] == 1 and math.isclose(d["value"], 2.7)  # its ranks' mean training loss
    assert "ranks 2-3" in d["what"] and "held-out loss (2.5000)" in d["what"]
    assert final_table(s).columns[0].header == "rank"
    no_held = {r: _hist({"loss": v}) for r, v in {"0": 2.0, "1": 2.2, "2": 2.6, "3": 2.8}.items()}
    d = final_section(no_held, "fsdp", shard_group=2)["deployable"]
    assert d["agent"] == 0 and math.isclose(d["value"], 2.1) and "best by training loss" in d["what"]
    assert "shared model" in final_section(no_held, "fsdp")["deployable"]["what"]  # plain fsdp: one model


def test_the_report_reads_the_shard_group_from_the_scenario():
    tl = Timeline(4)
    for r in range(4):
        tl.step_done(r, 0, 0.0, {"loss": 1.0 + r, "heldout_loss": 4.0 - r})
    sc = {"training": {"strategy": "fsdp"}, "agents": {"count": 4}, "fsdp": {"replicas": "fusion", "shard_group_size": 2}}
    assert summarize(tl, sc, backend="gloo")["final"]["deployable"]["agent"] == 1
    sc["fsdp"]["replicas"] = "allreduce"
    assert "shared model" in summarize(tl, sc, backend="gloo")["final"]["deployable"]["what"]
