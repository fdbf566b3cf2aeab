"""Faults in the simulator: stragglers, degraded links, lost ranks, and what checkpoints cost.

The scenario's ``faults:`` section (:mod:`oresearcher.scenario.faults`) becomes a
:class:`FaultPlan` the engine consults at three points, and nothing else in the engine
changes:

- a Compute op on rank r takes ``factor[r]`` x longer (a straggler: fixed, or drawn
  once per rank from a seeded distribution);
- a network flow that starts inside a link window moves ``bytes / bandwidth_factor``
  bytes at the fabric's bandwidth, i.e. runs at ``factor`` x bandwidth (a flow is priced
  at the bandwidth in force when it starts; latencies are unchanged);
- at a StepDone the rank may pause: to write a checkpoint (``training.checkpoint_every``,
  at the program's resume boundaries as the real backend writes them; ``bytes / storage
  bandwidth``), or for a failure it has passed (below).

A failure with ``restart`` at time t_f: every rank restarts from the last checkpoint
complete (every rank's file written) by t_f, written at t_c. What is lost is the work since
t_c (recomputed), the restart delay D and reading the checkpoint back R = bytes /
storage bandwidth (0 without a checkpoint: the run starts again). Redone work takes what it
took the first time, so the run's end moves by exactly ``P = (t_f - t_c) + D + R``; each
rank inserts P at its first StepDone at or after t_f (a "fault" span on its timeline),
which gives the same end time as stopping at t_f and replaying. The job goes on at one
time (the first rank's StepDone + P; a rank that gets to its StepDone later pauses only
until then), so this is exact where ranks end their steps together (DDP, FSDP) and
otherwise off by at most the ranks' spread at that moment (less than a step). ``continue``: the other
agents go on; the lost rank is still simulated (the programs' collectives must pair) but
its work after t_f counts as lost, ``(end - t_f) / world`` of the cluster's time; the
survivors' step time is taken as unchanged (a group one rank smaller; documented
approximation). ``mtbf_s`` adds job failures at exponential intervals (seeded), each a
restart.

The report's ``faults`` section gives each fault's time lost, the work recomputed and the
goodput: the fault-free, checkpoint-free run time over the time with faults (for
``continue``, times the fraction of agent-time not lost). Young/Daly's first-order optimum
checkpoint interval sqrt(2 C M) (Young 1974; Daly 2006, FGCS 22(3)) is given beside it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from oresearcher.comm.units import GB, Bps_to_GBps, GBps_to_Bps

from .draws import lognormal_params

# More random failures than this in one run: it is not getting anywhere (a year of simulated
# time at an mtbf of one hour is 8,760); the simulator says so instead of running on.
MAX_FAILURES = 20_000


# ---- pure math ------------------------------------------------------------------------

def straggler_factors(specs, world: int, seed: int) -> list[float]:
    """Each rank's compute time multiplier: the product over the straggler entries that
    name it (all ranks when ``ranks`` is empty). Draws come from a generator seeded by
    (seed, entry index), one per rank in rank order, so they do not depend on anything else."""
    out = [1.0] * world
    for i, s in enumerate(specs):
        ranks = list(s.ranks) or list(range(world))
        if s.factor is not None:
            draws = [float(s.factor)] * len(ranks)
        else:
            rng = np.random.default_rng([int(seed), 7919, i])
            if s.distribution == "lognormal":
                mu, sigma = lognormal_params(s.cv)
                draws = [float(x) for x in rng.lognormal(mu, sigma, size=len(ranks))]
            else:
                draws = [float(x) for x in rng.uniform(s.low, s.high, size=len(ranks))]
        for r, f in zip(ranks, draws):
            out[r] *= f
    return out


def bandwidth_factor(links, now: float) -> float:
    """Bandwidth left at time ``now``: the product of the windows [start, start + duration) it is in."""
    f = 1.0
    for w in links:
        if w.start_s <= now < w.start_s + w.duration_s:
            f *= w.bandwidth_factor
    return f


def checkpoint_due(step: int, prev: int, every: int, total: int) -> bool:
    """The real backend's rule (backends/checkpoint/per_rank.py Checkpointer.due): a checkpoint falls
    due every ``every`` steps and is written at the first resume boundary at or after it.
    The backend's save after the last step is left out: it comes after the run's end, and
    nothing is recomputed from it."""
    if every <= 0 or step + 1 >= total:
        return False
    return (step + 1) // every > (prev + 1) // every


def restart_loss(t_fail: float, t_back: float, delay_s: float, restore_s: float) -> dict:
    """Time a restart costs: the work since ``t_back`` (recomputed), the delay, the restore."""
    recomputed = max(0.0, t_fail - t_back)
    return {"recomputed_s": recomputed, "restart_s": delay_s, "restore_s": restore_s,
            "time_lost_s": recomputed + delay_s + restore_s}


def young_daly(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum time between checkpoints, sqrt(2 C M) (Daly 2006 adds
    higher-order terms that matter only when C is not small against M)."""
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def failure_times(mtbf_s: float, seed: int, horizon_s: float) -> list[float]:
    """Job failure times up to ``horizon_s``: exponential gaps of mean ``mtbf_s``, seeded."""
    rng = np.random.default_rng([int(seed), 104729])
    out, t = [], 0.0
    while True:
        t += float(rng.exponential(mtbf_s))
        if t > horizon_s or len(out) >= 100_000:
            return out
        out.append(t)


def replay(step_s: list[float], every: int, checkpoint_s: float, failures: list[float], delay_s: float,
           restore_s: float) -> tuple[float, list[dict]]:
    """End time of a synchronous run of steps ``step_s`` with checkpoints and restarts, by
    the rule the engine applies (module docstring): the pure form, for tests and sweeps.
    Returns (end time, one restart_loss per failure that happened)."""
    t, done, ckpts, back, pending, losses = 0.0, -1, [], 0.0, sorted(failures), []
    for i, s in enumerate(step_s):
        t += s
        while pending and pending[0] <= t:
            tf = pending.pop(0)
            usable = [c for c in ckpts if c <= tf]  # complete by the failure
            loss = restart_loss(tf, max(usable[-1], back) if usable else back, delay_s,
                                restore_s if usable else 0.0)
            t += loss["time_lost_s"]
            back = t
            losses.append(dict(loss, at_s=tf))
        if checkpoint_due(i, done, every, len(step_s)):
            t += checkpoint_s
            ckpts.append(t)
        done = i
    return t, losses


# ---- the plan the engine consults -----------------------------------------------------

@dataclass
class _Failure:
    at_s: float
    rank: int
    action: str
    scope: str = "gpu"
    loss: dict | None = None  # restart: fixed by the first rank to pass it
    resume_at: float = 0.0  # when the restarted job goes on: the first rank's time + the loss
    applied: set = field(default_factory=set)  # ranks that paused for it


class FaultPlan:
    """The engine's view of one scenario's faults (see the module docstring)."""

    def __init__(self, spec, world: int, steps: int, every: int, checkpoint_bytes: float,
                 storage_Bps: float, seed: int, gpus_per_node: int | None = None):
        self.spec, self.world, self.steps, self.every = spec, world, steps, every
        self.gpus_per_node = gpus_per_node or world
        self.checkpoint_bytes, self.storage_Bps = float(checkpoint_bytes), float(storage_Bps)
        self.checkpoint_s = self.checkpoint_bytes / self.storage_Bps
        self.factors = straggler_factors(spec.stragglers, world, seed)
        self.links = list(spec.links)
        # the programs' contexts, whose resume boundaries checkpoints follow (fault_plan sets
        # them); None: every StepDone is a boundary
        self.ctxs = None
        self.failures = sorted((_Failure(f.at_s, f.rank, f.action, f.scope) for f in spec.failures),
                               key=lambda f: f.at_s)
        # random job failures, drawn as simulated time reaches them (the same stream as failure_times)
        self._gaps = np.random.default_rng([int(seed), 104729]) if spec.mtbf_s else None
        self._who = np.random.default_rng([int(seed), 15485863])
        self._next = float(self._gaps.exponential(spec.mtbf_s)) if self._gaps is not None else math.inf
        self._prev = [-1] * world  # each rank's previous resume boundary
        self._written = {}  # checkpoint step -> [ranks written, latest completion time]
        self._back = 0.0  # when the latest restart's pause ended (work before it is not redone)
        self.checkpoints = 0  # checkpoints completed by every rank
        self._spans = None  # straggler and link-window spans, recorded early (kept spans are the first ones)

    def compute_factor(self, rank: int) -> float:
        return self.factors[rank]

    def flow_bytes(self, now: float, nbytes: list) -> list:
        """Flow sizes as the fabric sees them at ``now`` (scaled up inside a link window)."""
        f = bandwidth_factor(self.links, now) if self.links else 1.0
        return nbytes if f == 1.0 else [b / f for b in nbytes]

    def after_step(self, env, tl, rank: int, step: int):
        """SimPy generator, run by ``rank`` at each StepDone: failures it has passed, then
        a checkpoint if one is due; each pause is a "fault" span on its timeline."""
        if self._spans is None:
            self._mark(tl)
        while True:
            self._draw_until(env.now)
            f = next((f for f in self.failures if f.at_s <= env.now and f.action == "restart"
                      and rank not in f.applied), None)
            if f is None:
                break
            f.applied.add(rank)
            if f.loss is None:
                f.loss = self._restart_loss(f.at_s)
                f.resume_at = env.now + f.loss["time_lost_s"]
            if env.now >= f.resume_at:  # it was held up behind the ranks that paused already
                continue
            start = env.now
            yield env.timeout(f.resume_at - env.now)
            self._back = max(self._back, env.now)
            tl.record(rank, "fault", f"restart: rank {f.rank} lost at {f.at_s:.1f} s", start, env.now)
        boundary = self._boundary(rank, step)
        if boundary is not None and checkpoint_due(boundary, self._prev[rank], self.every, self.steps):
            start = env.now
            yield env.timeout(self.checkpoint_s)
            tl.record(rank, "fault", "checkpoint", start, env.now)
            w = self._written.setdefault(boundary, [0, 0.0])
            w[0], w[1] = w[0] + 1, max(w[1], env.now)
            if w[0] == self.world:
                self.checkpoints += 1
        if boundary is not None:
            self._prev[rank] = boundary

    def lost_ranks(self, f) -> list[int]:
        """The ranks a failure takes: its GPU's, or every rank of its node."""
        if f.scope != "node":
            return [f.rank]
        first = f.rank // self.gpus_per_node * self.gpus_per_node
        return list(range(first, min(first + self.gpus_per_node, self.world)))

    def _mark(self, tl) -> None:
        """Straggler and link-window spans, recorded at the first StepDone so a timeline that
        keeps only its first spans still has them; their ends are fixed by :meth:`finish`."""
        self._spans = []
        marks = [(r, f"straggler x{f:.2f}", 0.0, 0.0) for r, f in enumerate(self.factors) if f != 1.0]
        marks += [(r, f"link bandwidth x{w.bandwidth_factor:g}", w.start_s, w.start_s + w.duration_s)
                  for w in self.links for r in range(self.world)]
        for r, name, a, b in marks:
            kept = len(tl.spans)
            tl.record(r, "fault", name, a, b)
            if len(tl.spans) > kept:
                self._spans.append(tl.spans[-1])

    def _draw_until(self, now: float) -> None:
        added = False
        while self._next <= now:
            if len(self.failures) >= MAX_FAILURES:
                from oresearcher.errors import UserError

                raise UserError(f"faults.mtbf_s={self.spec.mtbf_s:g} s: {len(self.failures):,} failures by "
                                f"simulated time {self._next:,.0f} s and the run has not finished: it is not "
                                "getting ahead of its failures (raise mtbf_s, or checkpoint more often)")
            self.failures.append(_Failure(self._next, int(self._who.integers(self.world)), "restart"))
            self._next += float(self._gaps.exponential(self.spec.mtbf_s))
            added = True
        if added:
            self.failures.sort(key=lambda f: f.at_s)

    def _boundary(self, rank: int, step: int):
        """The resume boundary this StepDone ends (the program's mark), or None."""
        if self.ctxs is None:
            return step
        ctx = self.ctxs[rank]
        b, ctx.boundary = ctx.boundary, None
        return b

    def _restart_loss(self, t_fail: float) -> dict:
        done = [t for n, t in self._written.values() if n == self.world and t <= t_fail]
        t_ckpt = max(done) if done else None
        back = self._back if t_ckpt is None else max(t_ckpt, self._back)
        restore = self.checkpoint_s if t_ckpt is not None else 0.0
        return dict(restart_loss(t_fail, back, self.spec.restart_delay_s, restore), rollback_to_s=back)

    def finish(self, tl, end_s: float) -> list[dict]:
        """After the run: spans for stragglers, link windows and lost ranks; one dict per
        failure that happened (time lost, work recomputed)."""
        for span in self._spans or ():
            span.end = end_s if span.name.startswith("straggler") else min(span.end, end_s)
        out = []
        for f in self.failures:
            if f.action == "restart" and f.loss is not None:
                ends = tl.step_ends.get(0, []) if isinstance(tl.step_ends, dict) else tl.step_ends[0]
                redone = sum(1 for t in ends if f.loss["rollback_to_s"] < t <= f.at_s)
                out.append(dict(f.loss, at_s=f.at_s, rank=f.rank, scope=f.scope, action="restart",
                                steps_recomputed=redone))
            elif f.action == "continue" and f.at_s < end_s:
                lost = self.lost_ranks(f)
                for r in lost:
                    tl.record(r, "fault", f"rank {r} lost (the others continue)", f.at_s, end_s)
                agent_s = (end_s - f.at_s) * len(lost)
                out.append({"at_s": f.at_s, "rank": f.rank, "scope": f.scope, "ranks_lost": len(lost),
                            "action": "continue", "recomputed_s": 0.0, "agent_time_lost_s": agent_s,
                            "time_lost_s": agent_s / self.world})
        return out


# ---- scenario in, plan and report out ---------------------------------------------------

def checkpoint_bytes(scenario, learner, memory: dict | None) -> float:
    """Bytes one rank saves: its weights and optimizer state (the memory model's figures
    for LM presets; parameters x element size x (1 + optimizer slots) otherwise: AdamW
    keeps two slots, SGD with momentum one)."""
    if memory:
        return float(memory.get("sharded_params", memory["weights"]) + memory["optimizer_state"])
    slots = 2 if scenario.workload.optimizer == "adamw" else 1
    elem = 2 if scenario.workload.dtype in ("bf16", "fp16") else 4
    return float(learner.numel * elem * (1 + slots))


def fault_plan(scenario, device, ctxs, learner, memory) -> FaultPlan | None:
    """The plan for ``scenario``, or None when it has no faults section in force.
    ``memory``: the memory model's report (:func:`oresearcher.sim.simulate.memory_report`; None for small tasks)."""
    spec = scenario.faults
    if not (spec.active or spec.price_checkpoints):
        return None
    seed = scenario.seed if spec.seed is None else spec.seed
    bw = GBps_to_Bps(float(getattr(device, "storage_bandwidth_GBps", 2.0)))
    plan = FaultPlan(spec, scenario.world_size, scenario.training.steps, scenario.training.checkpoint_every,
                     checkpoint_bytes(scenario, learner, memory), bw, seed, scenario.cluster.gpus_per_node)
    plan.ctxs = ctxs
    return plan


def variant(scenario, keep: tuple = ()):
    """``scenario`` with only the fault kinds in ``keep`` ("stragglers", "links") and no
    checkpoint pricing: the baselines time lost is measured against."""
    from oresearcher.scenario import Scenario

    data = scenario.resolved()
    data["faults"] = {k: data["faults"][k] for k in keep}
    data["training"]["checkpoint_every"] = 0  # a baseline saves nothing
    v = Scenario.model_validate(data)
    v._source = getattr(scenario, "_source", None)
    return v


def fault_report(scenario, plan: FaultPlan, tl, baseline_total) -> dict:
    """The report's ``faults`` section (see the module docstring for the definitions):
    the run is compared with baseline runs of the same scenario (no faults; stragglers
    only; link windows only). ``baseline_total(keep)``: the total time of
    :func:`variant` ``(scenario, keep)``, which the caller simulates."""
    end = max((tl.step_ends[r][-1] for r in range(tl.world_size) if tl.step_ends[r]), default=0.0)
    total = end - (tl.t0 or 0.0)
    failures = plan.finish(tl, end)
    base = baseline_total(())
    spec = scenario.faults
    out = {
        "time_fault_free_s": base, "time_total_s": total,
        "checkpoints": {"count": plan.checkpoints, "bytes_per_rank": plan.checkpoint_bytes,
                        "storage_bandwidth_GBps": Bps_to_GBps(plan.storage_Bps), "seconds_each": plan.checkpoint_s,
                        "time_lost_s": plan.checkpoints * plan.checkpoint_s},
        "stragglers": {"factors": plan.factors, "time_lost_s": baseline_total(("stragglers",)) - base if spec.stragglers else 0.0},
        "links": {"windows": [w.model_dump() for w in plan.links],
                  "time_lost_s": baseline_total(("links",)) - base if spec.links else 0.0},
        "failures": failures,
        "work_recomputed_s": sum(f["recomputed_s"] for f in failures),
        "steps_recomputed": sum(f.get("steps_recomputed", 0) for f in failures),
    }
    agent_lost = sum(f.get("agent_time_lost_s", 0.0) for f in failures)
    out["goodput"] = (base / total if total > 0 else 0.0) * (1 - agent_lost / (plan.world * total) if total > 0 else 1)
    if spec.mtbf_s:
        out["mtbf_s"] = spec.mtbf_s
        out["young_daly_interval_s"] = young_daly(plan.checkpoint_s, spec.mtbf_s)
    return out


def faults_table(f: dict):
    """The report's faults section as a console table (sim CLI)."""
    from rich.table import Table

    t = Table(title="faults", header_style="bold")
    for col in ("fault", "time lost", "recomputed"):
        t.add_column(col, justify="left" if col == "fault" else "right")
    c = f["checkpoints"]
    t.add_row(f"{c['count']} checkpoint{'' if c['count'] == 1 else 's'} ({c['bytes_per_rank'] / GB:,.1f} GB at {c['storage_bandwidth_GBps']:g} "
              f"GB/s: {c['seconds_each']:,.2f} s each)", f"{c['time_lost_s']:,.2f} s", "")
    slow = [x for x in f["stragglers"]["factors"] if x != 1.0]
    if slow:
        t.add_row(f"stragglers ({len(slow)} rank{'s' if len(slow) > 1 else ''}, up to x{max(slow):.2f})", f"{f['stragglers']['time_lost_s']:,.2f} s", "")
    for w in f["links"]["windows"]:
        t.add_row(f"link bandwidth x{w['bandwidth_factor']:g} from {w['start_s']:g} s for {w['duration_s']:g} s", "", "")
    if f["links"]["windows"]:
        t.add_row("  link windows together", f"{f['links']['time_lost_s']:,.2f} s", "")
    for x in f["failures"]:
        who = f"node of rank {x['rank']}" if x.get("scope") == "node" else f"rank {x['rank']}"
        what = (f"{who} lost at {x['at_s']:,.1f} s: restart (delay {x['restart_s']:g} s, restore "
                f"{x['restore_s']:,.2f} s)" if x["action"] == "restart" else
                f"{who} lost at {x['at_s']:,.1f} s: the others continue")
        t.add_row(what, f"{x['time_lost_s']:,.2f} s",
                  f"{x['recomputed_s']:,.2f} s ({x.get('steps_recomputed', 0)} steps)" if x["action"] == "restart" else "")
    t.add_row("total (fault-free -> with faults)", f"{f['time_fault_free_s']:,.1f} s -> {f['time_total_s']:,.1f} s",
              f"{f['work_recomputed_s']:,.2f} s")
    t.caption = f"goodput {f['goodput']:.1%}" + (
        f"; Young/Daly interval sqrt(2 C MTBF) = {f['young_daly_interval_s']:,.0f} s" if "young_daly_interval_s" in f else "")
    return t
