"""Agent programs that exercise every op, for the backend's numeric-equality tests.

``exercise(rank, world, out)`` appends each result it receives to ``out`` so the same
program can run under the reference interpreter (oresearcher.testing) and under
torch.distributed, and the two result lists can be compared entry by entry.
Integer-valued inputs must agree exactly; ``random`` entries within fp32 tolerance.
"""
from __future__ import annotations

import torch

from oresearcher import ops as O


def ints(rank: int, shape, salt: int = 0, dtype=torch.float32) -> torch.Tensor:
    """Deterministic integer-valued tensor for ``rank`` (exact under any summation order)."""
    g = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randint(-50, 50, shape, generator=g).to(dtype)


def floats(rank: int, shape, salt: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(7919 * (salt + 1) + rank)
    return torch.randn(shape, generator=g)


_GROUPS: dict = {}


def group(*ranks) -> tuple:
    """One tuple object per group: the simulator's engine (as of this writing) matches
    groups by object identity, so ranks of one process must share the object."""
    return _GROUPS.setdefault(ranks, ranks)


def exercise(rank: int, world: int, out: list):
    """Yield one of everything; record ("exact"|"close", name, result) in ``out``."""
    def rec(kind, name, value):
        out.append((kind, name, value))

    for i, op in enumerate(("sum", "avg", "max", "min")):
        rec("exact", f"all_reduce_{op}", (yield O.AllReduce(ints(rank, (5, 3), i), op=op)))
    rec("close", "all_reduce_random", (yield O.AllReduce(floats(rank, (257,)), op="sum")))
    rec("close", "all_reduce_avg_random", (yield O.AllReduce(floats(rank, (64,), 1), op="avg")))
    rec("exact", "all_reduce_int64", (yield O.AllReduce(ints(rank, (6,), 9, torch.int64))))
    rec("exact", "all_reduce_int64_avg", (yield O.AllReduce(ints(rank, (6,), 9, torch.int64), op="avg")))
    rec("exact", "all_reduce_bf16", (yield O.AllReduce(ints(rank, (8,), 3, torch.bfloat16))))
    rec("exact", "reduce_scatter_sum", (yield O.ReduceScatter(ints(rank, (2 * world, 3), 4))))
    rec("exact", "reduce_scatter_avg", (yield O.ReduceScatter(ints(rank, (world, 2), 5), op="avg")))
    rec("exact", "all_gather", (yield O.AllGather(ints(rank, (4,), 6))))
    rec("exact", "all_to_all", (yield O.AllToAll([ints(rank, (3,), 10 + j) for j in range(world)])))
    rec("exact", "broadcast", (yield O.Broadcast(ints(rank, (2, 2), 7), src=world - 1)))
    # async: two in flight, waited in reverse order, compute in between
    h1 = yield O.AllReduce(ints(rank, (1000,), 11), async_op=True, name="async_a")
    h2 = yield O.AllGather(ints(rank, (5,), 12), async_op=True, name="async_b")
    rec("exact", "compute", (yield O.Compute(lambda a, b: a * b, rank + 2, 3, name="mul")))
    rec("exact", "async_b", (yield O.Wait(h2)))
    rec("exact", "async_a", (yield O.Wait(h1)))
    # a subgroup: the first two ranks; the rest, when there are enough, form another
    pair = group(0, 1)
    if rank in pair:
        rec("exact", "group_pair", (yield O.AllReduce(ints(rank, (4,), 13), group=pair)))
    elif world >= 4:
        rec("exact", "group_rest", (yield O.AllReduce(ints(rank, (4,), 14), group=group(*range(2, world)))))
    # point to point around the ring; even ranks send first, so it also runs where a
    # send waits for its receiver (the simulator)
    send = O.Send(ints(rank, (3,), 15), dst=(rank + 1) % world)
    recv = O.Recv(torch.empty(3), src=(rank - 1) % world)
    if rank % 2 == 0:
        yield send
        rec("exact", "recv", (yield recv))
    else:
        rec("exact", "recv", (yield recv))
        yield send
    yield O.Barrier()
    yield O.StepDone(0, {"loss": float(rank), "role": "explorer"})
    rec("exact", "world_after_group", (yield O.AllReduce(torch.full((2,), float(rank + 1)), op="sum")))
    yield O.StepDone(1, {"loss": 0.5})
