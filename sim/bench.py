"""nccl-tests-style collective benchmark on the modelled cluster.

Each size runs the collective once on all ranks of the scenario's cluster through the
event-driven engine. Columns follow nccl-tests (doc/PERFORMANCE.md): ``size`` is the
total buffer (for all_gather the gathered output, for reduce_scatter the input),
algbw = size / time, busbw = algbw x factor with factor 2(n-1)/n for all_reduce,
(n-1)/n for all_gather, reduce_scatter and alltoall, 1 for broadcast.
"""
from __future__ import annotations

import torch

from oresearcher import ops as O

from .engine import Engine

OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast")


def bus_factor(op: str, n: int) -> float:
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op == "broadcast":
        return 1.0
    return (n - 1) / n


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
    elif op == "alltoall":
        yield O.AllToAll([torch.empty(max(1, elems // n), device="meta")] * n, name=op)
    elif op == "broadcast":
        yield O.Broadcast(torch.empty(elems, device="meta"), src=0, name=op)
    yield O.StepDone(0)


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
        algbw = size / t / 1e9 if t > 0 else 0.0
        rows.append({"size_bytes": size, "time_us": t * 1e6, "algbw_GBps": algbw,
                     "busbw_GBps": algbw * bus_factor(op, n), "algorithm": ",".join(a for a in algos if a)})
    return rows
