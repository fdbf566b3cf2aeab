"""What the supervised tasks (digits, finance) share: seeded resumable batches, a batch
stream that mixes in hard examples from the shared replay pool
(:class:`oresearcher.cooperation.replay_sharing.SharedReplay`: part of every batch drawn by
priority, each sample's loss sent back as its priority), and the calibration error."""
from __future__ import annotations

import numpy as np
import torch


def expected_calibration_error(probs: torch.Tensor, labels: torch.Tensor, bins: int = 10) -> float:
    """ECE (Guo et al. 2017): mean |accuracy - confidence| over equal-width confidence
    bins, weighted by the fraction of samples in each bin. In [0, 1]."""
    conf, pred = probs.max(-1)
    correct = (pred == labels).float()
    edges = torch.linspace(0, 1, bins + 1)
    ece = torch.zeros(())
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = (conf > lo) & (conf <= hi)
        if m.any():
            ece += m.float().mean() * (correct[m].mean() - conf[m].mean()).abs()
    return float(ece)


class ShuffledBatches:
    """Batches of (X, y) in a seeded order, reshuffled every epoch (the tail dropped).

    Resumable: ``state_dict()`` holds the generator's state, the epoch's permutation and
    the position in it, so a resumed agent draws exactly the batches it would have.
    """

    def __init__(self, X, y, batch: int, seed: int):
        self.X, self.y, self.batch = X, y, batch
        self.g = torch.Generator().manual_seed(seed)
        self.perm, self.i = None, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.perm is None or self.i + self.batch > len(self.X):
            self.perm, self.i = torch.randperm(len(self.X), generator=self.g), 0
        idx = self.perm[self.i:self.i + self.batch]
        self.i += self.batch
        return self.X[idx], self.y[idx]

    def state_dict(self) -> dict:
        return {"generator": self.g.get_state(), "perm": self.perm, "i": self.i}

    def load_state_dict(self, state: dict) -> None:
        self.g.set_state(state["generator"])
        self.perm, self.i = state["perm"], int(state["i"])


class HardExamples:
    """A supervised (x, y) batch stream that swaps ``fraction`` of each batch for hard
    examples from the shared pool; :meth:`feedback` takes the batch's per-sample losses."""

    def __init__(self, inner, shared, fraction: float, seed: int):
        self.inner, self.shared, self.batch = inner, shared, inner.batch
        self.hard = int(round(fraction * self.batch))
        self.g = torch.Generator().manual_seed(seed)
        self.last = None  # (fresh rows, their x, y, replayed slots or None)

    def __iter__(self):
        return self

    def __next__(self):
        x, y = next(self.inner)
        slots, k = None, len(x)
        if self.hard and len(self.shared.pool) >= self.hard:
            slots, rows, _ = self.shared.pool.sample(self.hard, self.g)
            k = self.batch - self.hard
            x = torch.cat([x[:k], rows["x"].to(x.device, x.dtype)])
            y = torch.cat([y[:k], rows["y"].to(y.device)])
        self.last = (k, x[:k].cpu(), y[:k].cpu(), slots)
        return x, y

    def feedback(self, losses) -> None:
        """Per-sample losses of the last batch (fresh rows first): the priorities."""
        k, x, y, slots = self.last
        losses = np.asarray(losses, dtype=np.float64)
        self.shared.insert({"x": x, "y": y}, priorities=losses[:k])
        if slots is not None:
            self.shared.update(slots, losses[k:])

    def state_dict(self) -> dict:
        return {"inner": self.inner.state_dict(), "generator": self.g.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state["inner"])
        self.g.set_state(state["generator"])
