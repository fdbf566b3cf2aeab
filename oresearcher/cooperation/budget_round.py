"""The overhead controller inside the cooperative program (``communication.budget``).

:mod:`oresearcher.cooperation.budget` decides; this module is the thin shell around it in a round:
it times this agent's round on the backend's clock (``ctx.clock``: simulated seconds in
the simulator, ``time.perf_counter`` on torch.distributed), all-gathers the four
timings once per round (``budget_gather``, 40 bytes per rank) so every rank holds the
same numbers, and every rank runs the same :func:`oresearcher.cooperation.budget.decide` on them.
So the simulator and the real backends run one decision procedure; what differs is only
what their clocks measured. Without a clock (the reference interpreter) a local step
costs its cost-model units and nothing is exposed.

A round under the controller: agent i shares its gradient at its local steps
s = k_i - 1, 2 k_i - 1, ... for the first m blocks, m being the blocks every member of
its sharing group completes this round (so the collectives pair up), with the codec of
the current rung (one codec object per rung spec and agent, registered, so its error
feedback is checkpointed).
"""
from __future__ import annotations

import logging

import torch

from . import budget as B
from ..ops import AllGather
from ..seeds import derive

log = logging.getLogger(__name__)


class RoundTimer:
    """One agent's seconds in the current round: local compute, blocked at shares, round end."""

    def __init__(self, clock):
        self.clock = clock
        self.start = self.local_s = self.share_s = self.sync_s = 0.0
        self.shares = 0
        self._t = 0.0

    def now(self) -> float:
        return float(self.clock()) if self.clock is not None else 0.0

    def begin_round(self) -> None:
        self.start, self.share_s, self.sync_s, self.shares = self.now(), 0.0, 0.0, 0

    def begin_share(self) -> None:
        self._t = self.now()

    def end_share(self) -> None:
        self.share_s += self.now() - self._t
        self.shares += 1

    def local_done(self) -> None:
        self._t = self.now()
        self.local_s = self._t - self.start

    def sync_done(self) -> None:
        self.sync_s = self.now() - self._t


class BudgetRun:
    """Per agent: the controller's registered state, its timer and its codecs."""

    def __init__(self, ctx, unit_costs):
        sc = ctx.scenario
        self.ctx, self.dtype = ctx, sc.workload.dtype
        self.rungs = B.ladder(sc.communication.codec.text, self.dtype, sc.communication.interval)
        self.state = ctx.register("budget", B.BudgetState(float(sc.communication.budget)))
        self.timer = RoundTimer(getattr(ctx, "clock", None))
        self.unit_costs = unit_costs  # () -> cost-model units per agent (a SAM step = 2)
        self._codecs, self.block, self.m = {}, 1, 0
        if not self.state.k:  # first round: balance by the cost model
            d = B.decide([], self.rungs, self.state.rung, self.state.budget, 0, self.state.last_tighten,
                         self.dtype, unit_costs=unit_costs())
            self.state.k = list(d.k)
            self._log(d.reason)

    def _log(self, reason: str) -> None:
        self.state.decisions = (self.state.decisions + [(len(self.state.decisions), self.state.rung, reason)])[-50:]
        if self.ctx.rank == 0:
            log.info("communication budget: %s", reason)

    @property
    def codec(self):
        spec = self.rungs[self.state.rung][1]
        if spec not in self._codecs:  # None for "none" (CodecSpec.make: the one "none" test)
            from ..codecs.spec import parse

            sc = self.ctx.scenario
            codec = parse(spec).make(seed=derive(sc.seed, self.ctx.rank), shared_seed=sc.seed)
            self._codecs[spec] = None if codec is None else self.ctx.register(f"budget_codec {spec}", codec)
        return self._codecs[spec]

    def plan(self, steps_now, members) -> None:
        """This round's sharing: every k-th local step, m times (equal for the group)."""
        k = self.state.k
        self.block = k[self.ctx.rank]
        self.m = B.shares_per_round([steps_now[i] for i in members], [k[i] for i in members])
        self.timer.begin_round()

    def share_at(self, s: int) -> bool:
        return (s + 1) % self.block == 0 and (s + 1) // self.block <= self.m

    def end_round(self, rnd: int, my_steps: int):
        """Gather the round's timings, decide the next round (generator of ops); its metrics."""
        ctx, t, st = self.ctx, self.timer, self.state
        compute = t.local_s - t.share_s if t.clock is not None else my_steps * self.unit_costs()[ctx.rank]
        dev = ctx.device if ctx.numeric else torch.device("cpu")  # real values, also in shape mode
        mine = torch.tensor([compute, float(my_steps), t.share_s, t.sync_s, float(t.shares)], dtype=torch.float64)
        rows = torch.stack([g.cpu() for g in (yield AllGather(mine.to(dev), name="budget_gather"))])
        st.observe(B.Observation([float(x) for x in rows[:, 0]], [int(x) for x in rows[:, 1]],
                                 [float(x) for x in rows[:, 2]], [float(x) for x in rows[:, 3]], int(rows[:, 4].min())))
        d = B.decide(st.history, self.rungs, st.rung, st.budget, rnd + 1, st.last_tighten, self.dtype)
        if d.rung > st.rung:
            st.last_tighten = rnd + 1
        st.rung, st.k = d.rung, list(d.k)
        self._log(d.reason)
        w, spec = self.rungs[d.rung]
        return {"budget_overhead": d.overhead, "budget_predicted": d.predicted, "budget_rung": float(d.rung),
                "budget_floor": B.end_floor(st.history[-1]),
                "budget_widen": float(w), "budget_k": float(d.k[ctx.rank]), "budget_codec": spec,
                "budget_reason": d.reason}
