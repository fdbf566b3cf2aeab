"""The report tables the entry points print (oresearcher.reporting.console)."""
from rich.console import Console

from oresearcher.reporting.console import collective_table

ROWS = [{"name": "grad_share", "count": 58400, "time_s": 677.96, "peer_wait_s": 658.62, "wire_bytes": 3.68e12,
         "algorithms": {"ring/Simple": 58400}},
        {"name": "param_gather", "count": 24, "time_s": 397.06, "peer_wait_s": 395.17, "wire_bytes": 4.4e11,
         "algorithms": {"ring/Simple": 24}}]


def _render(table, width=80):
    c = Console(width=width, record=True)
    c.print(table)
    return c.export_text()


def test_simulated_collectives_show_waiting_and_algorithm_within_80_columns():
    text = _render(collective_table(ROWS, steps=200, ws=8, waits=True))
    assert "waiting" in text and "ring/Simple" in text and "411.637 ms" in text
    assert max(len(line) for line in text.splitlines()) <= 80
    assert sum(line.startswith("┃") for line in text.splitlines()) == 1  # the header on one line


def test_real_run_collectives_leave_out_what_the_backend_cannot_know():
    real = [dict(r, peer_wait_s=0.0, algorithms={}) for r in ROWS]
    text = _render(collective_table(real, steps=200, ws=8, waits=False))
    assert "waiting" not in text and "algorithm" not in text
    assert "423.725 ms" in text  # in flight per step and rank: 677.96 / 200 / 8


def test_both_clis_title_a_report_alike():
    """python -m oresearcher.sim and python -m oresearcher.run title their table with one
    function: the same scenario reads the same up to where the backend is named."""
    from oresearcher.reporting.console import run_title

    sc = {"name": "cpu-tiny", "training": {"strategy": "ddp"}}
    sim = {"backend": "sim", "mode": "numeric", "world_size": 2, "steps": 1200, "scenario": sc}
    real = {"backend": "gloo", "world_size": 2, "steps": 200, "start_step": 1000, "scenario": sc}
    assert run_title(sim) == "cpu-tiny: ddp, 2 ranks, numeric mode, 1,200 steps"
    assert run_title(real) == "cpu-tiny: ddp, 2 ranks on gloo, 1,200 steps (resumed at 1,000)"
