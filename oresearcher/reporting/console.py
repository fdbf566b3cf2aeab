"""Console output shared by the entry points: the report table both backends print."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from .final import deployable_line, final_table, language_line
from .units import format_bytes

# markup off: what is printed is text, and much of it is the user's (a scenario name, a
# law's source, a field's value): "[bold]x" must print as typed, and "[/x]" must not
# raise MarkupError half-way through the outputs. Styles are given as style=, or as Text.
console = Console(markup=False)


def fmt_ms(x):
    return f"{x * 1e3:,.3f} ms"


def _algorithms(counts: dict) -> str:
    """The most used algorithm[/protocol] of a collective, and how many others ran."""
    if not counts:
        return ""
    top = max(counts, key=counts.get)
    return top + (f" +{len(counts) - 1}" if len(counts) > 1 else "")


def collective_table(breakdown: list[dict], steps: int, ws: int, waits: bool) -> Table:
    """Per collective, per step and rank. Waiting (the part of in flight before the last
    member arrived) and the algorithm only where the backend knows them (the simulator);
    a real run's table would show zeros and blanks. Fits 80 columns."""
    algos = any(row.get("algorithms") for row in breakdown)
    cols = ["collective", "calls", "in flight", *(["waiting"] if waits else []), "wire",
            *(["algorithm"] if algos else [])]
    b = Table(title="per collective (per step and rank)", header_style="bold")
    for col in cols:
        b.add_column(col, justify="left" if col in ("collective", "algorithm") else "right")
    for row in breakdown:
        cells = [row["name"], f"{row['count'] / steps / ws:.3g}", fmt_ms(row["time_s"] / steps / ws)]
        if waits:
            cells.append(fmt_ms(row.get("peer_wait_s", 0.0) / steps / ws))
        cells.append(format_bytes(row["wire_bytes"] / steps / ws))
        if algos:
            cells.append(_algorithms(row.get("algorithms") or {}))
        b.add_row(*cells)
    return b


def steps_title(report: dict) -> str:
    """The run's steps: all of them, and for a resumed run where it resumed (its figures
    are the mean over the steps run since)."""
    start, ran = report.get("start_step") or 0, report["steps"]
    return f"{start + ran:,} steps" + (f" (resumed at {start:,})" if start else "")


def run_title(report: dict) -> str:
    """The report table's title, for both CLIs: ``<scenario>: <strategy>, N ranks on
    <backend>, <steps>``; a simulation names its mode where a real run names its backend."""
    sc = report.get("scenario") or {}
    where = f", {report.get('mode')} mode" if report["backend"] == "sim" else f" on {report['backend']}"
    return (f"{sc.get('name')}: {(sc.get('training') or {}).get('strategy')}, {report['world_size']} ranks{where}, "
            f"{steps_title(report)}")


def print_report(report: dict, title: str, column: str = "predicted") -> None:
    t = Table(title=title, show_header=True, header_style="bold")
    t.add_column("per step (mean over ranks)")
    t.add_column(column, justify="right")
    t.add_row("step time", fmt_ms(report["step_time_s"]))
    t.add_row("compute time", fmt_ms(report["compute_time_s"]))
    t.add_row("communication time (in flight)", fmt_ms(report["comm_time_s"]))
    if report.get("backend") == "sim":  # only the simulator knows when every member arrived
        t.add_row("  of which waiting for slower peers", fmt_ms(report["peer_wait_time_s"]))
    t.add_row("exposed communication time", fmt_ms(report["exposed_comm_time_s"]))
    t.add_row("communication overhead (exposed / step)", f"{report['comm_overhead']:.2%}")
    plain = report.get("without_controller")
    if plain:  # communication.budget: the same run without the overhead controller (sim/simulate.py)
        t.add_row("  without the overhead controller", f"{plain['comm_overhead']:.2%}, step {fmt_ms(plain['step_time_s'])}")
    t.add_row("bytes on the wire per rank", format_bytes(report["wire_bytes_per_step"]))
    if report.get("steps"):
        start = report.get("start_step") or 0  # a resumed run measures the steps run since the resume
        which = f"since the resume at {start:,}" if start else "warm-up included"
        t.caption = f"step time = {report.get('total_time_s', 0.0):,.4g} s / {report['steps']:,} steps ({which})"
    console.print(t)
    if report.get("band"):  # a calibrated profile's (oresearcher/calibration/band.py)
        b, w = report["band"], report["band"]["half_width"]
        console.print(f"band from calibration's spread: step {fmt_ms(b['step_time_s'][0])} - "
                      f"{fmt_ms(b['step_time_s'][1])} (+-{w['step_time']:.0%}), overhead "
                      f"{b['comm_overhead'][0]:.2%} - {b['comm_overhead'][1]:.2%} (+-{w['comm_overhead']:.0%})",
                      highlight=False)
    steps, ws = max(report["steps"], 1), max(report["world_size"], 1)
    if report["breakdown"]:
        console.print(collective_table(report["breakdown"], steps, ws, waits=report.get("backend") == "sim"))
    mem = report.get("memory")
    if mem:
        from rich.text import Text

        verdict = ("fits", "green") if mem["fits"] else ("does NOT fit", "red")
        b = {k: format_bytes(v) for k, v in mem.items() if k in ("total", "weights", "grads", "optimizer_state",
                                                                 "activations", "codec_buffers")}
        console.print(Text.assemble(f"memory per GPU: {b['total']} (", verdict,
                                    f"; weights {b['weights']}, grads {b['grads']}, optimizer {b['optimizer_state']}, "
                                    f"activations {b['activations']}, codec {b['codec_buffers']})"))
        if mem.get("advice"):
            console.print(f"  advice: {mem['advice']}")
    if report.get("final"):
        console.print(final_table(report["final"]))
        console.print(deployable_line(report["final"]), highlight=False)
        if lm := language_line(report.get("metrics")):  # the text task: nats/token, bits/byte, multiple choice
            console.print(lm, highlight=False)
    spent = [m[-1]["epsilon"] for _, m in sorted((report.get("metrics") or {}).items(), key=lambda kv: int(kv[0]))
             if m and "epsilon" in m[-1]]
    if spent:  # cooperation.privacy: what each agent spent (oresearcher.cooperation.privacy)
        delta = ((report.get("scenario") or {}).get("cooperation") or {}).get("privacy", {}).get("delta")
        console.print(f"privacy: epsilon per agent {', '.join(f'{e:.3g}' for e in spent)}"
                      + (f" at delta {delta:g}" if delta else ""))
