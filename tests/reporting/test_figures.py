"""Run figures: what each one shows, checked on the matplotlib objects, not on pixels."""
import math

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.ticker import EngFormatter

from oresearcher.reporting import curves, figures
from oresearcher.reporting.report import Timeline, summarize


def toy_timeline(n=4, steps=3, compute=1e-4, comm=2e-5):
    """Every rank: compute, then a blocking all-reduce; times in tens of microseconds."""
    tl = Timeline(n)
    for r in range(n):
        t = 0.0
        for s in range(steps):
            tl.record(r, "compute", "fwd_bwd", t, t + compute)
            tl.record(r, "comm", "grad_share", t + compute, t + compute + comm, wire_bytes=1000)
            tl.record(r, "blocked", "grad_share", t + compute, t + compute + comm)
            t += compute + comm
            tl.step_done(r, s, t, {"loss": 2.0 - s, "role": r % 3})
    return tl


def toy_report(tl=None):
    tl = tl or toy_timeline()
    return summarize(tl, {"name": "toy", "training": {"strategy": "ddp"}}, backend="sim")


@pytest.mark.parametrize("seconds,text", [(1.31725, "1.32 s"), (1.31725e-3, "1.32 ms"),
                                          (0.1317, "132 ms"), (4.8e-5, "48.0 µs"), (3e-9, "3.00 ns"),
                                          (1317.25e-3 * 1000, "1,317 s")])
def test_si_time_rounds_to_a_prefix(seconds, text):
    assert figures.si_time(seconds) == text


def test_small_timeline_legend_above_the_axes_and_si_ticks():
    fig, ax = plt.subplots(layout="constrained")
    title = figures.draw_timeline(ax, toy_timeline())
    fig.canvas.draw()
    assert "first 3 steps" in title
    assert isinstance(ax.xaxis.get_major_formatter(), EngFormatter)
    legend = ax.get_legend().get_window_extent()
    axes_box = ax.get_window_extent()
    label = ax.xaxis.label.get_window_extent()
    assert legend.y0 >= axes_box.y1 - 1  # above the data, so it covers neither bars nor labels
    assert not legend.overlaps(label)
    assert len(ax.get_yticks()) == 4
    plt.close(fig)


def test_large_timeline_is_a_heat_map_of_every_rank():
    tl = toy_timeline(n=64)
    fig, ax = plt.subplots()
    title = figures.draw_timeline(ax, tl)
    assert "64 ranks" in title
    (image,) = ax.get_images()
    assert image.get_array().shape[0] == 64
    plt.close(fig)


def test_activity_grid_codes_compute_and_blocked():
    tl = toy_timeline(n=2, steps=1, compute=3e-4, comm=1e-4)  # 3/4 compute, then 1/4 blocked
    grid = figures.activity_grid(tl, [0, 1], 0.0, 4e-4, bins=8)
    assert grid.shape == (2, 8)
    assert (grid[:, :6] == 1).all() and (grid[:, 6:] == 3).all()


def test_breakdown_drops_zero_rows_and_labels_bars(tmp_path):
    report = toy_report()
    names = [n for n, _, _ in figures.step_rows(report)]
    assert names == ["step time", "compute", "exposed comm", "comm in flight"]  # no zero "other"
    fig, ax = plt.subplots()
    figures.draw_step_bar(ax, report)
    labels = [t.get_text() for t in ax.texts]
    assert "100 µs" in labels and "20.0 µs" in labels
    assert ax.get_legend() is None
    plt.close(fig)
    figures.breakdown_png(report, tmp_path / "b.png", title="toy")
    assert (tmp_path / "b.png").stat().st_size > 1000


def test_sweep_figure_has_a_title_and_comm_on_its_own_axis(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(figures, "_save", lambda fig, path: seen.update(fig=fig))
    reports = [dict(toy_report(), exposed_comm_time_s=x * 1e-3, comm_time_s=2e-3) for x in (1.7, 3.0, 4.9)]
    figures.sweep_png("communication.bucket_size_MB", [1, 25, 400], reports, tmp_path / "s.png", title="toy sweep")
    fig = seen["fig"]
    assert fig._suptitle.get_text() == "toy sweep"
    comm_ax, overhead_ax = fig.axes
    lo, hi = comm_ax.get_ylim()
    assert lo == 0 and hi < 10e-3  # the ms-scale differences fill the axis; no compute line
    assert {line.get_label() for line in comm_ax.get_lines()} == {"comm in flight", "exposed comm"}
    assert "overhead" in overhead_ax.get_ylabel()
    plt.close(fig)


def digits_like_report():
    metrics = {}
    for r in range(3):
        rows = [{"step": s, "time_s": s * 1e-3 + (0.05 if s >= 10 else 0.0), "loss": -0.1, "task_loss": 2.0 / (s + 1),
                 "role": 0 if s < 5 else 1} for s in range(20)]
        rows[-1]["test_accuracy"] = 0.9 + r / 100
        metrics[str(r)] = rows
    return {"backend": "sim", "metrics": metrics, "scenario": {"name": "digits-4", "workload": {"task": "digits"}}}


def test_curve_plots_task_loss_and_metric_not_the_shaped_loss():
    report = digits_like_report()
    assert [(k, sparse) for _, k, sparse in curves.curve_panels(report)] == [("task_loss", False),
                                                                               ("test_accuracy", True)]
    assert curves.agent_label(report, 0) == "agent 0 (explorer→optimizer)"


def test_curve_prefers_episode_return_for_reinforcement_learning():
    report = {"metrics": {"0": [{"time_s": 0.0, "loss": 0.5, "train_return": 13.0, "test_return": 20.0, "metric": 20.0}]}}
    assert [k for _, k, _ in curves.curve_panels(report)] == ["train_return", "test_return"]


def test_lines_break_across_gaps():
    t = np.array([0.0, 1.0, 2.0, 3.0, 30.0, 31.0])
    t2, v2 = curves.break_gaps(t, t * 2)
    assert np.isnan(t2).sum() == 1 and math.isnan(t2[4]) and len(v2) == 7


def test_curve_and_summary_pages_are_written(tmp_path):
    report = digits_like_report()
    assert curves.curve_png(report, tmp_path / "curve.png")
    assert not curves.curve_png({"metrics": {}}, tmp_path / "none.png")
    full = dict(toy_report(), metrics=report["metrics"])
    figures.summary_png(full, toy_timeline(), tmp_path / "summary.png")
    assert (tmp_path / "summary.png").stat().st_size > 10_000
    figures.summary_png(toy_report(toy_timeline(n=32)), toy_timeline(n=32), tmp_path / "summary32.png")
    assert (tmp_path / "summary32.png").exists()


def test_time_ticks_say_zero_without_a_unit_and_the_rest_with_a_prefix():
    from oresearcher.reporting.curves import SITime

    f = SITime()
    assert f(0.0) == "0" and f(0.005) == "5 ms" and f(2.5e-5) == "25 µs"


def test_lanes_name_each_ranks_role():
    """toy_timeline's ranks report roles r % 3 (ROLE_CODES): the lane labels say them."""
    fig, ax = plt.subplots()
    figures.draw_timeline(ax, toy_timeline())
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["rank 0 (explorer)", "rank 1 (optimizer)", "rank 2 (validator)", "rank 3 (explorer)"]
    plt.close(fig)


def test_per_collective_panel_separates_waiting_from_transfer():
    """424 ms in flight per step and rank, 412 ms of it waiting for slower peers: two
    segments, 412 ms and 12 ms, and the label says how much was waiting."""
    steps, ws = 10, 4
    report = {"steps": steps, "world_size": ws, "breakdown": [
        {"name": "grad_share", "time_s": 0.424 * steps * ws, "peer_wait_s": 0.412 * steps * ws},
        {"name": "param_gather", "time_s": 0.010 * steps * ws}]}  # a real run's row: no waiting part
    parts = figures.collective_parts(report)
    assert [(n, round(t, 6), round(w, 6)) for n, t, w in parts] == [("grad_share", 0.424, 0.412),
                                                                     ("param_gather", 0.01, 0.0)]
    fig, ax = plt.subplots()
    figures.draw_collectives(ax, report)
    waiting, transfer = ax.containers
    assert [round(b.get_width(), 6) for b in waiting] == [0.412, 0.0]
    assert [round(b.get_width(), 6) for b in transfer] == [0.012, 0.01]
    assert [round(b.get_x(), 6) for b in transfer] == [0.412, 0.0]  # transfer starts where waiting ends
    texts = [t.get_text() for t in ax.texts]
    assert "424 ms (412 ms waiting)" in texts and "10.0 ms" in texts
    plt.close(fig)


def test_timeline_caption_names_the_collectives_of_a_later_phase():
    """Three steps of gradient sharing, then a fusion round (param_gather) after step 3:
    the first steps do not show it, and the caption says so."""
    tl = toy_timeline(n=2, steps=4)
    end = tl.step_ends[0][-1]
    for r in range(2):
        tl.record(r, "comm", "param_gather", end, end + 1e-5, wire_bytes=10)
    fig, ax = plt.subplots()
    title = figures.draw_timeline(ax, tl, max_steps=3)
    assert title == "first 3 steps, per rank; later, not shown: param_gather"
    assert figures.draw_timeline(ax, toy_timeline(n=2)) == "first 3 steps, per rank"  # nothing later
    plt.close(fig)
