"""nccl-tests-style collective benchmark on the modelled cluster.

Each size runs the collective once on all ranks of the scenario's cluster through the
event-driven engine; the algorithm column names what ran (``ring/LL``: NCCL's ring with
the LL protocol, where the fabric has an NCCL model). Columns follow nccl-tests (doc/PERFORMANCE.md): ``size`` is the
total buffer (for all_gather the gathered output, for reduce_scatter the input),
algbw = size / time, busbw = algbw x factor with factor 2(n-1)/n for all_reduce,
(n-1)/n for all_gather, reduce_scatter and all_to_all, 1 for broadcast.
"""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import NamedTuple, Optional

import torch

from oresearcher import ops as O
from oresearcher.comm import schedules
from oresearcher.comm.units import Bps_to_GBps, GBps_to_Bps, s_to_us, us_to_s
from oresearcher.errors import UserError

from .engine import Engine

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


KINDS = {"all_reduce": "AllReduce", "all_gather": "AllGather", "reduce_scatter": "ReduceScatter",
         "all_to_all": "AllToAll", "broadcast": "Broadcast"}


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus factor of ``op`` (its name, all_reduce ...) on ``n`` ranks."""
    return schedules.bus_factor(KINDS[op], n)


class Reference(NamedTuple):
    """The cluster a published curve ran on."""
    nodes: int
    gpus_per_node: int
    inter: Optional[str]  # inter-node fabric profile
    nics_per_node: int
    launch: str  # per-process (nccl-tests -g 1) or single-process (-g 8)
    min_size: int  # smallest size the model answers for (a -g 8 run's floor hides the kernel)
    intra: str = "nvswitch-a100"
    device: str = "A100-SXM4-80GB"


# The published curves shipped in tests/data (copies of the project's NCCL references, each
# with its source line) and the cluster each ran on. The H100 curve does not say how it was
# launched, and its small sizes differ by launch mode: it answers from 1 MiB up.
REFERENCES = {
    "abci2-intra-anode-job08-a100sxm40-8gpu": Reference(1, 8, None, 1, "per-process", 0),
    "oci-spinup-gpu-cluster-a100sxm40-8gpu": Reference(1, 8, None, 1, "single-process", 2**20),
    "oci-spinup-gpu-cluster-61925d8-a100sxm40-2node-roce": Reference(2, 8, "roce-100g", 16, "per-process", 0),
    "azure-ndh100v5-h100sxm80-8gpu-nvls": Reference(1, 8, None, 1, "per-process", 2**20,
                                                    "nvswitch-h100", "H100-SXM"),
}


def reference_check(name: str, path) -> tuple[list[dict], list[tuple[int, float]], float]:
    """Simulate the all-reduce sizes of a shipped reference on its cluster:
    (simulated rows, reference rows, error as :func:`reference_error`)."""
    from ..hardware import builtin_profiles
    from oresearcher.comm import build_topology

    r = REFERENCES[name]
    cat = builtin_profiles()
    n = r.nodes * r.gpus_per_node
    topo = build_topology(n, r.gpus_per_node, cat["fabric", r.intra], cat["fabric", r.inter] if r.inter else None,
                          r.nics_per_node, r.launch)
    ref = read_reference(path, bus_factor("all_reduce", n))
    rows = collective_bench(topo, cat["device", r.device], "all_reduce", [s for s, _ in ref])
    return rows, ref, reference_error(rows, ref, r.min_size)


def default_sizes(lo: int = 8, hi: int = 8 * 2**30) -> list[int]:
    sizes, s = [], lo
    while s <= hi:
        sizes.append(s)
        s *= 2
    return sizes


def _program(op: str, size: int, n: int):
    elems = max(1, size // 4)
    if op == "all_reduce":
        yield O.AllReduce(torch.empty(elems, device="meta"), name=op)
    elif op == "all_gather":
        yield O.AllGather(torch.empty(max(1, elems // n), device="meta"), name=op)
    elif op == "reduce_scatter":
        yield O.ReduceScatter(torch.empty(max(n, elems // n * n), device="meta"), name=op)
    elif op == "all_to_all":
        yield O.AllToAll([torch.empty(max(1, elems // n), device="meta")] * n, name=op)
    elif op == "broadcast":
        yield O.Broadcast(torch.empty(elems, device="meta"), src=0, name=op)
    yield O.StepDone(0)


def bench_cluster(scenario):
    """(device, topology) a collective benchmark of ``scenario`` runs on: one rank per GPU
    of its cluster, whatever its agents say."""
    from .simulate import build_cluster

    scenario = scenario.model_copy(update={"agents": scenario.agents.model_copy(
        update={"count": scenario.cluster.world_size, "roles": None, "architectures": []})})
    return build_cluster(scenario)


def collective_bench(topo, device, op: str, sizes=None, algorithm: str = "auto") -> list[dict]:
    """One row per size: size_bytes, time_us, algbw_GBps, busbw_GBps, algorithm."""
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}; choose one of {', '.join(OPS)}")
    n = topo.world_size
    rows = []
    for size in sizes or default_sizes():
        eng = Engine(topo, device, "fp32", algorithm)
        tl = eng.run([_program(op, size, n) for _ in range(n)])
        t = max(tl.step_ends[r][-1] for r in range(n))
        algos = sorted({s.args.get("algorithm") for s in tl.spans if s.cat == "comm"})
        algbw = Bps_to_GBps(size / t) if t > 0 else 0.0
        rows.append({"size_bytes": size, "ranks": n, "time_us": s_to_us(t), "algbw_GBps": algbw,
                     "busbw_GBps": algbw * bus_factor(op, n), "algorithm": ",".join(a for a in algos if a)})
    return rows


def read_reference(path, busbw_factor: Optional[float] = None) -> list[tuple[int, float]]:
    """(size bytes, time us) rows of a published curve: a ``size_bytes,time_us,...`` CSV
    after ``#`` comment lines, as tests/data/nccl-*.csv, or raw nccl-tests output (rows of
    ``size count type redop root time algbw busbw ...``; out-of-place time). A CSV row that
    gives only ``busbw_GBps`` is timed as size x ``busbw_factor`` / busbw (nccl-tests'
    definition), so such a curve needs the op's bus factor on its ranks."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p}: no such reference file")
    lines = [ln for ln in p.read_text(errors="replace").splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    rows = []
    if lines and lines[0].startswith("size_bytes"):
        for rec in csv.DictReader(io.StringIO("\n".join(lines))):
            try:
                rows.append((int(rec["size_bytes"]), _csv_time_us(rec, busbw_factor, p)))
            except (KeyError, TypeError, ValueError, ZeroDivisionError):
                raise UserError(f"{p}: bad row {rec}") from None
    else:
        for ln in lines:
            f = ln.split()
            if len(f) >= 6 and f[0].isdigit():
                try:
                    rows.append((int(f[0]), float(f[5])))
                except ValueError:
                    continue
    rows = [(s, t) for s, t in rows if s > 0 and t > 0 and math.isfinite(t)]
    if not rows:
        raise UserError(f"{p}: no (size, time) rows: expected a size_bytes,time_us CSV or nccl-tests output")
    return rows


def _csv_time_us(rec: dict, busbw_factor: Optional[float], p: Path) -> float:
    if (rec.get("time_us") or "").strip():
        return float(rec["time_us"])
    if busbw_factor is None:
        raise UserError(f"{p}: rows give busbw only; the op's bus factor on its ranks is needed to time them")
    return s_to_us(int(rec["size_bytes"]) * busbw_factor / GBps_to_Bps(float(rec["busbw_GBps"])))


def reference_error(rows: list[dict], ref: list[tuple[int, float]], min_size: int = 0) -> float:
    """exp(mean |ln(simulated / measured)|) - 1 over the sizes both have (>= min_size)."""
    sim = {r["size_bytes"]: r["time_us"] for r in rows}
    logs = [abs(math.log(sim[s] / t)) for s, t in ref if s in sim and s >= min_size]
    if not logs:
        raise UserError("the reference and the simulated sizes have no size in common")
    return math.exp(sum(logs) / len(logs)) - 1


def bench_png(op: str, rows: list[dict], path, title: str, refs=()) -> None:
    """Time and bus bandwidth against size; reference curves ``(label, rows)`` overlaid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(10, 3.8))
    sizes = [r["size_bytes"] for r in rows]
    ax_t.plot(sizes, [r["time_us"] for r in rows], "o-", label="simulated", ms=3)
    ax_b.semilogx(sizes, [r["busbw_GBps"] for r in rows], "o-", base=2, label="simulated", ms=3)
    n = rows[0].get("ranks", 1) if rows else 1
    for label, ref in refs:
        xs = [s for s, _ in ref]
        ax_t.plot(xs, [t for _, t in ref], "s--", label=label, ms=3)
        ax_b.semilogx(xs, [Bps_to_GBps(s / us_to_s(t)) * bus_factor(op, n) for s, t in ref], "s--", base=2, label=label, ms=3)
    ax_t.set_xscale("log", base=2)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time (us)")
    ax_b.set_ylabel("bus bandwidth (GB/s)")
    for ax in (ax_t, ax_b):
        ax.set_xlabel("message size (bytes)")
        ax.grid(alpha=0.3, which="both")
    ax_b.legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    from oresearcher.files import save_figure

    save_figure(fig, path, dpi=110)  # atomic, never through a link
