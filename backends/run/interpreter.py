"""The op interpreter of the real backend: each op of an agent program becomes a
torch.distributed call, and every op is timed into a :class:`~oresearcher.reporting.report.Timeline`.

One :class:`Interpreter` runs one rank's program. Results follow the one definition in
:func:`oresearcher.ops.collective_results`; differences from the simulator's numeric mode
are limited to floating-point summation order (gloo reduces in ring order).

Timing (what the report's figures are made of, see :mod:`oresearcher.reporting.report`):

- Compute: a "compute" span around ``fn``; on CUDA the compute stream is synchronised
  before the span closes so the span holds the kernels, not just their launch. The
  blocking collectives ``fn`` issued itself (FSDP2's, :mod:`oresearcher.backends.fsdp.comm`)
  are cut out of it as "comm" and "blocked" spans when ``inner_collectives`` is on.
- Collective: a "comm" span from issue to completion, carrying the wire bytes the
  algorithm moves. Completion is read from ``is_completed()`` at every op boundary and
  at the Wait, so for async work it is an upper bound by at most the op that ran while
  it finished. (A Python callback on the work's future would be exact, but a future
  holding Python objects that a gloo thread frees during interpreter shutdown aborts
  the process.)
- A blocking collective (from its issue), a Wait or a Recv adds a "blocked" span: the
  rank could not compute. Issuing an async collective or a send (copying the payload,
  enqueueing the work) is a short "blocked" span too. Together: the *exposed*
  communication.

gloo has no ``ReduceOp.AVG``: "avg" is a sum followed by a division by the group size,
as :func:`oresearcher.ops.reduce_tensors` defines it.
"""
from __future__ import annotations

import functools
import logging
import time
from contextlib import nullcontext
from typing import Callable, Optional

import torch
import torch.distributed as dist

from oresearcher import ops as O
from oresearcher.reporting.report import Span, Timeline
from oresearcher.comm.wire import wire_bytes

log = logging.getLogger(__name__)

_REDUCE = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


@functools.lru_cache(maxsize=4096)
class Groups:
    """Process groups by rank tuple, created on first use.

    ``use_local_synchronization`` lets only the members create a group, so programs may
    form groups in whatever order they meet them (torch >= 2.1).
    """

    def __init__(self, world_size: int):
        self.world_size = world_size
        self._groups: dict[tuple, object] = {}

    def get(self, ranks: tuple):
        if len(ranks) == self.world_size:
            return None  # the default (world) group
        if ranks not in self._groups:
            self._groups[ranks] = dist.new_group(list(ranks), use_local_synchronization=True)
        return self._groups[ranks]


_UNSET = object()


class InFlight:
    """One issued collective or send: its work object, how to finish its result, timing."""

    __slots__ = ("op", "work", "_finish", "start", "end", "wire", "rank", "recorded", "_result")

    def __init__(self, op, work, finish: Callable, start: float, wire: int, rank: int):
        self.op, self.work, self._finish, self.start = op, work, finish, start
        self.end: Optional[float] = None
        self.wire, self.rank, self.recorded = wire, rank, False
        self._result = _UNSET

    def finish(self):
        """The op's result; computed once (an "avg" divides its buffer in place)."""
        if self._result is _UNSET:
            self._result = self._finish()
        return self._result


class Interpreter:
    """Runs one rank's program on torch.distributed.

    clock: seconds since the run's common start (ranks start after a barrier).
    on_step(step, metrics, stats): called at every StepDone; ``stats`` holds this step's
    duration, compute, exposed communication and wire bytes of this rank, and the FLOPs
    and number of its Compute ops.
    step_offset: added to StepDone steps (a resumed run continues the numbering).
    autocast: a context-manager factory wrapped around Compute (mixed precision), or None.
    inner_collectives: split the collectives a Compute issued itself (FSDP2's, recorded by
    :mod:`oresearcher.backends.fsdp.comm`) out of its compute span as communication; off,
    a Compute is timed whole (calibration measures whole ops).
    """

    def __init__(self, rank: int, world_size: int, *, device: torch.device, timeline: Timeline,
                 clock: Callable[[], float], backend: str = "gloo",
                 on_step: Optional[Callable] = None, step_offset: int = 0,
                 autocast: Optional[Callable] = None, record_functions: bool = False,
                 inner_collectives: bool = False):
        self.rank, self.world_size, self.device = rank, world_size, torch.device(device)
        self.tl, self.clock, self.backend = timeline, clock, backend
        self.on_step, self.step_offset, self.autocast = on_step, step_offset, autocast
        self.record_functions = record_functions
        self.inner_collectives = inner_collectives  # a run's report: FSDP2's own collectives split out
        self.groups = Groups(world_size)
        self.inflight: list[InFlight] = []
        self._native_avg = backend == "nccl"
        self._step_start = None
        self._acc = _fresh_acc()

    # ---- driving the program -------------------------------------------------------
    def run(self, program) -> None:
        """Run ``program`` (a generator of ops) to its end, then finish pending work."""
        send = None
        self._step_start = self.clock()
        while True:
            try:
                op = program.send(send)
            except StopIteration:
                break
            self._poll()
            with self._label(op):
                send = self.execute(op)
        self.drain()

    def execute(self, op):
        """Interpret one op and return its result (what ``yield op`` evaluates to)."""
        if isinstance(op, O.Compute):
            return self._compute(op)
        if isinstance(op, O.Collective):
            inflight = self._issue(op)
            if op.async_op:
                self._blocked("issue:" + op.name, inflight.start, self.clock())
                return O.Handle(op, token=inflight)
            return self._wait(inflight, "blocked:" + op.name, since=inflight.start)
        if isinstance(op, O.Wait):
            return self._wait(op.handle.token, "blocked:" + op.handle.op.name)
        if isinstance(op, O.Send):
            return self._send(op)
        if isinstance(op, O.Recv):
            return self._recv(op)
        if isinstance(op, O.StepDone):
            return self._step_done(op)
        raise O.not_an_op(self.rank, op)

    def drain(self) -> None:
        """Wait for every collective and send still in flight (a program may not Wait)."""
        for f in list(self.inflight):
            self._complete(f)
        self.inflight.clear()

    def close(self) -> None:
        """Forget pending work and process groups (before the groups are destroyed).

        After a normal end :meth:`run` has drained everything; after a failure the
        work is abandoned rather than waited on (a lost peer would fail or hang it).
        """
        self.inflight.clear()
        self.groups = Groups(self.world_size)

    def _label(self, op):
        if not self.record_functions:
            return nullcontext()
        return torch.profiler.record_function(getattr(op, "name", type(op).__name__))

    # ---- compute ---------------------------------------------------------------------
    def _sync_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def _compute(self, op: O.Compute):
        t0 = self.clock()
        if op.fn is None:
            value = None
        else:
            with self.autocast() if self.autocast else nullcontext():
                value = op.fn(*op.args, **op.kwargs)
            self._sync_device()
        t1 = self.clock()
        blocked = self._compute_spans(op.name, t0, t1)
        self._acc["compute"] += t1 - t0 - blocked
        self._acc["flops"] += op.flops
        self._acc["ops"] += 1
        return value

    def _compute_spans(self, name: str, t0: float, t1: float) -> float:
        """The Compute's spans: compute, except where a collective issued from inside it
        (FSDP2's own, :mod:`oresearcher.backends.fsdp.comm`) held the rank, which is
        communication in flight and blocked. Returns the blocked seconds."""
        from oresearcher.backends.fsdp import comm as fsdp_comm

        inner = fsdp_comm.drain()  # drained either way: the log never outlives the op
        if not inner or not self.inner_collectives:  # calibration times whole Compute ops
            self.tl.add(Span(self.rank, "compute", name, t0, t1))
            return 0.0
        shift = self.clock() - time.perf_counter()  # the log's perf_counter seconds on this clock
        cursor, blocked = t0, 0.0
        for cname, a, b, wire in sorted(inner, key=lambda c: c[1]):
            a = min(max(a + shift, cursor), t1)
            b = min(max(b + shift, a), t1)
            if a > cursor:
                self.tl.add(Span(self.rank, "compute", name, cursor, a))
            self.tl.add(Span(self.rank, "comm", cname, a, b, wire_bytes=wire))
            self._acc["wire"] += wire
            self._blocked(cname, a, b)
            blocked += b - a
            cursor = b
        if t1 > cursor:
            self.tl.add(Span(self.rank, "compute", name, cursor, t1))
        return blocked

    # ---- collectives -----------------------------------------------------------------
    def _tensor(self, t: torch.Tensor) -> torch.Tensor:
        if t is None or t.device.type == "meta":
            raise O.ProgramError(f"rank {self.rank}: a collective payload is a meta tensor or None; "
                             "real runs need learners built with mode='real'")
        return t.to(self.device).contiguous()

    def _issue(self, op: O.Collective) -> InFlight:
        group = O.resolve_group(op.group, self.world_size)
        if self.rank not in group:
            raise O.not_in_group(self.rank, op.kind, group)
        start = self.clock()  # a group's first use creates it (a rendezvous): communication too
        pg, n = self.groups.get(group), len(group)
        work, finish = self._call(op, pg, n)
        wire = wire_bytes(op.kind, "ring", O.payload_bytes(op), n)
        f = InFlight(op, work, finish, start, wire, self.rank)
        self._watch(f)
        return f

    def _reduce_op(self, op: str):
        if op == "avg":
            return dist.ReduceOp.AVG if self._native_avg else dist.ReduceOp.SUM
        return _REDUCE[op]

    def _averaged(self, t: torch.Tensor, op: str, n: int) -> torch.Tensor:
        if op != "avg" or self._native_avg:
            return t
        return t.div_(n) if t.is_floating_point() else t / n

    def _call(self, op: O.Collective, pg, n: int):
        """Issue ``op`` asynchronously; returns (work, finish) where finish() is the result."""
        if isinstance(op, O.AllReduce):
            buf = self._tensor(op.tensor).clone()
            work = dist.all_reduce(buf, op=self._reduce_op(op.op), group=pg, async_op=True)
            return work, lambda: self._averaged(buf, op.op, n)
        if isinstance(op, O.ReduceScatter):
            src = self._tensor(op.tensor)
            if src.shape[0] % n:
                raise O.ProgramError(f"ReduceScatter: dim 0 ({src.shape[0]}) not divisible by group size {n}")
            out = torch.empty((src.shape[0] // n, *src.shape[1:]), dtype=src.dtype, device=src.device)
            rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            work = rs(out, src, op=self._reduce_op(op.op), group=pg, async_op=True)
            return work, lambda: self._averaged(out, op.op, n)
        if isinstance(op, O.AllGather):
            src = self._tensor(op.tensor)
            outs = [torch.empty_like(src) for _ in range(n)]
            return dist.all_gather(outs, src, group=pg, async_op=True), lambda: outs
        if isinstance(op, O.AllToAll):
            O.check_all_to_all(op, n)
            srcs = [self._tensor(t) for t in op.tensors]
            outs = [torch.empty_like(t) for t in srcs]
            return dist.all_to_all(outs, srcs, group=pg, async_op=True), lambda: outs
        if isinstance(op, O.Broadcast):
            buf = self._tensor(op.tensor).clone()
            return dist.broadcast(buf, src=op.src, group=pg, async_op=True), lambda: buf
        if isinstance(op, O.Barrier):
            kw = {"device_ids": [self.device.index]} if self.device.type == "cuda" else {}
            return dist.barrier(group=pg, async_op=True, **kw), lambda: None
        raise O.ProgramError(f"unknown collective {op!r}")

    def _watch(self, f: InFlight) -> None:
        self.inflight.append(f)

    def _poll(self) -> None:
        """Note completions of in-flight work at an op boundary."""
        for f in self.inflight:
            if f.end is None and f.work is not None and f.work.is_completed():
                f.end = self.clock()

    def _complete(self, f: InFlight):
        if f.work is not None:
            f.work.wait()
            if self.device.type == "cuda":
                self._sync_device()
            # drop the work now, in this thread: a work (and the tensors it holds) freed
            # later by a gloo thread during interpreter shutdown aborts the process
            f.work = None
        now = self.clock()
        if f.end is None or f.end > now:
            f.end = now
        if not f.recorded:
            f.recorded = True
            self.tl.add(Span(self.rank, "comm", f.op.name, f.start, f.end, wire_bytes=f.wire))
            self._acc["wire"] += f.wire
            if f in self.inflight:
                self.inflight.remove(f)
        return f.finish()

    def _wait(self, f: InFlight, label: str, since: Optional[float] = None):
        """Complete ``f``; the rank is blocked from ``since`` (default: now) until it is done."""
        if not isinstance(f, InFlight):
            raise O.not_a_handle(self.rank, f)
        t0 = self.clock() if since is None else since
        result = self._complete(f)
        self._blocked(label, t0, self.clock())
        return result

    def _blocked(self, label: str, t0: float, t1: float) -> None:
        self.tl.add(Span(self.rank, "blocked", label, t0, t1))
        self._acc["blocked"] += t1 - t0

    # ---- point to point --------------------------------------------------------------
    def _send(self, op: O.Send):
        # Send never blocks the program (as in the reference interpreter); the tensor is
        # kept alive in the in-flight list until the receiver has it.
        start = self.clock()
        t = self._tensor(op.tensor).clone()
        work = dist.isend(t, op.dst)
        f = InFlight(op, work, lambda: None, start, O.tensor_bytes(t), self.rank)
        self._watch(f)
        self._blocked("issue:" + op.name, start, self.clock())
        return None

    def _recv(self, op: O.Recv):
        start = self.clock()
        buf = torch.empty_like(self._tensor(op.tensor))
        f = InFlight(op, dist.irecv(buf, op.src), lambda: buf, start, 0, self.rank)
        self.inflight.append(f)
        return self._wait(f, "blocked:" + op.name, since=start)

    # ---- steps -----------------------------------------------------------------------
    def _step_done(self, op: O.StepDone):
        now = self.clock()
        step = op.step + self.step_offset
        metrics = {k: _scalar(v) for k, v in op.metrics.items()}
        self.tl.step_done(self.rank, step, now, metrics)
        stats = {"duration_s": now - self._step_start, "compute_s": self._acc["compute"],
                 "exposed_comm_s": self._acc["blocked"], "wire_bytes": self._acc["wire"],
                 "compute_flops": self._acc["flops"], "compute_ops": self._acc["ops"]}
        self._acc = _fresh_acc()
        if self.on_step is not None:
            self.on_step(step, metrics, stats)
        self._step_start = self.clock()  # time spent in on_step (checkpoints) is not a step's
        return None


def _fresh_acc() -> dict:
    """Per-step accumulators: seconds computing and blocked, wire bytes, the FLOPs the
    Compute ops declared (what the simulator would charge) and how many there were."""
    return {"compute": 0.0, "blocked": 0.0, "wire": 0, "flops": 0.0, "ops": 0}


def _scalar(v):
    """Metrics are scalars: tensors become Python numbers; strings (roles) stay."""
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return v.item()
    return v


def make_clock() -> Callable[[], float]:
    """A monotonic clock that reads 0 now; ranks call it right after a common barrier."""
    t0 = time.perf_counter()
    return lambda: time.perf_counter() - t0
