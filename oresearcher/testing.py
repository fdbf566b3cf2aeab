"""A slow, obvious reference interpreter for agent programs (one process, no clock).

It runs every rank's program round-robin, executes Compute ops immediately and resolves
a collective once every member of its group has issued it, using the one definition of
collective results in :func:`oresearcher.ops.collective_results`. The simulator's
numeric mode and the torch.distributed backend are tested against it.

Matching rule (the same as torch.distributed's): the k-th collective a rank issues on
a group pairs with the k-th collective every other member issues on that group. Sends
and receives between a pair of ranks pair in FIFO order.
"""
from __future__ import annotations

from collections import defaultdict, deque
from typing import Generator, Sequence

from . import ops as O
from .ops import tap  # noqa: F401 (tests import it from here)


class Deadlock(RuntimeError):
    pass


class _Pending:
    __slots__ = ("op", "ops", "results", "done")

    def __init__(self, op):
        self.op, self.ops, self.results, self.done = op, {}, None, False


def run_programs(programs: Sequence[Generator]) -> list[list[O.StepDone]]:
    """Run one program per rank to completion; returns each rank's StepDone records."""
    world = len(programs)
    gens = list(programs)
    send_val = [None] * world
    blocked = [None] * world  # None | ("wait", pending, rank) | ("recv", src)
    finished = [False] * world
    seq = defaultdict(int)  # (rank, group) -> number of collectives issued
    pending = {}  # (group, k) -> _Pending
    mailbox = defaultdict(deque)  # (src, dst) -> tensors
    steps = [[] for _ in range(world)]

    def issue(rank, op):
        group = O.resolve_group(op.group, world)
        if rank not in group:
            raise O.not_in_group(rank, op.kind, group)
        key = (group, seq[rank, group])
        seq[rank, group] += 1
        p = pending.setdefault(key, _Pending(op))
        if type(p.op) is not type(op):
            raise O.ProgramError(f"collective mismatch on group {group}: {p.op.kind} vs {op.kind}")
        p.ops[rank] = op
        if len(p.ops) == len(group):
            p.results = dict(zip(group, O.collective_results(op.kind, [p.ops[r] for r in group], group)))
            p.done = True
            del pending[key]
        return p

    def advance(rank):
        """Run rank's program until it blocks or ends."""
        while True:
            try:
                op = gens[rank].send(send_val[rank])
            except StopIteration:
                finished[rank] = True
                return
            send_val[rank] = None
            if isinstance(op, O.Compute):
                send_val[rank] = op.fn(*op.args, **op.kwargs) if op.fn else None
            elif isinstance(op, O.StepDone):
                steps[rank].append(op)
            elif isinstance(op, O.Collective):
                p = issue(rank, op)
                if op.async_op:
                    send_val[rank] = O.Handle(op, token=p)
                else:
                    blocked[rank] = ("wait", p, rank)
                    return
            elif isinstance(op, O.Wait):
                if not isinstance(getattr(op.handle, "token", None), _Pending):
                    raise O.not_a_handle(rank, getattr(op.handle, "token", None))
                blocked[rank] = ("wait", op.handle.token, rank)
                return
            elif isinstance(op, O.Send):
                mailbox[rank, op.dst].append(op.tensor.clone())
            elif isinstance(op, O.Recv):
                blocked[rank] = ("recv", op.src)
                return
            else:
                raise O.not_an_op(rank, op)

    def try_unblock(rank) -> bool:
        b = blocked[rank]
        if b[0] == "wait" and b[1].done:
            send_val[rank] = b[1].results[rank]
        elif b[0] == "recv" and mailbox[b[1], rank]:
            send_val[rank] = mailbox[b[1], rank].popleft()
        else:
            return False
        blocked[rank] = None
        return True

    for r in range(world):
        advance(r)
    while not all(finished):
        progress = False
        for r in range(world):
            if not finished[r] and blocked[r] is not None and try_unblock(r):
                advance(r)
                progress = True
        if not progress:
            raise Deadlock(f"no rank can proceed; blocked: {[b and b[0] for b in blocked]}")
    return steps

