"""One prioritized replay pool shared by all agents (``cooperation.replay``), through ops.

Choice: **every agent keeps a replica; inserts and priority updates travel by one
AllGather of padded batches per sharing round**, rather than a holder rank serving the
others by Send/Recv. Why: sampling (every step, every agent) then stays local and costs
no message, while only new rows and new priorities travel, in one collective per round
that keeps every rank in lockstep (no request/response protocol, no rank that the others
queue behind or that takes down the pool). Every replica applies the same gathered
batches in the same order, so the replicas are identical after each round (tested).
The price is memory: n replicas (small for RL transitions).

A round (:func:`share`): each agent packs its pending priority updates and, up to its
*quota*, its newest pending rows into one float64 message of fixed size
``[n_rows, n_updates, quota x (row, priority), update_cap x (slot, priority)]`` (padded, so
shapes match as the collective requires); rows beyond the quota are dropped and counted,
so one agent cannot flood the pool. Every rank then applies all priority updates in rank
order (they name slots of the pool as it was when they were sampled), then all rows in
rank order. Between rounds an agent's own priority updates act on its replica at once
and are applied again, in order, at the round: conflicting updates resolve to the same
value everywhere (the highest rank's last one).

Ape-X (Horgan et al., "Distributed Prioritized Experience Replay", ICLR 2018): actor i of
N explores with epsilon_i = base^(1 + alpha i / (N - 1)), base 0.4, alpha 7;
:func:`apex_epsilons` orders agents by role (explorers first, then optimizers, then
validators), so explorers take the largest epsilons.

Supervised tasks use the pool as a shared hard-example pool
(:class:`oresearcher.tasks.supervised.HardExamples`): a fraction of every batch is drawn from it, every sample's loss is its priority (fresh
samples join at their loss, replayed ones get their new loss). As in online hard example
mining (Shrivastava et al., CVPR 2016) the bias toward hard examples is the point, so no
importance weights are applied there.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .. import ops as O
from .replay import PrioritizedReplay

ROLE_ORDER = ("explorer", "optimizer", "validator")
ID_STRIDE = 2**40  # row id = rank * ID_STRIDE + the agent's own counter (exact in float64)
PRIORITY = "_priority"  # a pending row's raw priority; travels in the message, not stored as a column


def apex_epsilons(roles: list, base: float = 0.4, alpha: float = 7.0) -> list[float]:
    """Per-agent epsilons, the largest to explorers (ties broken by rank)."""
    n = len(roles)
    order = sorted(range(n), key=lambda r: (ROLE_ORDER.index(roles[r]) if roles[r] in ROLE_ORDER else 3, r))
    eps = [0.0] * n
    for i, r in enumerate(order):
        eps[r] = base ** (1 + alpha * i / (n - 1)) if n > 1 else base
    return eps


class SharedReplay:
    """This agent's replica of the pool, its pending rows and updates (a State object).

    ``spec``: {column: (shape of one row, dtype)}; an ``id`` column is added.
    """

    def __init__(self, pool: PrioritizedReplay, spec: dict, rank: int, quota: int, update_cap: int):
        self.pool, self.rank, self.quota, self.update_cap = pool, int(rank), int(quota), int(update_cap)
        self.spec = {**{k: (tuple(s), d) for k, (s, d) in spec.items()}, "id": ((), torch.int64)}
        self.names = sorted(self.spec)
        self.widths = [math.prod(self.spec[k][0]) for k in self.names]
        self.pending: list[dict] = []
        self.updates: list[tuple[np.ndarray, np.ndarray]] = []
        self.counter, self.dropped, self.updates_dropped = 0, 0, 0

    @property
    def row_width(self) -> int:
        """float64 values per row in a message: the columns, then its raw priority (NaN: max)."""
        return sum(self.widths) + 1

    @property
    def message_numel(self) -> int:
        return 2 + self.quota * self.row_width + 2 * self.update_cap

    def insert(self, rows: dict, priorities=None) -> None:
        """Queue rows ({column: [k, ...]}) for the next round, with raw priorities (None: the
        pool's largest at insertion); each gets a unique id."""
        k = len(next(iter(rows.values())))
        ids = self.rank * ID_STRIDE + self.counter + torch.arange(k, dtype=torch.int64)
        self.counter += k
        pri = torch.full((k,), float("nan"), dtype=torch.float64) if priorities is None else \
            torch.as_tensor(priorities, dtype=torch.float64).reshape(k)
        self.pending.append({**rows, "id": ids, PRIORITY: pri})

    def update(self, slots, raw) -> None:
        """New raw priorities for slots this agent sampled: at once here, for all at the round."""
        slots, raw = np.asarray(slots, dtype=np.int64), np.asarray(raw, dtype=np.float64)
        self.pool.update_priorities(slots, raw)
        self.updates.append((slots, raw))

    def pack(self) -> torch.Tensor:
        """This round's message (float64, ``message_numel``); empties the pending queues."""
        msg = torch.zeros(self.message_numel, dtype=torch.float64)
        rows = _concat(self.pending, self.names + [PRIORITY])
        n_rows = len(rows[self.names[0]]) if rows else 0
        keep = min(n_rows, self.quota)
        self.dropped += n_rows - keep
        if keep:
            flat = torch.cat([rows[k][n_rows - keep:].reshape(keep, -1).to(torch.float64)
                              for k in self.names + [PRIORITY]], 1)
            msg[2:2 + keep * self.row_width] = flat.reshape(-1)
        slots = np.concatenate([s for s, _ in self.updates]) if self.updates else np.zeros(0, np.int64)
        raw = np.concatenate([r for _, r in self.updates]) if self.updates else np.zeros(0)
        n_upd = min(len(slots), self.update_cap)  # the newest win, as they would locally
        self.updates_dropped += len(slots) - n_upd
        off = 2 + self.quota * self.row_width
        msg[off:off + 2 * n_upd] = torch.from_numpy(np.stack([slots[len(slots) - n_upd:],
                                                              raw[len(raw) - n_upd:]], 1).reshape(-1).astype(np.float64))
        msg[0], msg[1] = keep, n_upd
        self.pending, self.updates = [], []
        return msg

    def apply(self, messages: list) -> None:
        """Apply every member's message, in rank order: all updates, then all rows."""
        off = 2 + self.quota * self.row_width
        for m in messages:
            n_upd = int(m[1])
            pairs = m[off:off + 2 * n_upd].reshape(n_upd, 2).cpu().numpy()
            self.pool.update_priorities(pairs[:, 0].astype(np.int64), pairs[:, 1])
        for m in messages:
            n = int(m[0])
            if n:
                flat = m[2:2 + n * self.row_width].reshape(n, self.row_width).cpu()
                self.pool.add(self._unpack_rows(flat), priorities=flat[:, -1].numpy())

    def _unpack_rows(self, flat: torch.Tensor) -> dict:
        out, c = {}, 0
        for k, w in zip(self.names, self.widths):
            shape, dtype = self.spec[k]
            out[k] = flat[:, c:c + w].reshape((len(flat),) + shape).to(dtype)
            c += w
        return out

    def state_dict(self) -> dict:
        return {"pool": self.pool.state_dict(), "counter": self.counter, "dropped": self.dropped,
                "updates_dropped": self.updates_dropped, "pending": [dict(p) for p in self.pending],
                "updates": [(torch.from_numpy(s), torch.from_numpy(r)) for s, r in self.updates]}

    def load_state_dict(self, state: dict) -> None:
        self.pool.load_state_dict(state["pool"])
        self.counter, self.dropped = int(state["counter"]), int(state["dropped"])
        self.updates_dropped = int(state["updates_dropped"])
        self.pending = [dict(p) for p in state["pending"]]
        self.updates = [(s.numpy(), r.numpy()) for s, r in state["updates"]]


def _concat(parts: list, names: list) -> dict:
    if not parts:
        return {}
    return {k: torch.cat([p[k] for p in parts]) for k in names}


def share(shared: SharedReplay | None, numel: int, group=None):
    """One sharing round (generator of ops); ``shared`` None in shape mode (sizes only)."""
    if shared is None:
        msg = torch.empty(numel, dtype=torch.float64, device="meta")
    else:
        msg = yield O.Compute(shared.pack, flops=float(numel), name="replay_pack")
    gathered = yield O.AllGather(msg, group=group, name="replay_share")
    if shared is not None:
        yield O.Compute(shared.apply, gathered, flops=float(len(gathered) * numel), name="replay_apply")
