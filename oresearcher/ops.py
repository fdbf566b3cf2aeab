"""The ops vocabulary: everything an agent program may ask a backend to do.

An agent program is a generator that yields ops and receives each op's result:

    def data_parallel_step(ctx, batch):
        grads = yield Compute(ctx.forward_backward, batch, flops=ctx.step_flops)
        summed = yield AllReduce(grads, group=ctx.peers)
        ctx.apply(summed)
        yield StepDone(ctx.step, {"loss": ...})

Backends interpret the ops: the SimPy simulator (``oresearcher.sim``) prices them on a
modelled cluster and, in numeric mode, computes their results exactly as
torch.distributed would; the real backend (``oresearcher.backends``) executes them
with torch.distributed and times them; ``oresearcher.testing`` is a slow, obvious
reference interpreter used by the tests.

Vocabulary (defined here, once):

- *rank*: the index of one agent program in the world, 0..world_size-1.
- *group*: a tuple of ranks taking part in a collective; ``None`` means the world.
  Every member must issue the same collective, in the same order, with tensors of the
  same shape (as torch.distributed requires).
- *payload*: the tensors a collective moves. In *shape mode* they live on the meta
  device and only their sizes matter; in *numeric mode* they hold values.
- *wire bytes*: ``numel * element_size`` of a payload tensor; what a collective moves
  is derived from it by the collective algorithm.
- *async*: a collective with ``async_op=True`` yields back a :class:`Handle`
  immediately; ``yield Wait(handle)`` blocks until the collective finishes and returns
  its result. This is how bucketed gradient communication overlaps backward compute.

Result of each op (what ``yield op`` evaluates to):

============  ==============================================================
Compute       ``fn(*args, **kwargs)``; ``None`` if ``fn`` is ``None``
Swap          as Compute (moves an agent's state between device and host memory)
AllReduce     the reduced tensor (new tensor; the input is not modified)
ReduceScatter this rank's chunk of the reduced tensor (``tensor`` is split into
              ``len(group)`` equal chunks along dim 0, in group order)
AllGather     list of the members' tensors, in group order
AllToAll      list: element j is what group member j sent to this rank
Broadcast     the root's tensor
Send          ``None``, at once: sends are buffered; the data moves when the
              matching Recv is posted
Recv          the tensor sent by ``src``
Barrier       ``None``
Wait          the result of the awaited collective
StepDone      ``None`` (marks the end of a training step; carries metrics)
============  ==============================================================
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Optional, Sequence

import torch

Group = Optional[Sequence[int]]

REDUCE_OPS = ("sum", "avg", "max", "min")


class ProgramError(ValueError):
    """A mistake in an agent program, named alike by every interpreter (the simulator,
    the real backend, :mod:`oresearcher.testing`): it yielded something that is not an op,
    built an op with bad arguments (a reduce op, an AllToAll without one tensor per
    member), used a group that does not exist or that it is not in, waited on something
    that is not a handle, or the members of a group disagree (different collectives,
    indivisible ReduceScatter). A ValueError, so older ``except ValueError`` still hold."""


@dataclass(eq=False)
class Op:
    """Base class of every op. ``name`` labels the op in traces and breakdowns."""


@dataclass(eq=False)
class Compute(Op):
    """Run ``fn(*args, **kwargs)`` locally.

    ``flops`` is what the simulator charges (time = flops / (peak * efficiency) plus the
    device's per-call host overhead); the real backend ignores it and times ``fn``.
    Programs get their FLOP counts from ``torch.utils.flop_counter`` measurements
    (see ``oresearcher.models.workloads``), never from hand formulas.
    """

    fn: Optional[Callable[..., Any]] = None
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    flops: float = 0.0
    name: str = "compute"

    def __init__(self, fn=None, *args, flops: float = 0.0, name: str = "compute", **kwargs):
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.flops, self.name = float(flops), name


@dataclass(eq=False, init=False)
class Swap(Compute):
    """Move an agent's state between device and host memory: ``nbytes`` each way it
    moves. The simulator prices it at the device's host link (sim/swap.py), not by FLOPs;
    real backends run ``fn(*args)`` (the real copy) and time it, as any Compute."""

    nbytes: float = 0.0

    def __init__(self, fn=None, args: tuple = (), *, nbytes: float, name: str = "swap"):
        super().__init__(fn, *args, name=name)
        self.nbytes = nbytes


@dataclass(eq=False)
class Collective(Op):
    """Common fields of the collective ops."""

    group: Group = None
    async_op: bool = False
    algorithm: Optional[str] = None  # None: the backend chooses (e.g. scenario's 'auto')
    name: str = ""

    @property
    def kind(self) -> str:
        return type(self).__name__


@dataclass(eq=False)
class AllReduce(Collective):
    tensor: torch.Tensor = None
    op: str = "sum"

    def __init__(self, tensor, group=None, op="sum", async_op=False, algorithm=None, name=""):
        if op not in REDUCE_OPS:
            raise ProgramError(f"AllReduce op must be one of {REDUCE_OPS}, got {op!r}")
        self.tensor, self.group, self.op = tensor, group, op
        self.async_op, self.algorithm, self.name = async_op, algorithm, name or "all_reduce"


@dataclass(eq=False)
class ReduceScatter(Collective):
    tensor: torch.Tensor = None  # full-size input; dim 0 divisible by len(group)
    op: str = "sum"

    def __init__(self, tensor, group=None, op="sum", async_op=False, algorithm=None, name=""):
        if op not in REDUCE_OPS:
            raise ProgramError(f"ReduceScatter op must be one of {REDUCE_OPS}, got {op!r}")
        self.tensor, self.group, self.op = tensor, group, op
        self.async_op, self.algorithm, self.name = async_op, algorithm, name or "reduce_scatter"


@dataclass(eq=False)
class AllGather(Collective):
    tensor: torch.Tensor = None

    def __init__(self, tensor, group=None, async_op=False, algorithm=None, name=""):
        self.tensor, self.group = tensor, group
        self.async_op, self.algorithm, self.name = async_op, algorithm, name or "all_gather"


@dataclass(eq=False)
class AllToAll(Collective):
    tensors: list = None  # tensors[j] goes to group member j; all the same shape

    def __init__(self, tensors, group=None, async_op=False, algorithm=None, name=""):
        self.tensors, self.group = list(tensors), group
        self.async_op, self.algorithm, self.name = async_op, algorithm, name or "all_to_all"


@dataclass(eq=False)
class Broadcast(Collective):
    tensor: torch.Tensor = None  # on non-root ranks: a tensor of the right shape/dtype
    src: int = 0  # global rank of the root

    def __init__(self, tensor, src=0, group=None, async_op=False, algorithm=None, name=""):
        self.tensor, self.src, self.group = tensor, src, group
        self.async_op, self.algorithm, self.name = async_op, algorithm, name or "broadcast"


@dataclass(eq=False)
class Barrier(Collective):
    def __init__(self, group=None, name=""):
        self.group, self.async_op, self.algorithm, self.name = group, False, None, name or "barrier"


@dataclass(eq=False)
class Send(Op):
    tensor: torch.Tensor = None
    dst: int = 0
    name: str = "send"

    def __init__(self, tensor, dst, name="send"):
        self.tensor, self.dst, self.name = tensor, dst, name


@dataclass(eq=False)
class Recv(Op):
    tensor: torch.Tensor = None  # a tensor of the expected shape and dtype
    src: int = 0
    name: str = "recv"

    def __init__(self, tensor, src, name="recv"):
        self.tensor, self.src, self.name = tensor, src, name


@dataclass(eq=False)
class Handle:
    """What an async collective yields back; pass it to :class:`Wait`."""

    op: Collective
    token: Any = None  # backend-private


@dataclass(eq=False)
class Wait(Op):
    handle: Handle = None
    name: str = "wait"

    def __init__(self, handle, name="wait"):
        self.handle, self.name = handle, name


@dataclass(eq=False)
class StepDone(Op):
    """End of training step ``step`` on this rank; ``metrics`` are scalars to record."""

    step: int = 0
    metrics: dict = field(default_factory=dict)

    def __init__(self, step, metrics=None):
        self.step, self.metrics = int(step), dict(metrics or {})


COLLECTIVES = (AllReduce, ReduceScatter, AllGather, AllToAll, Broadcast, Barrier)

# An agent program's running generator: yields ops, is sent each op's result, may return a
# value (sub-programs return theirs through ``yield from``). What a program function
# (``program(ctx, learner)``, :data:`oresearcher.programs.ProgramFn`) returns.
Program = Generator[Op, Any, Any]


def payload_bytes(op: Op) -> int:
    """Bytes of this rank's payload for ``op`` (input size, before any algorithm)."""
    if isinstance(op, AllToAll):
        return sum(tensor_bytes(t) for t in op.tensors)
    t = getattr(op, "tensor", None)
    return 0 if t is None else tensor_bytes(t)


def tensor_bytes(t: torch.Tensor) -> int:
    """``numel * element_size``; works for meta tensors (shape mode)."""
    return t.numel() * t.element_size()


def resolve_group(group: Group, world_size: int) -> tuple:
    """The group as a sorted tuple of ranks; ``None`` is the whole world."""
    if group is None:
        return tuple(range(world_size))
    ranks = tuple(sorted(int(r) for r in group))
    if len(set(ranks)) != len(ranks) or not ranks or ranks[0] < 0 or ranks[-1] >= world_size:
        raise ProgramError(f"bad group {tuple(group)} for world size {world_size}")
    return ranks


def reduce_tensors(tensors: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """Reduce the members' tensors in group order, as torch.distributed defines it.

    Sums of integer-valued floats are exact regardless of order; other sums agree with
    torch.distributed within floating-point tolerance. Meta tensors give a meta result.
    """
    first = tensors[0]
    if first.device.type == "meta":
        return torch.empty_like(first)
    if op in ("sum", "avg"):
        out = first.clone()
        for t in tensors[1:]:
            out.add_(t)
        if op == "avg":
            out = out / len(tensors) if not out.is_floating_point() else out.div_(len(tensors))
        return out
    stacked = torch.stack(list(tensors))
    return stacked.amax(0) if op == "max" else stacked.amin(0)


def collective_results(op_kind: str, inputs: Sequence[Collective], group: tuple) -> list:
    """Results of one collective for every member, in group order.

    ``inputs[i]`` is the op issued by ``group[i]``. Shared by the simulator's numeric
    mode and the reference interpreter so both follow one definition.
    """
    n = len(group)
    if op_kind == "AllToAll":
        for o in inputs:
            check_all_to_all(o, n)
    if op_kind != "Barrier" and _is_meta(inputs[0]):
        return _meta_results(op_kind, inputs, n)
    if op_kind == "AllReduce":
        red = reduce_tensors([o.tensor for o in inputs], inputs[0].op)
        return [red if i == 0 else red.clone() for i in range(n)]
    if op_kind == "ReduceScatter":
        red = reduce_tensors([o.tensor for o in inputs], inputs[0].op)
        if red.shape[0] % n:
            raise ProgramError(f"ReduceScatter: dim 0 ({red.shape[0]}) not divisible by group size {n}")
        return [c.clone() for c in red.chunk(n, dim=0)]
    if op_kind == "AllGather":
        gathered = [o.tensor for o in inputs]
        return [[t.clone() for t in gathered] for _ in range(n)]
    if op_kind == "AllToAll":
        return [[inputs[j].tensors[i].clone() for j in range(n)] for i in range(n)]
    if op_kind == "Broadcast":
        src = inputs[0].src
        if src not in group:
            raise ProgramError(f"Broadcast root {src} not in group {group}")
        root = inputs[group.index(src)].tensor
        return [root.clone() for _ in range(n)]
    if op_kind == "Barrier":
        return [None] * n
    raise ProgramError(f"unknown collective {op_kind}")


def check_all_to_all(op: AllToAll, n: int) -> None:
    """ProgramError unless ``op`` holds one tensor per member of its group of ``n``."""
    if len(op.tensors) != n:
        raise ProgramError(f"AllToAll: {len(op.tensors)} tensors for a group of {n}")


def not_an_op(rank: int, op) -> ProgramError:
    return ProgramError(f"rank {rank} yielded {op!r}, which is not an op")


def not_in_group(rank: int, kind: str, group) -> ProgramError:
    return ProgramError(f"rank {rank} issued {kind} on group {group} it is not in")


def not_a_handle(rank: int, token) -> ProgramError:
    return ProgramError(f"rank {rank}: Wait on {token!r}, which is not a handle of this backend")


def _is_meta(op) -> bool:
    t = op.tensors[0] if isinstance(op, AllToAll) else op.tensor
    return t.device.type == "meta"


def _meta_results(op_kind: str, inputs, n: int) -> list:
    """Shape-mode results: sizes only, one shared meta tensor per distinct output."""
    first = inputs[0]
    if op_kind in ("AllReduce", "Broadcast"):
        return [torch.empty_like(first.tensor)] * n
    if op_kind == "ReduceScatter":
        if first.tensor.shape[0] % n:
            raise ProgramError(f"ReduceScatter: dim 0 ({first.tensor.shape[0]}) not divisible by group size {n}")
        t = first.tensor
        return [t.new_empty((t.shape[0] // n, *t.shape[1:]))] * n
    if op_kind == "AllGather":
        return [[o.tensor for o in inputs]] * n
    if op_kind == "AllToAll":
        return [[inputs[j].tensors[i] for j in range(n)] for i in range(n)]
    raise ProgramError(f"unknown collective {op_kind}")


def tap(gen: Program, on_op: Callable[[Op], None]) -> Program:
    """Pass ``gen``'s ops through unchanged, calling ``on_op(op)`` on each before it is
    yielded; returns ``gen``'s return value. Tests use it to log or
    snapshot programs; distillation counts the FLOPs a program charged."""
    value = None
    while True:
        try:
            op = gen.send(value)
        except StopIteration as stop:
            return stop.value
        on_op(op)
        value = yield op
