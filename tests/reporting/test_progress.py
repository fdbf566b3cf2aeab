"""Progress off a terminal: one line every few seconds with steps/s and ETA."""
import io

from oresearcher.reporting.progress import ProgressLines, fmt_duration, progress_line


def test_progress_line_rate_and_eta():
    assert progress_line("simulating steps", 50, 200, 0, 10.0) == \
        "simulating steps: 50/200 (25%), 5 steps/s, ETA 30 s"
    assert progress_line("training", 150, 200, 100, 10.0).endswith("5 steps/s, ETA 10 s")  # resumed at 100


def test_lines_every_few_seconds_only():
    now = [0.0]
    out = io.StringIO()
    p = ProgressLines(100, "x", every_s=5.0, stream=out, clock=lambda: now[0])
    for step in range(1, 101):
        now[0] = step * 0.1  # 10 steps/s: a line at 5 s and at 10 s
        p.update(step)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("x: 50/100 (50%), 10 steps/s, ETA 5.0 s")


def test_fmt_duration():
    assert [fmt_duration(s) for s in (4.25, 42, 754, 7300)] == ["4.2 s", "42 s", "12 min 34 s", "2 h 1 min"]
