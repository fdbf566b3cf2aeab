"""The SimPy interpreter: one process per rank, ops priced on a modelled cluster.

Each rank's program runs as a SimPy process. A Compute op takes
``flops / achieved FLOP/s + host overhead`` of simulated time, or what ``pricing`` (the
roofline model, :mod:`.roofline`) says plus the host overhead (and, in numeric mode, runs
its function). A collective completes when every member of its group has issued it; its
duration comes from its plan (:func:`oresearcher.comm.plan`) moving flows over the
max-min fair network (:mod:`.network`), so concurrent collectives slow each other down.
Results follow :func:`oresearcher.ops.collective_results`, the same definition the
reference interpreter and torch.distributed follow; in shape mode the tensors are meta
tensors and only sizes flow.

Nothing here reads the wall clock or global randomness: the same programs on the same
topology give the same timeline, event for event. A device profile with
``compute_jitter_cv > 0`` scales each Compute op by a random factor (lognormal, mean 1)
drawn from a generator private to the rank and seeded by ``seed`` and the rank, so runs
stay reproducible. With ``compute_jitter_rho > 0`` the factor is drawn once per step:
``exp(mu + sigma * z)`` with ``z`` a standard-normal AR(1) over the rank's steps,
``z' = rho * z + sqrt(1 - rho**2) * e`` at each StepDone (stationary from the start, so
every step's factor has mean 1 and the profile's cv). ``wake_delay_us > 0``: see ``_wake``.
"""
from __future__ import annotations

import math

import numpy as np
import simpy

from oresearcher import ops as O
from oresearcher.reporting.report import Timeline

from oresearcher import comm
from oresearcher.comm.units import us_to_s

from .swap import swap_seconds
from .draws import RankJitter, lognormal_params


def _meta(op) -> bool:
    t = getattr(op, "tensor", None)
    return t is not None and t.is_meta


class CollectiveMismatch(O.ProgramError, RuntimeError):
    """The members of a group issued different collectives or payload sizes (a
    :class:`~oresearcher.ops.ProgramError`; a RuntimeError for older callers)."""


class _Instance:
    __slots__ = ("kind", "ranks", "gkey", "ops", "issued", "first", "done", "results", "name", "sizes", "count",
                 "wakes")

    def __init__(self, env, kind, ranks, gkey, name, now):
        self.kind, self.ranks, self.gkey, self.name = kind, ranks, gkey, name
        self.ops, self.issued = {}, {}  # by the rank that issued it (a class: its representative)
        self.first = now  # the earliest of issued: the first member arrives as it is made
        self.count = 0  # members arrived (a representative counts for its whole class)
        self.done = env.event()
        self.results = None
        self.wakes = None  # rank -> its wake-up delay after the end (wake_delay_us), drawn at the first resume


class _Chain:
    """A SimPy process without its own completion event or start event: steps ``gen``
    (which yields events that never fail) at once, from the call that creates it (the
    last member's arrival), then from each event it waits on; the run is waited on through
    its instance's ``done`` event: two events fewer per collective than ``env.process``."""

    __slots__ = ("gen",)

    def __init__(self, env, gen):
        self.gen = gen
        self._resume(None)

    def _resume(self, _event):
        while True:
            try:
                nxt = self.gen.send(None)
            except StopIteration:
                return
            if nxt.callbacks is not None:  # not yet processed: resume when it is
                nxt.callbacks.append(self._resume)
                return


class Engine:
    """Interprets ops for ``world_size`` ranks on ``topo`` with ``device`` compute."""

    def __init__(self, topo, device, dtype: str = "bf16", algorithm: str = "auto",
                 timeline: Timeline | None = None, env: simpy.Environment | None = None, seed: int = 0,
                 pricing=None):
        self.env = env or simpy.Environment()
        self.topo, self.device, self.algorithm = topo, device, algorithm
        self.world_size = topo.world_size
        self.rate = device.flops_per_s(dtype)
        self.host = device.host_overhead_s
        # pricing(op name, flops) -> seconds or None (None: the flat flops / rate); see sim/roofline.py
        self.pricing = pricing
        self.seed = int(seed)
        self.jitter = lognormal_params(float(getattr(device, "compute_jitter_cv", 0.0) or 0.0))
        self.rho = float(getattr(device, "compute_jitter_rho", 0.0) or 0.0)
        self.wake = us_to_s(float(getattr(device, "wake_delay_us", 0.0) or 0.0))  # mean, seconds
        self._rngs = {}  # rank -> its generator, where it draws (the wake-up delays after blocking, _wake)
        self.tl = timeline or Timeline(self.world_size)
        from .network import FlowNetwork

        self.net = FlowNetwork(self.env, topo.capacity)
        self._world = tuple(range(self.world_size))
        self._groups = {}  # id(group object) -> (object, resolved ranks, group key)
        self._gkeys = {}  # resolved ranks -> group key
        self._pending = {}
        self._plans = {}
        self.on_step = None  # callback(rank, step) for progress bars
        self.ops_done = 0  # ops interpreted, for events-per-second figures (a class counts its members)
        self.ops_run = 0  # ops this engine ran (a class: once)
        self.faults = None  # a sim/faults.py FaultPlan: stragglers, link windows, checkpoints, failures
        self.owed = [0.0] * self.world_size  # per rank: compute time not yet paid (see _rank)
        # symmetric run (sim/symmetry.py): representative -> the ranks it stands for, and
        # every rank's representative; None: one process per rank
        self.members, self.rep_of = None, None
        self._meta_out = {}  # (kind, group size, shape, dtype) -> shape mode's result tensor
        self._repeats = {}  # (kind, group key, id(meta tensor), algorithm, root) -> (tensor, sizes, results, plan)
        # (rank, group key) -> [ranks it counts for, calls so far], once checked that its
        # class sits in the group
        self._slots = {}
        self._reps = range(self.world_size)  # every rank's representative (run() sets it for classes)

    def now(self, rank: int) -> float:
        """Rank's own clock: simulated time including the compute it owes lazily."""
        return self.env.now + self.owed[rank]

    # -- public -----------------------------------------------------------------
    def run(self, programs, classes=None) -> Timeline:
        """Run one program per rank, or with ``classes`` (sorted rank tuples covering the
        world, see sim/symmetry.py) one per class, for its first rank; raises
        :class:`~.symmetry.SymmetryBroken` when a class turns out not to act alike."""
        reps = range(self.world_size)
        if classes is not None:
            reps = [c[0] for c in classes]
            self.members = {c[0]: c for c in classes}
            self.rep_of = [0] * self.world_size
            for c in classes:
                for r in c:
                    self.rep_of[r] = c[0]
            self.tl.share(classes)
            self._reps = self.rep_of
        if len(programs) != len(reps):
            raise ValueError(f"{len(programs)} programs for {len(reps)} ranks")
        procs = [self.env.process(self._rank(r, g)) for r, g in zip(reps, programs)]
        self.env.run()
        stuck = [r for r, p in zip(reps, procs) if p.is_alive]
        if stuck:
            waiting = sorted({(i.kind, i.ranks) for i in self._pending.values()})
            raise RuntimeError(f"deadlock: ranks {stuck} never finished; collectives waiting: {waiting[:3]}")
        return self.tl

    # -- rank process -------------------------------------------------------------
    def _rank(self, rank, gen):
        env, tl = self.env, self.tl
        jit = RankJitter(self, rank)
        Compute, Swap, StepDone = O.Compute, O.Swap, O.StepDone
        owed_of, record, wake, issue = self.owed, tl.record, self.wake, self._issue
        mult = 1 if self.members is None else len(self.members[rank])  # ranks this process stands for
        # Compute only touches this rank, so its time is owed lazily: consecutive Computes
        # cost one SimPy event, paid before the rank next meets others (exactly the same
        # times as one event each, far fewer events).
        owed = 0.0
        val = None
        n = 0  # ops run, added to the engine's counts when the rank stops
        try:
            while True:
                try:
                    op = gen.send(val)
                except StopIteration:
                    if owed:
                        yield env.timeout(owed)
                    return
                val = None
                n += 1
                if isinstance(op, Compute):  # Swap too: priced at the host link (sim/swap.py)
                    if op.fn is not None:
                        val = op.fn(*op.args, **op.kwargs)
                    dur = jit.scale(self._compute_seconds(op, isinstance(op, Swap)))
                    start = env.now + owed
                    owed += dur
                    owed_of[rank] = owed
                    record(rank, "compute", op.name, start, start + dur)
                    continue
                if owed:
                    yield env.timeout(owed)
                    owed = owed_of[rank] = 0.0
                if isinstance(op, StepDone):
                    jit.next_step()
                    yield from self._step_done(rank, op)
                    continue
                inst, val = issue(rank, op)
                if inst is None:  # an async collective's handle, or a buffered Send
                    continue
                # a blocking collective, a Wait or a Recv: block on ``inst`` here rather
                # than in a sub-generator (a Wait is one op in three of a DDP step)
                start = env.now
                if not inst.done.triggered:
                    yield inst.done
                    if wake > 0 and inst.kind != "SendRecv":
                        yield env.timeout(self._wake(rank, inst))
                record(rank, "blocked", inst.name, start, env.now)
                val = inst.results[rank]
        finally:
            self.ops_done += n * mult
            self.ops_run += n

    def _compute_seconds(self, op, swap: bool) -> float:
        """A Compute op's mean duration: flops at the device's rate, or what ``pricing``
        (or, for a Swap, the host link) says, plus the host overhead."""
        if swap:
            priced = swap_seconds(self.device, op.nbytes)
        else:
            priced = self.pricing(op.name, op.flops) if self.pricing is not None else None
        return (op.flops / self.rate if priced is None else priced) + self.host

    def _step_done(self, rank, op):
        """A rank's StepDone: the timeline, the progress callback, and the fault plan's
        work after a step (checkpoints, failures: it may take simulated time)."""
        self.tl.step_done(rank, op.step, self.env.now, op.metrics)
        if self.on_step is not None:
            self.on_step(rank, op.step)
        if self.faults is not None:
            yield from self.faults.after_step(self.env, self.tl, rank, op.step)

    def _issue(self, rank, op):
        """(instance to block on or None, value to send back) for a communication op."""
        if isinstance(op, O.Collective):
            inst = self._arrive(rank, op, op.kind, *self._group(op.group))
            return (None, O.Handle(op, inst)) if op.async_op else (inst, None)
        if isinstance(op, O.Wait):
            inst = getattr(op.handle, "token", None)
            if not isinstance(inst, _Instance):
                raise O.not_a_handle(rank, inst)
            return inst, None
        if isinstance(op, O.Send):
            # buffered, as in the reference interpreter and the real backend (isend):
            # the sender goes on; the transfer runs once the receiver posts its Recv
            self._arrive(rank, op, "SendRecv", (rank, op.dst), ("p2p", rank, op.dst))
            return None, None
        if isinstance(op, O.Recv):
            return self._arrive(rank, op, "SendRecv", (op.src, rank), ("p2p", op.src, rank)), None
        raise O.not_an_op(rank, op)

    def _wake(self, rank, inst) -> float:
        """Rank's delay after a collective's end before it runs again: the members leave
        in an order, the first at the end and each other an exponential draw (mean
        ``wake_delay_us``) less the first's later (a shared host gives the ranks that
        slept in the call their cores back one after another). Each member draws from
        its own generator, in rank order, when the first of them resumes."""
        if inst.wakes is None:
            ys = {r: float(self._rngs[r].exponential(self.wake)) for r in inst.ranks}
            first = min(ys.values())
            inst.wakes = {r: y - first for r, y in ys.items()}
        return inst.wakes[rank]

    # -- collectives ----------------------------------------------------------------
    def _group(self, group):
        """(ranks, key) of a group. Equal groups share a key whatever object each rank
        passes; the resolution is cached per object (the cache keeps the object alive,
        so its id is not reused), as 1,024-rank tuples are costly to sort and hash on
        every arrival."""
        if group is None:
            return self._world, -1
        hit = self._groups.get(id(group))
        if hit is None:
            ranks = O.resolve_group(group, self.world_size)
            hit = self._groups[id(group)] = (group, ranks, self._gkeys.setdefault(ranks, len(self._gkeys)))
        return hit[1], hit[2]

    def _arrive(self, rank, op, kind, ranks, gkey):
        slot = self._slots.get((rank, gkey))
        if slot is None:
            slot = self._slots[rank, gkey] = [self._fit(rank, kind, ranks), 0]
        fit, seq = slot
        slot[1] = seq + 1
        key = (gkey, seq)  # the k-th call on a group meets every member's k-th call
        now = self.env.now
        inst = self._pending.get(key)
        if inst is None:
            inst = self._pending[key] = _Instance(self.env, kind, ranks, gkey, op.name, now)
        elif inst.kind != kind:
            raise CollectiveMismatch(f"group {ranks}: {inst.kind} met {kind}")
        inst.ops[rank] = op
        inst.issued[rank] = now
        inst.count += fit
        if inst.count == len(ranks):
            del self._pending[key]
            _Chain(self.env, self._run(inst))
        return inst

    def _fit(self, rank, kind, ranks) -> int:
        """How many members ``rank`` counts for in its group (its class's size), after
        checking it belongs there; once per rank and group."""
        members = frozenset(ranks)  # a set, not the tuple: 16,384-rank groups are costly to scan
        if rank not in members:
            raise O.not_in_group(rank, kind, ranks)
        if self.members is None:
            return 1
        mine = self.members[rank]
        if len(mine) > 1 and (kind == "SendRecv" or not members.issuperset(mine)):
            from .symmetry import SymmetryBroken

            raise SymmetryBroken(f"rank {rank}'s class of {len(mine)} does not act alike in {kind} "
                                 f"on a group of {len(ranks)}")
        return len(mine)

    def _results(self, inst):
        if inst.kind == "SendRecv":
            src, dst = inst.ranks
            return {src: None, dst: inst.ops[src].tensor.clone()}
        ops, rep_of = inst.ops, self.rep_of
        first = ops[inst.ranks[0]] if rep_of is None else ops[rep_of[inst.ranks[0]]]
        if inst.kind in ("AllReduce", "Broadcast", "ReduceScatter") and len(inst.sizes) == 1 and _meta(first):
            # shape mode: one meta tensor of the output's size serves every member and every call
            t = first.tensor
            key = (inst.kind, len(inst.ranks), t.shape, t.dtype)
            out = self._meta_out.get(key)
            if out is None:
                out = self._meta_out[key] = O.collective_results(inst.kind, [first] * len(inst.ranks), inst.ranks)[0]
            return dict.fromkeys(ops, out)
        ordered = [ops[r] for r in inst.ranks] if rep_of is None else [ops[rep_of[r]] for r in inst.ranks]
        if inst.kind != "AllGather" and len(inst.sizes) > 1:
            raise CollectiveMismatch(f"{inst.kind} on {inst.ranks}: payload sizes differ {sorted(inst.sizes)}")
        results = O.collective_results(inst.kind, ordered, inst.ranks)
        if rep_of is None:
            return dict(zip(inst.ranks, results))
        return {r: x for r, x in zip(inst.ranks, results) if r in ops}  # the representatives'

    def _prepare(self, inst):
        """Set ``inst.sizes`` and ``inst.results``; returns :meth:`_plan`'s answer. A
        shape-mode call that one process makes for its whole group (a symmetric class)
        passes the same meta tensor every step: all three are remembered per tensor (a
        meta tensor's size never changes; the results dict is only read), as asking
        torch for sizes costs more than the rest of the call."""
        key = None
        if len(inst.ops) == 1 and inst.kind in ("AllReduce", "Broadcast", "ReduceScatter"):
            (op,) = inst.ops.values()
            t = getattr(op, "tensor", None)
            key = (inst.kind, inst.gkey, id(t), op.algorithm, getattr(op, "src", None))
            hit = self._repeats.get(key)
            if hit is not None and hit[0] is t:
                inst.sizes, inst.results = hit[1], hit[2]
                return hit[3]
        inst.sizes = {O.payload_bytes(o) for o in inst.ops.values()}
        inst.results = self._results(inst)
        plan = self._plan(inst)
        if key is not None and _meta(op):  # meta tensors hold no data: the same answer next time
            if len(self._repeats) > 4096:  # programs that make new tensors every call
                self._repeats.clear()
            self._repeats[key] = (t, inst.sizes, inst.results, plan)
        return plan

    def _plan(self, inst):
        """(plan, [(latency, routes, bytes, network batch)] per phase, wire bytes per
        rank); cached."""
        first = inst.ops[inst.ranks[0]]
        nbytes = max(inst.sizes)
        root = getattr(first, "src", None) if inst.kind == "Broadcast" else None
        requested = getattr(first, "algorithm", None) or self.algorithm
        key = (inst.kind, inst.gkey, nbytes, root, requested)  # a group key stands for its ranks
        hit = self._plans.get(key)
        if hit is None:
            pl = comm.plan(inst.kind, inst.ranks, nbytes, self.topo, requested, root)
            steps = []
            for latency, p in pl.timing:
                live = [(self.topo.route(s, d), float(b)) for s, d, b in p.flows if b > 0 and s != d]
                routes, sizes = tuple(r for r, _ in live), [b for _, b in live]
                steps.append((latency, routes, sizes, self.net.batch(routes, sizes)))
            hit = self._plans[key] = (pl, steps, comm.wire_bytes_by_rank(pl.phases))
        return hit

    def _run(self, inst):
        env = self.env
        last = env.now  # the last member just arrived: the others waited for it
        tl, rep_of, issued = self.tl, self._reps, inst.issued
        if inst.first < last:  # someone waited for the last member
            tl.record_group(inst.ranks, rep_of, "peer_wait", inst.name, issued, last)
        pl, steps, wire = self._prepare(inst)
        start = env.now
        if pl.fixed:
            yield env.timeout(pl.fixed)
        for latency, routes, nbytes, batch in steps:
            if latency:
                yield env.timeout(latency)
            if routes:
                if self.faults is None:
                    yield self.net.start_batch(batch)
                else:
                    yield self.net.start(routes, self.faults.flow_bytes(env.now, nbytes))
        if env.now - start < pl.floor:  # the host had not enqueued the next call yet
            yield env.timeout(pl.floor - (env.now - start))
        tl.record_group(inst.ranks, rep_of, "comm", inst.name, issued, env.now, wire,
                        {"kind": inst.kind, "algorithm": pl.label})
        inst.done.succeed()
