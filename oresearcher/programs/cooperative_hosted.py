"""Several agents per rank: device time handed out by shares (cooperation.allocation).

With ``cooperation.allocation.agents_per_device: k`` each of the M ranks (devices) hosts
k agents, N = k * M in all (:mod:`oresearcher.cooperation.scheduler`). A round:

1. For each hosted agent in turn: its state moves in from host memory (a :class:`Swap`,
   priced by the simulator at the device profile's ``host_link_GBps``, really copied by
   the real backend), it takes the steps its share of the round's device time buys,
   and its state moves out again. Once the plan is in seconds the slice is metered:
   it steps while its device seconds so far plus its mean step fit its budget
   (:func:`~oresearcher.cooperation.scheduler.keep_stepping`; at most four times the planned
   steps plus four). On a CUDA rank reading the seconds so far synchronizes on the last
   step's event, once a step: the host then launches the next step when the last has
   finished, the price of a time slice that ends on time. A clock that does not advance
   (the reference interpreter without one) runs the planned steps.
2. One AllGather of the agents' flat parameters and of every agent's (mean training
   loss, device seconds used, steps run) (:func:`pack_round`): every rank then computes the same allocation rewards
   (1 / (1 + loss): one fixed weighting for every round), the same fused parameters
   (plain average of the healthy agents) and the same next plan. The gathered device
   seconds go back to the scheduler (:meth:`Scheduler.settle`), which from the second
   round on plans in seconds: what a step really cost is metered, not assumed from its
   units. In shape mode (no values travel) the plan stays in units.

Device time, per agent and round (:class:`SliceClock`): in the simulator the simulated
seconds of its slice; on a CUDA rank the time between CUDA events around its steps; on a
CPU rank the CPU time its process spent on them (the device is the core: while the OS
runs another rank on that core the agent does not hold it, so wall time would count the
neighbours' work). The slice's wall time is reported beside it. On a real rank Python's
automatic garbage collection is held off during a slice (a full collection scans every
object of the process, 0.1-0.2 s of CPU here: the process's housekeeping, not the
agent's work), so collections run between slices; after the first round the objects
alive then (imports, models) are frozen out of later collections (``gc.freeze``).
"""
from __future__ import annotations

import gc
import math
import statistics
import time

import torch

from ..cooperation.scheduler import Scheduler, hosted, keep_stepping, slice_cap
from ..errors import UserError
from ..ops import AllGather, Compute, StepDone, Swap
from .cooperative_round import round_lengths


class SliceClock:
    """Times the steps of one agent's slice: per step its device seconds, and the slice's
    wall seconds. ``sim``: the backend's clock (simulated seconds; wall = device).
    CPU rank: the CPU time of this thread (``time.thread_time``; with intra-op threads,
    of the whole process, ``time.process_time``). CUDA rank: CUDA events around each
    step; an unmetered slice reads them once at its end (one synchronisation per slice),
    a metered one reads the seconds so far after every step (:meth:`spent`: one event
    synchronisation per step, so the host queues no step ahead: the price of a slice
    that stops when its seconds are spent rather than after the planned steps)."""

    def __init__(self, ctx):
        self.cuda = ctx.mode == "real" and torch.device(ctx.device).type == "cuda"
        self.live = ctx.mode == "real" or ctx.clock is not None  # a clock that advances: slices can be metered
        if ctx.mode != "real":
            self.dev = self.wall = ctx.clock or (lambda: 0.0)
        else:
            self.wall = time.perf_counter
            self.dev = time.thread_time if torch.get_num_threads() == 1 else time.process_time

    def start(self) -> None:
        self.w0, self.marks = self.wall(), [self._mark()]

    def _mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return self.dev()

    def lap(self) -> None:
        self.marks.append(self._mark())

    def spent(self) -> float:
        """Device seconds of the slice's steps so far (at the last :meth:`lap`). On a CUDA
        rank this waits for the last step's kernels (an event synchronize per call)."""
        a, b = self.marks[0], self.marks[-1]
        if self.cuda:
            b.synchronize()
            return a.elapsed_time(b) / 1e3
        return b - a

    def stop(self) -> tuple[list, float]:
        """(device seconds of each step, wall seconds of the slice)."""
        m = self.marks
        if self.cuda:
            m[-1].synchronize()
            steps = [a.elapsed_time(b) / 1e3 for a, b in zip(m, m[1:])]
        else:
            steps = [b - a for a, b in zip(m, m[1:])]
        return steps, self.wall() - self.w0


def state_tensors(learner) -> list:
    """Parameters, gradients and optimizer state: what an agent's switch moves."""
    out = [p for p in learner.params]
    out += [p.grad for p in learner.params if p.grad is not None]
    opt = learner.optimizer
    for st in (opt.state.values() if opt is not None else ()):
        out += [v for v in st.values() if torch.is_tensor(v) and v.dim() > 0]
    return out


def state_bytes(learner, optimizer: str) -> float:
    """Bytes of one agent's state: measured on a real learner, else estimated from the
    parameter count (weights + gradients + the optimizer's slots)."""
    ts = state_tensors(learner)
    if ts and ts[0].device.type != "meta":
        return float(sum(t.numel() * t.element_size() for t in ts))
    slots = 2 if optimizer.startswith("adam") else 1
    return float(learner.numel * 4 * (2 + slots))


def move_out(learner) -> list:
    """Copy the agent's state to host buffers (what a switch out does)."""
    return [t.detach().to("cpu", copy=True) for t in state_tensors(learner)]


def move_in(learner, saved) -> None:
    """Copy the agent's state back from its host buffers (a switch in)."""
    if saved is None:
        return
    with torch.no_grad():
        for t, s in zip(state_tensors(learner), saved):
            t.copy_(s)


def pack_round(agents, stats: torch.Tensor) -> torch.Tensor:
    """One rank's part of the round's all-gather: its agents' flat parameters, then the
    [k, 3] float64 stats (loss, device seconds, steps run) reinterpreted as the parameters' dtype
    (bit for bit: one collective carries both, and the ranks synchronise once a round)."""
    flat = torch.cat([L.flat_params().reshape(-1) for L in agents])
    if flat.device.type == "meta":
        return torch.empty(flat.numel() + stats.numel() * 8 // flat.element_size(), dtype=flat.dtype, device="meta")
    return torch.cat([flat, stats.to(flat.device).reshape(-1).view(flat.dtype)])


def unpack_round(parts, k: int, cols: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's :func:`pack_round` -> (parameters [n, numel], stats [n, cols] float64)."""
    flats, stats = [], []
    for p in parts:
        tail = cols * k * 8 // p.element_size()
        flats.append(p[:-tail].reshape(k, -1))
        stats.append(p[-tail:].cpu().clone().view(torch.float64).reshape(k, cols))  # clone: aligned
    return torch.cat(flats), torch.cat(stats)


def _agent_learner(ctx, learner, agent: int, j: int):
    """Hosted agent ``j`` of this rank: the rank's own learner first, the others built
    like it with their own seed (own initial weights and data order)."""
    if j == 0:
        return learner
    from ..tasks import make_learner

    sc = ctx.scenario.model_copy(update={"seed": ctx.scenario.seed + 7919 * agent})
    mode = "real" if ctx.mode == "real" else ("numeric" if ctx.numeric else "shape")
    return make_learner(sc, ctx.rank, mode=mode, device=ctx.device)


def unsupported(sc) -> list[str]:
    """Settings the hosted program does not carry out (it refuses them rather than
    silently ignoring them)."""
    c, out = sc.cooperation, []
    for name, on in (("cooperation.privacy.enabled", c.privacy.enabled), ("cooperation.replay.enabled", c.replay.enabled),
                     ("communication.gradient_sharing", sc.communication.gradient_sharing),
                     ("communication.budget", sc.communication.budget is not None),
                     ("cooperation.ensemble.train", c.ensemble.train),
                     ("distill.student", getattr(getattr(sc, "distill", None), "student", None) is not None)):
        if on:
            out.append(name)
    return out


def hosted_program(ctx, learner):
    sc, cfg = ctx.scenario, ctx.scenario.cooperation.allocation
    off = unsupported(sc)
    if off:
        raise UserError(f"cooperation.allocation.agents_per_device > 1 does not run {', '.join(off)} yet: "
                        "turn them off or host one agent per rank")
    if ctx.start_step:
        raise UserError("cooperation.allocation.agents_per_device > 1 cannot resume yet: start the run again")
    m, k = ctx.world_size, cfg.agents_per_device
    n = m * k
    mine = hosted(ctx.rank, n, m)
    agents = [_agent_learner(ctx, learner, a, j) for j, a in enumerate(mine)]
    sched = ctx.register("scheduler", Scheduler(n, m, cfg.temperature, cfg.floor, cfg.enabled))
    rounds = round_lengths(ctx.steps, sc.communication.interval)
    costs = [1] * n
    nbytes = state_bytes(learner, sc.workload.optimizer)
    clock = SliceClock(ctx)
    real = ctx.mode == "real"  # the simulator runs every rank's program in one process
    plan = sched.plan([float("nan")] * n, k * rounds[0], costs)
    saved = [None] * k
    numeric = ctx.numeric
    for rnd in range(len(rounds)):
        losses, used, steady, wall, ran = [0.0] * k, [0.0] * k, [0.0] * k, [0.0] * k, [0] * k
        for j in [(rnd + i) % k for i in range(k)]:  # who runs first rotates: the first slice
            a, L = mine[j], agents[j]  # after the round's exchange runs on a cold cache
            yield Swap(move_in, (L, saved[j]), nbytes=nbytes, name="swap_in")
            ls = []
            held = real and gc.isenabled()
            if held:
                gc.disable()
            try:
                clock.start()
                metered = plan.metered and clock.live
                cap = slice_cap(plan.steps[a]) if metered else plan.steps[a]
                while (keep_stepping(clock.spent(), len(ls), plan.budget_s[a], plan.step_s[a], cap) if metered
                       else len(ls) < cap):
                    met = yield Compute(L.forward_backward, flops=L.fwd_flops + L.bwd_flops, name="fwd_bwd")
                    yield Compute(L.optimizer_step, name="optimizer")
                    clock.lap()
                    ls.append(float((met or {}).get("loss", float("nan"))))
                times, wall[j] = clock.stop()
                ran[j] = len(ls)
            finally:
                if held:
                    gc.enable()
            used[j] = sum(times)
            steady[j] = statistics.median(times) * len(times) if times else 0.0
            saved[j] = yield Swap(move_out if numeric else None, (L,) if numeric else (), nbytes=nbytes,
                                  name="swap_out")
            losses[j] = sum(ls) / len(ls) if ls else float("nan")
        if real and rnd == 0:  # imports and models are in place: keep them out of later scans
            gc.collect()
            gc.freeze()
        stats = torch.tensor([[x, u, r] for x, u, r in zip(losses, used, ran)], dtype=torch.float64)
        payload = yield Compute(pack_round, agents, stats, name="pack")
        got = yield AllGather(payload, name="round_gather")
        metrics = {"round": rnd}
        target, secs = plan.target, None  # units; seconds once the scheduler meters (numeric: figures travel)
        steps_run = list(plan.steps)  # shape mode: no figures travel, and its slices are not metered
        if numeric:
            every, rows = unpack_round(got, k)  # [n, numel], [n, 3], agent order
            steps_run = [int(x) for x in rows[:, 2].tolist()]
            secs = sched.settle(rows[:, 1].tolist(), [steps_run[a] * costs[a] for a in range(n)])
            target = plan.target if secs is None else secs
            loss = rows[:, 0]
            rewards = [1.0 / (1.0 + float(x)) if math.isfinite(float(x)) else float("nan") for x in loss]
            ok = torch.isfinite(every).all(1) & torch.isfinite(loss)
            if bool(ok.any()):
                fused = every[ok].mean(0)
                for L in agents:
                    yield Compute(L.set_flat_params, fused.to(getattr(L, "dtype", fused.dtype)),
                                  flops=2.0 * n * L.numel, name="fusion")
            for i, a in enumerate(mine):
                metrics[f"device_s.{a}"] = float(used[i])
                metrics[f"wall_s.{a}"] = float(wall[i])
                metrics[f"steady_s.{a}"] = float(steady[i])  # median step x steps: a neighbour's stall left out
            metrics.update({f"loss.{a}": float(loss[a]) for a in range(n)})
            if secs is not None:  # the deficit round robin's books after this round (seconds)
                metrics.update({f"credit.{a}": float(sched.credit[a]) for a in range(n)})
                metrics.update({f"dropped.{a}": float(sched.dropped[a]) for a in range(n)})
        else:
            rewards = [0.0] * n
        for a in range(n):
            metrics[f"share.{a}"] = float(plan.shares[a])
            metrics[f"units.{a}"] = float(steps_run[a] * costs[a])  # what ran (a metered slice decides)
            metrics[f"target.{a}"] = float(target[a])
        metrics["round_units"] = float(max(sum(steps_run[a] * costs[a] for a in hosted(d, n, m))
                                           for d in range(m)))  # the busiest device's units, as run
        metrics["target_in_seconds"] = float(secs is not None)
        if rnd + 1 < len(rounds):
            plan = sched.plan(rewards, k * rounds[rnd + 1], costs)
        yield StepDone(sum(rounds[:rnd + 1]) - 1, metrics)
    if real:
        gc.unfreeze()
    return None


def device_time_vs_shares(report: dict, skip_rounds: int = 1, burst: float | None = None, key: str = "device_s"):
    """From a report of a hosted run: per agent, the fraction of all device time it used
    and the fraction it was handed (``target.{a}``: seconds once metered, see
    ``target_in_seconds``), over the rounds after the first ``skip_rounds`` (the
    first round's steps include warm-up: lazy allocations, first calls); and the fraction
    of slices capped. ``burst``: a slice whose time per unit exceeds ``burst`` x its rank's
    median counts at that cap (on a shared host a neighbour's burst, not the schedule).
    ``key``: "device_s" (the slices' measured time) or "steady_s" (median step x steps)."""
    rows = report["metrics"]
    first = rows["0"] if "0" in rows else rows[0]
    n = sum(1 for key in first[0] if key.startswith("target."))
    used, given, capped, slices = [0.0] * n, [0.0] * n, 0, 0
    for per_rank in rows.values():
        mine = [(a, m[f"{key}.{a}"], m[f"units.{a}"]) for m in per_rank[skip_rounds:]
                for a in range(n) if f"{key}.{a}" in m]
        rates = sorted(t / u for _, t, u in mine if u > 0)
        top = burst * rates[len(rates) // 2] if burst and rates else math.inf
        for a, t, u in mine:
            slices += 1
            capped += t > top * u
            used[a] += min(t, top * u)
    for m in first[skip_rounds:]:
        for a in range(n):
            given[a] += m[f"target.{a}"]
    return [u / sum(used) for u in used], [g / sum(given) for g in given], capped / max(1, slices)
