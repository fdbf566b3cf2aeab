"""Predict step time and communication overhead of a scenario on a modelled cluster.

    python -m oresearcher.sim scenarios/8xA100.yaml
    python -m oresearcher.sim scenarios/8xA100.yaml --out runs/8xA100 --set training.steps=50
    python -m oresearcher.sim scenarios/8xA100.yaml --sweep communication.bucket_size_MB=5,25,100
    python -m oresearcher.sim scenarios/8xA100.yaml --sweep communication.bucket_size_MB=5,25,100 --jobs 2
    python -m oresearcher.sim scenarios/8xA100.yaml --sweep communication.bucket_size_MB=5,25,100 --sweep-backend ray
    python -m oresearcher.sim scenarios/8xA100.yaml --target-loss 2.6 --sweep training.strategy=ddp,diloco,oresearcher
    python -m oresearcher.sim scenarios/8xA100.yaml --collective-bench all_reduce
    python -m oresearcher.sim scenarios/8xA100.yaml --collective-bench all_reduce \
        --launch single-process --reference tests/data/nccl-oci-spinup-gpu-cluster-a100sxm40-8gpu.csv

Writes report.json, timeline.png, breakdown.png and trace.json (open it in
ui.perfetto.dev) to --out (default runs/<scenario name>). Bad input: one line on
stderr, exit code 2.
"""
from __future__ import annotations

import argparse
import difflib
import sys
import time
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from oresearcher.reporting import plots
from oresearcher.reporting.console import console, print_report, run_title
from oresearcher.errors import Parser, UserError, cli_main, short
from oresearcher.files import writable_dir
from oresearcher.reporting.progress import ProgressLines
from oresearcher.reporting.report import write_json
from oresearcher.scenario import check_resize, load_scenario, parse_override
from oresearcher.scenario.shipped import find_scenario
from oresearcher.tasks import batch_note
from oresearcher.reporting.trace import write_trace
from oresearcher.reporting.units import format_bytes

from .bench import OPS, bench_cluster, bench_png, bus_factor, collective_bench, read_reference, reference_error
from .numeric_cost import numeric_note
from .simulate import resolve_mode, simulate
from .cli_checks import check_target_loss, out_dir, per_rank_note
from .convergence import attach, proxy_note



class _LazyProgress:
    """A progress bar that appears only once a run has taken more than a second; off a
    terminal (piped, logged), a line every few seconds with steps/s and ETA instead."""

    def __init__(self, total: int, label: str):
        self.total, self.label = total, label
        self.t0 = time.monotonic()
        self.bar = None
        self.lines = None if console.is_terminal else ProgressLines(total, label)

    def __call__(self, rank: int, step: int) -> None:
        if rank != 0:
            return
        if self.lines is not None:
            self.lines.update(step + 1)
            return
        if self.bar is None:
            if time.monotonic() - self.t0 < 1.0:
                return
            # the label is the user's text (a sweep's "field=value"): printed as typed, never as markup
            self.bar = Progress(TextColumn("{task.description}", style="progress.description", markup=False),
                                BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), transient=True, console=console)
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=self.total)
        self.bar.update(self.task, completed=step + 1)

    def close(self):
        if self.bar is not None:
            self.bar.stop()


def _load(args, overrides, labels=None):
    """The scenario with the user's overrides; a cluster resized without its agents is refused.
    ``labels``: override -> the flag the user typed (a sweep's value is --sweep, not --set)."""
    scenario = load_scenario(args.scenario, overrides, labels)
    check_resize(scenario, overrides, labels)
    return scenario


def _run_one(args, overrides, label):
    scenario = _load(args, overrides)
    if note := batch_note(scenario):
        console.print(note, highlight=False)
    if (args.mode or resolve_mode(scenario)) == "numeric" and (note := numeric_note(scenario)):
        console.print(note, highlight=False)  # before the first step: long work says so up front
    if note := proxy_note(scenario):  # the convergence proxy's training, estimated the same way
        console.print(note, highlight=False)
    if note := per_rank_note(scenario, args.mode or resolve_mode(scenario), args.exact):
        console.print(note, highlight=False)
    progress = _LazyProgress(scenario.training.steps, label)
    try:
        report, tl = simulate(scenario, mode=args.mode, on_step=progress, exact=args.exact)
    finally:
        progress.close()
    attach(scenario, report, log=lambda line: console.print(line, style="dim", highlight=False))
    return scenario, report, tl


def cmd_simulate(args) -> int:
    out = out_dir(args, _load(args, args.set).name)  # before the simulation: nothing computed is lost
    scenario, report, tl = _run_one(args, args.set, "simulating steps")
    writable_dir(out)
    print_report(report, run_title(report))
    eng = report.get("engine")
    if eng:  # how the run was computed (sim/symmetry.py); the figures are the same either way
        how = (f"one process per class ({eng['processes']:,} for {report['world_size']:,} ranks)"
               if eng["symmetry"] == "classes" else f"one process per rank ({eng['processes']:,})")
        console.print(f"engine: {how}: {eng['why']}", style="dim", highlight=False)
    if report.get("faults"):
        from .faults import faults_table

        console.print(faults_table(report["faults"]))
    write_json(out / "report.json", report)
    write_trace(tl, out / "trace.json", scenario.name)
    what = f"{scenario.name} ({report['world_size']} ranks, simulated)"
    plots.timeline_png(tl, out / "timeline.png", title=what)
    plots.breakdown_png(report, out / "breakdown.png", title=f"{what}: time per step")
    extra = " curve.png" if plots.curve_png(report, out / "curve.png") else ""
    if report.get("convergence"):  # sim/convergence.py: the loss at scale
        from oresearcher.reporting import convergence_view as cview

        for line in cview.lines(report["convergence"]):
            console.print(line, highlight=False)
        if cview.figure([(scenario.training.strategy, report["convergence"])], out / "convergence.png",
                        f"{scenario.name}: predicted loss"):
            extra += " convergence.png"
    plots.summary_png(report, tl, out / "summary.png")
    console.print(f"wrote {out}/report.json summary.png timeline.png breakdown.png trace.json{extra}")
    return 0


def cmd_sweep(args) -> int:
    keys, values = parse_override(args.sweep, "--sweep")
    field = ".".join(keys)
    values = values if isinstance(values, list) else [values]
    raw = args.sweep.split("=", 1)[1].split(",")
    if len(values) == 1 and len(raw) > 1:
        values = [parse_override(f"x={v}")[1] for v in raw]
    if not values:
        raise UserError(f"--sweep {short(args.sweep, 80)}: no values to sweep (give V1,V2,...)")
    for v in values:  # every value is checked before any runs: a bad one costs nothing
        swept = f"{field}={v}"  # an hour of proxy training is refused here too
        proxy_note(_load(args, [*args.set, swept], {swept: f"--sweep value {swept}"}))
    name = load_scenario(args.scenario, args.set).name
    out = out_dir(args, name)
    if args.jobs == 1 and args.sweep_backend == "process":
        reports = []
        for v in values:
            _, report, _ = _run_one(args, [*args.set, f"{field}={v}"], f"{field}={v}")
            reports.append(report)
    elif args.sweep_backend == "ray":  # Ray tasks: the same reports, in the order given (sim/sweep.py)
        from .sweep import run_ray

        reports = run_ray(str(Path(args.scenario).resolve()), [[*args.set, f"{field}={v}"] for v in values],
                          args.mode, args.ray_address, args.exact)
    else:  # a process pool: the same reports, in the order given (sim/sweep.py)
        from .sweep import run_pool

        reports = run_pool(args.scenario, [[*args.set, f"{field}={v}"] for v in values], args.mode, args.jobs,
                           args.exact)
    console.print(sweep_table(field, values, reports))
    conv = all(r.get("convergence") for r in reports)
    if conv:  # ranked by predicted time to the target loss, not by step time alone
        from oresearcher.reporting import convergence_view as cview

        console.print(cview.sweep_table(field, values, reports))
    keep = ("step_time_s", "compute_time_s", "comm_time_s", "exposed_comm_time_s", "comm_overhead", "wire_bytes_per_step")
    writable_dir(out)
    write_json(out / "sweep.json", {"field": field, "values": values,
                                    "results": [{k: r[k] for k in keep if k in r} for r in reports]})
    plots.sweep_png(field, values, reports, out / "sweep.png", title=f"{name}: sweep of {field}")
    if conv and cview.figure([(str(v), r["convergence"]) for v, r in zip(values, reports)],
                             out / "convergence.png", f"{name}: predicted loss, sweep of {field}"):
        console.print(f"wrote {out}/convergence.png")
    console.print(f"wrote {out}/sweep.json sweep.png")
    return 0


def sweep_table(field: str, values: list, reports: list[dict]) -> Table:
    """One row per value; units in the headers so the cells are bare numbers (80 columns)."""
    times = [r[k] for r in reports for k in ("step_time_s", "comm_time_s", "exposed_comm_time_s")]
    unit, scale = ("us", 1e-6) if max(times, default=0.0) < 1e-3 else ("ms", 1e-3)
    wire = [r["wire_bytes_per_step"] for r in reports]
    wunit, wscale = ("GB", 1e9) if max(wire, default=0) >= 1e7 else ("MB", 1e6)
    t = Table(title=f"sweep of {field}: per step, mean over ranks", header_style="bold")
    for col in (field.rsplit(".", 1)[-1], f"step {unit}", f"comm {unit}", f"exposed {unit}", "overhead",
                f"wire {wunit}"):
        t.add_column(col, justify="right", no_wrap=True)
    for v, r in zip(values, reports):
        t.add_row(str(v), *(_num(r[k] / scale) for k in ("step_time_s", "comm_time_s", "exposed_comm_time_s")),
                  f"{r['comm_overhead']:.2%}", f"{r['wire_bytes_per_step'] / wscale:,.3f}")
    t.caption = "comm: in flight, overlapped or not; exposed: ranks blocked on it"
    return t


def _num(x: float) -> str:
    return f"{x:,.2f}" if abs(x) < 10 else f"{x:,.1f}"


def cmd_bench(args) -> int:
    scenario = load_scenario(args.scenario, args.set)
    out = out_dir(args, scenario.name)
    device, topo = bench_cluster(scenario)
    refs = [(Path(f).stem, read_reference(f, bus_factor(args.collective_bench, topo.world_size)))
            for f in args.reference]
    topo.launch = args.launch
    sizes = sorted({s for _, ref in refs for s, _ in ref}) if refs else None
    op = args.collective_bench
    rows = collective_bench(topo, device, op, sizes=sizes, algorithm=scenario.communication.algorithm)
    what = (f"{op} on {scenario.name}: {topo.world_size} ranks, {scenario.cluster.device}, "
            f"{scenario.cluster.intra_node}" + (f" + {scenario.cluster.inter_node}" if topo.nodes > 1 else "")
            + f", {args.launch}")
    t = Table(title=f"simulated {what}", header_style="bold")
    for col in ("size", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "algorithm"):
        t.add_column(col, justify="right")
    ref_time = [dict(ref) for _, ref in refs]
    for i, _ in enumerate(refs):
        t.add_column(f"ref {i + 1} (us)", justify="right")
    for r in rows:
        t.add_row(format_bytes(r["size_bytes"], binary=True), f"{r['time_us']:,.2f}", f"{r['algbw_GBps']:.2f}", f"{r['busbw_GBps']:.2f}",
                  r["algorithm"], *[f"{m[r['size_bytes']]:,.1f}" if r["size_bytes"] in m else "" for m in ref_time])
    console.print(t)
    errors = {label: reference_error(rows, ref) for label, ref in refs}
    for i, (label, e) in enumerate(errors.items()):
        console.print(f"ref {i + 1}: {label}\n  error {e:.1%} = exp(mean |ln(simulated/measured)|) - 1")
    writable_dir(out)
    write_json(out / f"collective_bench_{op}.json", {"op": op, "world_size": topo.world_size, "launch": args.launch,
                                                      "rows": rows, "reference_error": errors})
    bench_png(op, rows, out / f"collective_bench_{op}.png", f"simulated {what}", refs)
    console.print(f"wrote {out}/collective_bench_{op}.json and .png")
    return 0


def _op(text: str) -> str:
    """A collective's name as OPS spells it; a near miss gets 'did you mean'."""
    if text in OPS:
        return text
    close = difflib.get_close_matches(text.lower().replace("-", "_"), OPS, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]}? " if close else ""
    raise argparse.ArgumentTypeError(f"unknown collective {text[:40]!r}; {hint}known: {', '.join(OPS)}")


def check_flags(args) -> None:
    """Flags that would be ignored or contradict each other, refused one line each: a sweep
    and a collective benchmark are two different runs; --launch and --reference shape only
    the benchmark, --mode only a training simulation; --sweep and --set of one field."""
    if args.collective_bench and args.sweep:
        raise UserError("--sweep and --collective-bench are two different runs; give one")
    if args.collective_bench and args.mode:
        raise UserError("--mode applies to a simulated training run, not to --collective-bench")
    for flag in ("launch", "reference"):
        if getattr(args, flag) and not args.collective_bench:
            raise UserError(f"--{flag} only applies to --collective-bench OP")
    if args.jobs < 1:
        raise UserError(f"--jobs {args.jobs}: expected a number of worker processes >= 1")
    if args.jobs > 1 and not args.sweep:
        raise UserError("--jobs only applies to --sweep (one configuration runs in one process)")
    if (args.sweep_backend != "process" or args.ray_address) and not args.sweep:
        raise UserError("--sweep-backend and --ray-address only apply to --sweep")
    if args.ray_address and args.sweep_backend != "ray":
        raise UserError("--ray-address needs --sweep-backend ray")
    field = (args.sweep or "").split("=", 1)[0].strip()
    if field and (same := [s for s in args.set if s.split("=", 1)[0].strip() == field]):
        raise UserError(f"--sweep {field}=... and --set {same[0]} both set {field}; give one")
    if args.target_loss is not None:
        check_target_loss(args, field)


def parse_args(argv):
    p = Parser(prog="python -m oresearcher.sim", description=__doc__.split("\n")[0])
    p.add_argument("scenario", help="scenario YAML file, e.g. scenarios/8xA100.yaml; from another directory a "
                                    "shipped scenario's name (8xA100) finds it")
    p.add_argument("--out", help="output directory (default runs/<scenario name>)")
    p.add_argument("--set", action="append", default=[], metavar="PATH=VALUE", help="override a scenario field")
    p.add_argument("--sweep", metavar="PATH=V1,V2,...", help="run once per value and compare")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="--sweep: run the configurations on N worker processes (default 1: one after another)")
    p.add_argument("--sweep-backend", choices=("process", "ray"), default="process",
                   help="--sweep: worker processes on this machine (--jobs) or Ray tasks (pip install 'oresearcher[ray]')")
    p.add_argument("--ray-address", metavar="ADDRESS",
                   help="--sweep-backend ray: the cluster to join (ray.init(address=...)); default: a local instance")
    p.add_argument("--exact", action="store_true",
                   help="simulate every rank in its own process (no symmetry shortcut; the report is the same)")
    p.add_argument("--collective-bench", type=_op, metavar="OP", help=f"nccl-tests-style table: {', '.join(OPS)}")
    p.add_argument("--mode", choices=("shape", "numeric"), help="override simulation.mode")
    p.add_argument("--target-loss", type=float, metavar="LOSS", help="predict the time until the loss reaches LOSS "
                   "(nats per token; sets convergence.target_loss, see oresearcher/scenario/convergence.py)")
    p.add_argument("--launch", choices=("per-process", "single-process"),
                   help="--collective-bench: one process per GPU (torchrun, nccl-tests -g 1; default) or one "
                        "process driving every GPU of a node (nccl-tests -g 8)")
    p.add_argument("--reference", action="append", default=[], metavar="FILE",
                   help="--collective-bench: a published curve to print and plot beside the simulation "
                        "(size_bytes,time_us CSV as in tests/data/nccl-*.csv, or nccl-tests output); repeatable")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    check_flags(args)
    args.launch = args.launch or "per-process"
    args.scenario = str(find_scenario(args.scenario))
    if args.target_loss is not None:
        args.set.append(f"convergence.target_loss={args.target_loss!r}")
    console.print(f"scenario file: {args.scenario}", style="dim", highlight=False)
    if args.collective_bench:
        return cmd_bench(args)
    if args.sweep:
        return cmd_sweep(args)
    return cmd_simulate(args)


if __name__ == "__main__":
    sys.exit(cli_main(main))
