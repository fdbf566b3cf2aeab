"""Measurements for ``oresearcher.calibrate``, taken inside a running process group.

- Collectives: each kind over a size sweep. Every repetition starts after a barrier,
  and its time is the *smallest* over ranks, which is the time from the last rank's
  arrival to completion: what the simulator charges a collective (it starts once every
  member has arrived). Collectives go through the interpreter real runs use, so the
  payload copy and the issue are included. The mean over repetitions is kept, not the
  median: on a shared machine a collective now and then waits a scheduler time slice
  for a descheduled peer, and a run's report averages those waits in.
- Compute: the scenario's own program runs a few steps on every rank at once (ranks
  share cores as in a run), and its Compute ops are totalled: seconds measured and
  FLOPs declared. The profile takes the *slowest* rank's mean: in synchronous training
  the group moves at its pace.
  Every step's compute seconds and the FLOPs of each Compute op are kept: the
  calibration turns their spread into the device's ``compute_jitter_cv`` (and, for
  periodic averaging, ``compute_jitter_rho``), so the simulator's ranks drift apart and
  wait for each other as a shared machine's do.
- The same run times the program's own collectives (kind, size, issue to completion;
  per instance the smallest over ranks, i.e. the last arrival's). With every rank busy
  they run slower than in the idle sweep (cores, caches and memory bandwidth shared
  with the other ranks' compute); the calibration scales the sweep's fit to them.
- The workload's own collective sizes (its buckets, its flat parameters) are timed too.
- Host overhead: the interpreter's fixed cost of a Compute op with nothing to run.
- For language models on CPU, the fsdp schedule's host costs (:mod:`.fsdp`):
  the copy bandwidth at a block's size and the DTensor dispatch of a sharded optimizer step.

The fit turning these into a hardware profile is pure math in
:mod:`oresearcher.calibrate`.
"""
from __future__ import annotations

import logging
import statistics
import time

import torch
import torch.distributed as dist

from oresearcher import ops as O
from oresearcher.calibration.record import Measurement
from oresearcher.reporting.report import Timeline

from .fsdp import measure_fsdp_costs
from .fsdp_inrun import measure_fsdp_step, merge_steps, schedule_groups
from oresearcher.backends.run.interpreter import Interpreter

log = logging.getLogger(__name__)

KINDS = ("AllReduce", "AllGather")
KINDS_FITTED = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "AllToAll")  # the ring model's


def _collective(kind: str, nbytes: int, world: int, device) -> O.Collective:
    numel = max(1, nbytes // 4)
    if kind == "AllReduce":
        return O.AllReduce(torch.ones(numel, device=device))
    if kind == "AllGather":
        # nbytes is the gathered total (the ring formula's S); each rank adds 1/world
        return O.AllGather(torch.ones(max(1, numel // world), device=device))
    if kind == "Broadcast":
        return O.Broadcast(torch.ones(numel, device=device), src=0)
    raise ValueError(f"cannot calibrate {kind}")


def measure_collectives(world: int, sizes, repeats: int, device, kinds=KINDS, workload: bool = False) -> list[dict]:
    """Rows {kind, bytes, times_s: [per repetition, this rank], workload}; see the module docstring.

    Each collective goes through the interpreter the runs use (payload copy, issue,
    wait), so the host's share of a collective is in the figures.
    """
    rank = dist.get_rank()
    interp = Interpreter(rank, world, device=device, timeline=Timeline(world, keep_spans=0), clock=time.perf_counter,
                         backend=dist.get_backend())
    rows = []
    for kind in kinds:
        for nbytes in sizes:
            for _ in range(2):  # warm-up: connections, buffers
                interp.execute(_collective(kind, nbytes, world, device))
            times = []
            for _ in range(repeats):
                op = _collective(kind, nbytes, world, device)
                dist.barrier()
                t0 = time.perf_counter()
                interp.execute(op)
                times.append(time.perf_counter() - t0)
            rows.append({"kind": kind, "bytes": int(nbytes), "times_s": times, "workload": workload})
    return rows


def merge_ranks(per_rank: list[list[dict]]) -> list[dict]:
    """Combine every rank's rows: per repetition the minimum over ranks, then the mean."""
    out = []
    for rows in zip(*per_rank):
        first = rows[0]
        reps = [min(ts) for ts in zip(*(r["times_s"] for r in rows))]
        out.append({"kind": first["kind"], "bytes": first["bytes"], "time_s": statistics.fmean(reps),
                    "workload": first.get("workload", False)})
    return out


def measure_call_overhead(device, repeats: int = 200) -> float:
    """Host time to issue an async all-reduce of one element (the call, not the transfer)."""
    t = torch.ones(1, device=device)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        work = dist.all_reduce(t, async_op=True)
        samples.append(time.perf_counter() - t0)
        work.wait()
    return statistics.median(samples)


def workload_sizes(learner) -> list[int]:
    """Bytes of the learner's gradient buckets and of its flat parameters."""
    item = torch.empty((), dtype=learner.dtype).element_size()
    return sorted({int(b) * item for b in learner.buckets} | {int(learner.numel) * item})


class _OpLog:
    """Wraps a program and notes, in yield order, what the fit needs: per step the FLOPs
    of each Compute op, every communication op (kind, ring-model bytes S, step), and
    before each communication op the FLOPs of the Compute ops since the one before it
    (what a rank did between two meetings: ``segments``, aligned with ``comms``)."""

    def __init__(self, world: int):
        self.world, self.step = world, 0
        self.flops = [[]]  # per step: [flops of each Compute op]
        self.comms = []  # [(kind, S bytes, step)] in issue order
        self.segments = []  # per comm: [(step, flops) of each Compute op since the previous comm]
        self._since = []

    def wrap(self, program):
        val = None
        while True:
            try:
                op = program.send(val)
            except StopIteration:
                return
            if isinstance(op, O.Compute):
                self.flops[-1].append(float(op.flops))
                self._since.append((self.step, float(op.flops)))
            elif isinstance(op, (O.Collective, O.Send, O.Recv)):
                self.segments.append(self._since)
                self._since = []
                kind = getattr(op, "kind", type(op).__name__)
                nbytes = O.payload_bytes(op) if kind != "Barrier" else 0
                n = len(O.resolve_group(op.group, self.world)) if isinstance(op, O.Collective) else 2
                # the ring model's S for an all-gather is the gathered total
                self.comms.append((kind, nbytes * n if kind == "AllGather" else nbytes, n, self.step))
            elif isinstance(op, O.StepDone):
                self.step += 1
                self.flops.append([])
            val = yield op


def measure_program_compute(scenario, learner, rank: int, world: int, device, steps: int,
                            warmup: int = 2) -> dict:
    """Run the scenario's own program for ``warmup + steps`` reports (StepDone: a step, or
    a round where agents share a rank, :func:`steps_per_report`); total its Compute ops
    and time its collectives.

    Returns per measured step (means): seconds in Compute ops, the FLOPs those ops
    declared and their number, plus the per-step seconds themselves, the FLOPs of each
    Compute op per step, and this rank's duration (issue to completion) of every
    collective of the measured steps with its kind and size. Dividing declared FLOPs by
    measured seconds gives the rate at which the simulator must charge *this program's*
    compute to reproduce it: ops the FLOP count misses (optimizer steps, packing, a
    codec's elementwise passes) are folded in. The collective times are taken with
    every rank busy, as in a run: they show what the program's collectives cost in the
    cache and scheduler state the program leaves, which an idle sweep does not.
    """
    from oresearcher.programs import AgentContext, get_program

    total = (warmup + steps) * steps_per_report(scenario)
    short = scenario.model_copy(update={"training": scenario.training.model_copy(update={"steps": total})})
    ctx = AgentContext(rank, world, short, mode="real", device=device)
    per_step = []
    tl = Timeline(world, keep_spans=1_000_000)
    interp = Interpreter(rank, world, device=device, timeline=tl, clock=time.perf_counter,
                         backend=dist.get_backend(), on_step=lambda s, m, st: per_step.append(st))
    oplog = _OpLog(world)
    dist.barrier()
    interp.run(oplog.wrap(get_program(scenario.training.strategy)(ctx, learner)))
    interp.close()
    kept = per_step[warmup:] or per_step
    secs = [st["compute_s"] for st in kept]
    mean = statistics.fmean(secs)
    spans = sorted((sp for sp in tl.spans if sp.cat == "comm"), key=lambda sp: sp.start)
    comms, segments = [], []
    if len(spans) == len(oplog.comms):  # else some span went unrecorded: do not guess the pairing
        paired = [(c, sp, seg) for c, sp, seg in zip(oplog.comms, spans, oplog.segments) if c[3] >= warmup]
        comms = [(k, b, n, sp.duration) for (k, b, n, _), sp, _ in paired]
        segments = [seg for *_, seg in paired]
    return {"step_s": mean, "cv": statistics.pstdev(secs) / mean if mean else 0.0, **_passes(tl, oplog, warmup),
            "flops_per_step": statistics.fmean(st["compute_flops"] for st in kept),
            "ops_per_step": statistics.fmean(st["compute_ops"] for st in kept),
            "step_seconds": secs, "op_flops": oplog.flops[warmup:warmup + len(kept)], "comms": comms,
            "segments": segments}


def _passes(tl: Timeline, oplog: _OpLog, warmup: int) -> dict:
    """Per measured step, the seconds and the number of the Compute ops that declare FLOPs
    (the model's passes; the rest is the program's packing and optimizer work), paired
    with the op log in issue order ({} if some span went unrecorded)."""
    spans = sorted((sp for sp in tl.spans if sp.cat == "compute"), key=lambda sp: sp.start)
    ops = [(step, f) for step, per in enumerate(oplog.flops) for f in per]
    if len(spans) != len(ops):
        return {}
    kept = [(step, sp.duration) for (step, f), sp in zip(ops, spans) if step >= warmup and f > 0]
    steps = max(1, len({step for step, _ in ops if step >= warmup}))
    return {"pass_s": sum(d for _, d in kept) / steps, "pass_ops": len(kept) / steps}


def merge_inrun(per_rank: list[list[tuple]], world: int, pick=min, subgroups: bool = False) -> list[dict]:
    """Rows {kind, bytes, time_s, workload, in_run} from every rank's in-run collectives.

    Every rank issues the same collectives in the same order (else nothing is merged).
    An instance's time is the smallest over ranks: the last rank to arrive waited for
    no one, so its time is arrival-to-completion, what the simulator charges (the
    others' extra is peer waiting, which the simulator models separately). Instances of
    one kind and size are averaged. Only world-group collectives of the ring model's
    kinds are kept. ``pick``: how an instance's time is taken over ranks (fsdp's own
    collectives: the mean, :func:`_inrun`); ``subgroups``: keep collectives of groups
    smaller than the world too, each row with its group's size (``ranks``); the same
    instance index on ranks of different groups is then a different collective of the
    same kind and size (fsdp shard groups), which only a mean over ranks may merge.
    """
    if not per_rank or len({len(c) for c in per_rank}) != 1:
        return []
    groups = {}
    for inst in zip(*per_rank):
        kinds = {(k, b, n) for k, b, n, _ in inst}
        if len(kinds) != 1:
            return []
        kind, nbytes, n = inst[0][:3]
        if (n != world and not subgroups) or n < 2 or kind not in KINDS_FITTED:
            continue
        groups.setdefault((kind, nbytes, n), []).append(pick([d for *_, d in inst]))
    return [{"kind": k, "bytes": int(b), "time_s": statistics.fmean(ts), "workload": True, "in_run": True,
             "count": len(ts), **({"ranks": n} if n != world else {})} for (k, b, n), ts in sorted(groups.items())]


def merge_waits(per_rank: list[list[tuple]], segments: list, world: int) -> list[dict]:
    """Rows {kind, flops, steps, wait_s}: for each of the program's world-group collectives
    (steady steps), the FLOPs of the Compute ops each rank ran since the previous meeting
    and the step each belongs to (rank 0's log: every rank runs the same program), and
    ``wait_s``, each rank's time in the collective less the shortest time over ranks,
    mean over ranks: how much earlier each arrived and how much later each woke (the
    transfer is common to all), with no clock compared across ranks. [] when the ranks'
    logs do not line up, or for fewer than 2 ranks.
    """
    if world < 2 or not per_rank or len({len(c) for c in per_rank}) != 1 or len(segments) != len(per_rank[0]):
        return []
    rows = []
    for inst, seg in zip(zip(*per_rank), segments):
        if len({(k, b, n) for k, b, n, _ in inst}) != 1 or inst[0][2] != world:
            continue
        times = [d for *_, d in inst]
        rows.append({"kind": inst[0][0], "flops": [f for _, f in seg], "steps": [t for t, _ in seg],
                     "wait_s": statistics.fmean(times) - min(times)})
    return rows


def steps_per_report(scenario) -> int:
    """Training steps between two StepDone of the scenario's program: a round
    (``communication.interval``) where several agents share a rank, which reports once a
    round; else 1. The run is timed per report, so warm-up and timed counts are reports."""
    sc = scenario
    if sc.strategy.cooperative and sc.cooperation.allocation.agents_per_device > 1:
        return sc.communication.interval
    return 1


def measure_host_link(scenario, rank: int, device, repeats: int = 50) -> float:
    """One-way bytes/s of a hosted agent's switch (``host_link_GBps``): its state
    (weights, gradients, optimizer moments) copied out to host buffers and back with the
    program's own ``move_out``/``move_in``, median of ``repeats``, every rank at once."""
    from oresearcher.programs.cooperative_hosted import move_in, move_out, state_bytes
    from oresearcher.tasks import make_learner

    learner = make_learner(scenario, rank, mode="real", device=device)
    learner.forward_backward()
    learner.optimizer_step()  # the optimizer's moments exist, as in a switch after a step
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        move_in(learner, move_out(learner))
        ts.append(time.perf_counter() - t)
    return 2 * state_bytes(learner, scenario.workload.optimizer) / max(statistics.median(ts), 1e-9)


def measure_host_overhead(rank: int, world: int, device, ops: int = 2000) -> float:
    """Seconds the interpreter spends on a Compute op with nothing to run."""
    interp = Interpreter(rank, world, device=device, timeline=Timeline(world, keep_spans=0), clock=time.perf_counter)
    t0 = time.perf_counter()
    for _ in range(ops):
        interp.execute(O.Compute(flops=1.0))
    return (time.perf_counter() - t0) / ops


def calibrate_rank(scenario, denv, *, backend: str, timeout_s: float, sizes, repeats: int,
                   compute_steps: int, learner_spec=None, threads: int = 1) -> Measurement | None:
    """Take every measurement on this rank; rank 0 returns the merged record, others None."""
    from oresearcher.backends.run.worker import build_learner, init_process_group

    torch.set_num_threads(max(1, threads))
    device, _store = init_process_group(denv, backend, timeout_s)
    rank, world = denv.rank, denv.world_size
    try:
        learner = build_learner(scenario, rank, device, learner_spec)
        rows = measure_collectives(world, sizes, repeats, device)
        rows += measure_collectives(world, workload_sizes(learner), 3 * repeats, device, kinds=("AllReduce",),
                                    workload=True)
        call = measure_call_overhead(device)
        compute = measure_program_compute(scenario, learner, rank, world, device, compute_steps)
        host = measure_host_overhead(rank, world, device)
        link = measure_host_link(scenario, rank, device) if steps_per_report(scenario) > 1 else None
        dist.barrier()  # every rank measures the fsdp costs at once, as ranks share cores in a run
        fsdp = measure_fsdp_costs(scenario, world, device)
        step = None
        if fsdp is not None and scenario.strategy.shards and learner.sharded:
            step = measure_fsdp_step(learner)  # the program's own step by pieces (calibration_fsdp_inrun)
        mine = {"rows": rows, "call_s": call, "compute": compute, "host_s": host, "fsdp": fsdp, "link": link,
                "step": step}
        every = [None] * world
        dist.all_gather_object(every, mine)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return None
    return Measurement(
        world_size=world,
        backend=backend,
        collectives=merge_ranks([m["rows"] for m in every]),
        call_overhead_s=statistics.median(m["call_s"] for m in every),
        compute_step_s=max(m["compute"]["step_s"] for m in every),  # the group's pace
        compute_step_s_per_rank=[m["compute"]["step_s"] for m in every],
        compute_step_s_mean=statistics.fmean(m["compute"]["step_s"] for m in every),
        compute_cv_per_rank=[m["compute"]["cv"] for m in every],
        step_seconds_per_rank=[m["compute"]["step_seconds"] for m in every],
        op_flops=every[0]["compute"]["op_flops"],
        inrun_collectives=_inrun(every, world),
        arrival_waits=merge_waits([m["compute"]["comms"] for m in every], every[0]["compute"]["segments"], world),
        flops_per_step=every[0]["compute"]["flops_per_step"],
        compute_ops_per_step=every[0]["compute"]["ops_per_step"],
        flops_per_step_per_rank=[m["compute"]["flops_per_step"] for m in every],
        compute_ops_per_step_per_rank=[m["compute"]["ops_per_step"] for m in every],
        host_link_Bps=statistics.median(m["link"] for m in every) if every[0]["link"] else None,
        strategy=scenario.training.strategy,
        host_overhead_s=statistics.median(m["host_s"] for m in every),
        dtype=scenario.workload.dtype,
        pass_step_s_per_rank=[m["compute"].get("pass_s") for m in every],
        pass_ops_per_step=every[0]["compute"].get("pass_ops", 0.0),
        **_fsdp_fields([m["fsdp"] for m in every]),
        fsdp_step=_fsdp_step(scenario, world, every),
    )


def _inrun(every: list, world: int) -> list[dict]:
    """The in-run collective rows: the program's own (:func:`merge_inrun`, the last
    arriver's time). fsdp: its collectives run inside its Compute op, so FSDP2's own, timed
    by pieces (beside the program's own, such as a fusion round's), at the mean over
    ranks, shard groups smaller than the world included: a CPU rank waits for each of a step's 10-15
    collectives, and what it waits for there (its peers' share of the cores, their
    segment of the step being longer this time) is not the step-to-step spread that the
    device's jitter describes; the simulator charges it as part of the collective."""
    rows = merge_inrun([m["compute"]["comms"] for m in every], world)
    if all(m["step"] is not None for m in every):
        rows += merge_inrun([m["step"]["comms"] for m in every], world, pick=statistics.fmean, subgroups=True)
    return rows


def _fsdp_step(scenario, world: int, every: list) -> dict | None:
    """Every rank's fsdp step by pieces, and what the schedule charges at the
    microbenchmarks' constants (median over ranks); None where it was not timed."""
    if any(m["step"] is None for m in every):
        return None
    return {**merge_steps([m["step"] for m in every]),
            "schedule": schedule_groups(scenario, world, _fsdp_fields([m["fsdp"] for m in every]))}


def _fsdp_fields(per_rank: list) -> dict:
    """The fsdp costs, median over ranks (none where they were not measured)."""
    if any(f is None for f in per_rank):
        return {}
    return {k: statistics.median(f[k] for f in per_rank) for k in ("copy_Bps", "dtensor_param_step_s", "optimizer_element_s",
                                                     "gather_param_s", "reduce_param_s", "unit_step_s")}
